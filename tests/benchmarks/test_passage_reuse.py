"""The passage-reuse probe: stored blocks' K/V turned to new positions, the deviating rows recomputed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import passage_reuse
from passage_reuse import BlockStore, blended_read

from tests.conftest import tiny_model
from tests.homer.leaves.tier_helpers import ATOL, compressor, ids


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passage_reuse, "BLOCK", 50)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_every_row_recomputed_reads_as_the_plain_prefill_of_the_kept_tokens(kind: str, small_blocks: None) -> None:
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 300, 2), ids(model, 4, 3)
    kept = torch.cat([torch.arange(20, 70), torch.arange(140, 160), torch.arange(251, 290)])
    nodes = compressor(model).nodes
    chunk = blended_read(nodes, BlockStore(), prefix, doc, kept, suffix, ratio=1.0)
    with torch.no_grad():
        out = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True)
    torch.testing.assert_close(nodes.stack.logits(chunk.hidden).flatten(), out.logits[0, -1], atol=ATOL, rtol=0)
    for layer, plain in enumerate(out.past_key_values.layers):
        torch.testing.assert_close(chunk.cache.layers[layer].keys, plain.keys, atol=1e-4, rtol=0)


def test_rows_not_recomputed_are_the_stored_blocks_turned(small_blocks: None) -> None:
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 300, 2), ids(model, 4, 3)
    kept = torch.cat([torch.arange(60, 90), torch.arange(200, 240)])
    nodes = compressor(model).nodes
    store = BlockStore()
    chunk = blended_read(nodes, store, prefix, doc, kept, suffix, ratio=0.0)
    assert sorted(b for _, b in store.blocks) == [1, 4], "the blocks of 60-89 and 200-239, each prefilled once"
    with torch.no_grad():  # block 4 (tokens 200-249) read alone after the prefix
        block = model(torch.cat([prefix, doc[200:250]])[None], use_cache=True).past_key_values
        plain = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True).past_key_values
    rows = slice(5 + 30, 5 + 70)  # kept 200-239 in the read, 0-39 of the block
    torch.testing.assert_close(chunk.cache.layers[3].values[:, :, rows], block.layers[3].values[:, :, 5:45])
    assert not torch.allclose(chunk.cache.layers[3].values[:, :, rows], plain.layers[3].values[:, :, rows], atol=1e-3)
    torch.testing.assert_close(chunk.cache.layers[0].keys, plain.layers[0].keys, atol=1e-5, rtol=0)  # layer 0 fresh


def test_the_engine_reads_the_default_passages_through_it(tokenizer, calibration, novel, small_blocks: None) -> None:
    """Every row recomputed, the engine's answer root over a book past the window is the re-read's."""
    from passage_reuse import ReusedPassages

    from homer_integrations.homer.reading.budget import ReadBudget
    from homer_integrations.homer.reading.passages import PassageSelection
    from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe
    from tests.conftest import mode_engine

    book, question = novel[20_000:32_000], "Who walked to Meryton with the sisters?"
    replay = PassageReplay(PassageSelection(tokens=24, overlap=8), ReadBudget(seconds=0, least=None))
    roots = []
    for read in (replay, ReusedPassages(replay.selection, replay.budget, ratio=1.0)):
        engine = mode_engine(tokenizer, calibration)
        engine.tiers.recipe = Recipe(replay=AutoReplay(read), calibration_segments=2)
        roots.append(engine.compress(book, question=question, mode="query_aware"))
    assert torch.equal(roots[0].origin, roots[1].origin), "the same passages"
    torch.testing.assert_close(roots[1].next_token_logits, roots[0].next_token_logits, atol=1e-3, rtol=0)
