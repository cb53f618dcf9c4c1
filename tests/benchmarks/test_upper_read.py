"""The upper-read ablation: kept tokens read from the leaf tier, only the layers above the leaves run."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from upper_read import UpperRead, positions_in_leaves, upper_read

from homer_integrations.homer.leaves.tier_file import whole_tensors
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe
from tests.conftest import mode_engine, tiny_model
from tests.homer.leaves.tier_helpers import ATOL, compressor, ids

QUESTION = "Who walked to Meryton with the sisters?"


def test_every_token_of_one_leaf_reads_as_the_plain_forward():
    model = tiny_model("qwen2", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 60, 2), ids(model, 4, 3)
    comp = compressor(model)
    tier = comp.leaves.build(prefix, doc)
    assert tier.plan.num_leaves == 1
    read = upper_read(comp.nodes, tier, torch.arange(60), suffix, tier.plan.with_suffix(4), 0.0)
    with torch.no_grad():
        out = model(torch.cat([prefix, doc, suffix])[None], use_cache=True)
    torch.testing.assert_close(read.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    assert torch.equal(read.position_ids, torch.arange(69))


def test_kept_tokens_of_several_leaves_sit_at_consecutive_positions():
    model = tiny_model("mistral", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 400, 2), ids(model, 4, 3)
    comp = compressor(model)
    tier = comp.leaves.build(prefix, doc)
    assert tier.plan.num_leaves > 2
    kept = torch.cat([torch.arange(10, 40), torch.arange(200, 230), torch.arange(370, 395)])
    old = positions_in_leaves(tier.plan, kept)
    assert int(old.max()) < 5 + tier.plan.piece_len, "in its leaf a token sits after the prefix, within the piece"
    read = upper_read(comp.nodes, tier, kept, suffix, tier.plan.with_suffix(4), 0.0)
    assert torch.equal(read.origin[5:-4], kept) and bool((read.origin[:5] == -1).all())
    assert torch.equal(read.position_ids, torch.arange(5 + kept.numel() + 4))
    assert {k.shape[2] for k in read.keys} == {5 + kept.numel() + 4}, "every layer holds every row"
    stored = whole_tensors(tier)[0]
    torch.testing.assert_close(read.values[1][:, :, 5:-4], stored["v.1"][None][:, :, kept]), "a leaf layer: the tier's"
    with torch.no_grad():  # layer 0's keys depend on the token and its position only
        plain = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True).past_key_values
    torch.testing.assert_close(read.keys[0], plain.layers[0].keys, atol=1e-5, rtol=0)
    assert not torch.allclose(read.keys[0][:, :, 5:-4], stored["k.0"][None][:, :, kept], atol=1e-3), "keys were turned"


def test_the_engine_reads_the_same_passages_from_its_leaf_tier(tokenizer, calibration, novel) -> None:
    book = novel[20_000:32_000]
    replay = PassageReplay(PassageSelection(tokens=24, overlap=8), ReadBudget(seconds=0, least=None))
    plain = mode_engine(tokenizer, calibration)
    plain.tiers.recipe = Recipe(replay=AutoReplay(replay), calibration_segments=2)
    upper = mode_engine(tokenizer, calibration)
    upper.tiers.recipe = Recipe(replay=AutoReplay(UpperRead(replay.selection, replay.budget)), calibration_segments=2)
    reference = plain.compress(book, question=QUESTION, mode="query_aware")
    read = upper.compress(book, question=QUESTION, mode="query_aware")
    assert torch.equal(reference.origin, read.origin), "the same tokens in the same places"
    assert not torch.allclose(reference.keys[-1], read.keys[-1], atol=1e-3), "read otherwise than by a prefill"
    assert upper.answer(book, QUESTION, mode="query_aware", max_new_tokens=3) is not None
