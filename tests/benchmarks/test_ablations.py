"""benchmarks/ablations.py: the cache transform under trial (``compact_positions``) and ``recipe_of``, the old
research switches' names mapped to ``homer.reading.strategies`` units."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.builder import compressed_document
from homer_integrations.homer.kv.compressed import CompressedDocument
from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.strategies import (
    FlatReplay,
    FlatRoot,
    Recipe,
    RecomputeRoot,
    TreeReplay,
    TreeRoot,
)
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests import conftest
from tests.conftest import uncalibrated

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from ablations import ablation, compact_positions, recipe_of, split_switches, with_compact_positions


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def compressed(stack: DecoderStack, doc_len: int) -> CompressedDocument:
    settings = CompressorSettings(max_chunk_len=128, warmup_layers=2, final_cache_len=128, scoring=uncalibrated())
    result = HomerCompressor(stack, settings, None).tree.compress(ids(5, 0), ids(doc_len, 3), ids(4, 2))
    return compressed_document("k", result, doc_len + 9, None)


def test_compacted_keys_sit_at_distinct_positions_and_rotate_back_exactly() -> None:
    stack = DecoderStack(conftest.tiny_model("qwen2", vocab_size=256))
    doc = compressed(stack, 700)
    assert doc.position_ids.unique().numel() < doc.num_tokens  # leaves share positions before
    compact = compact_positions(stack, doc)
    assert compact.position_ids.tolist() == list(range(doc.num_tokens))
    assert compact.last_position == doc.num_tokens - 1
    back = stack.rotary(doc.keys[0], doc.position_ids - compact.position_ids)["default"]
    for before, moved in zip(doc.keys, compact.keys, strict=True):
        assert not torch.allclose(before, moved)
        torch.testing.assert_close(stack.family.rotate(moved, back), before, atol=1e-5, rtol=1e-5)
    assert all(a is b for a, b in zip(doc.values, compact.values, strict=True))


def test_a_document_in_one_leaf_is_left_as_it_was() -> None:
    stack = DecoderStack(conftest.tiny_model("qwen2", vocab_size=256))
    doc = compressed(stack, 60)
    compact = compact_positions(stack, doc)
    assert doc.position_ids.tolist() == compact.position_ids.tolist()
    for before, after in zip(doc.keys, compact.keys, strict=True):
        torch.testing.assert_close(after, before)


def test_an_engine_answers_from_compacted_caches(tokenizer, text: str, tmp_path) -> None:
    model = conftest.tiny_model("qwen2", vocab_size=len(tokenizer))
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    recipe = Recipe(shared_root=FlatRoot(), calibration_segments=2)
    engine = HomerModel(model, tokenizer, config, calibration_dir=tmp_path, progress=False, recipe=recipe)
    engine = with_compact_positions(engine)
    doc = engine.compress(text)
    assert doc.position_ids.tolist() == list(range(doc.num_tokens))
    stream = engine.run(text, "Who is Mr. Bingley?", max_new_tokens=3)
    stream.text()
    assert stream.info.output_tokens >= 1 and stream.info.cache_tokens == doc.num_tokens


def test_the_old_switches_name_the_units_that_replaced_them() -> None:
    assert recipe_of() == Recipe()
    assert recipe_of(shared_root="tree", replay="flat") == Recipe(shared_root=TreeRoot(), replay=FlatReplay())
    assert recipe_of(shared_root="recompute", replay="tree").shared_root == RecomputeRoot()
    assert recipe_of(replay="tree").replay == TreeReplay()
    switches = {"reask_question": False, "calibration_segments": 4}
    assert recipe_of(**switches) == Recipe(**switches)
    last_token = recipe_of(shared_scorer="last_token")
    assert last_token.scoring == Scoring.default() and last_token.question_scoring == Scoring.for_questions()
    paper = recipe_of(shared_scorer="last_token", pool_unit="token", score_pooling=1, score_memory=False)
    assert paper.scoring == Scoring(), "the paper's recipe: no units"
    # under the reconstruction scorer (the default) the last-token units changed nothing but the key
    assert recipe_of(pool_unit="token", score_pooling=1, score_memory=False) == Recipe()
    given = ablation("random_pruning")
    assert recipe_of(given, shared_scorer="last_token", replay="flat") == Recipe(scoring=given, replay=FlatReplay())
    assert split_switches({"max_chunk_len": 2048, "reask_question": False}) == (
        {"max_chunk_len": 2048},
        {"reask_question": False},
    )
