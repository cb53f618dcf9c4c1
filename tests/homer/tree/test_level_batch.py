"""The level-batched merge tree keeps what the depth-first ``MergeTree`` keeps, with the same K/V and logits."""

import pytest
import torch
from transformers import DynamicCache

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.scorers import EveryLayer, LastTokenScorer, ReconstructionScorer
from homer_integrations.homer.tree.compressor import HomerCompressor
from homer_integrations.homer.tree.level_batch import LevelBatchedTree, PaddedLevel
from tests.conftest import assert_tree_invariants, tiny_model, uncalibrated

MCL, PREFIX, SUFFIX = 128, 5, 4
ATOL = 1e-4  # fp32: batched (masked) and single (causal-flag) kernels differ only in rounding


def ids(model, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def both(model, doc_len: int, suffix_len: int = SUFFIX, scoring: Scoring | None = None, bias=None, words=None, **kw):
    """(batched, depth-first) compressions of one random prompt, and the batched tree."""
    settings = CompressorSettings(
        max_chunk_len=MCL, warmup_layers=3, final_cache_len=kw.pop("final", MCL), scoring=scoring or uncalibrated(),
        want_logits=True, **kw,
    )  # fmt: skip
    prompt = ids(model, PREFIX, 1), ids(model, doc_len, 2), ids(model, suffix_len, 3)
    word_ids = None if words is None else torch.arange(doc_len) // words
    reference = HomerCompressor(DecoderStack(model), settings, bias).tree.compress(*prompt, word_ids=word_ids)
    tree = LevelBatchedTree(HomerCompressor(DecoderStack(model), settings, bias).nodes)
    return tree.compress(*prompt, word_ids=word_ids), reference, tree


def assert_same(batched, reference) -> None:
    assert torch.equal(batched.origin, reference.origin), "the same tokens survive"
    assert torch.equal(batched.position_ids, reference.position_ids)
    for mine, theirs in zip(batched.keys + batched.values, reference.keys + reference.values, strict=True):
        torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)
    torch.testing.assert_close(batched.next_token_logits, reference.next_token_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize(("doc_len", "height"), [(201, 1), (403, 2), (805, 3)])
def test_batched_tree_equals_the_depth_first_tree(kind, doc_len, height):
    model = tiny_model(kind, vocab_size=256)
    batched, reference, tree = both(model, doc_len)
    assert tree.unbatchable is None
    assert batched.plan.height == height and doc_len % batched.plan.num_leaves, "leaves of unequal lengths"
    assert_same(batched, reference)
    assert_tree_invariants(batched, model, PREFIX, SUFFIX, MCL)


@pytest.mark.parametrize("doc_len", [201, 805])
def test_a_question_suffix_scored_by_every_row_keeps_the_same_tokens(doc_len):
    model = tiny_model("llama", vocab_size=256)
    batched, reference, _ = both(model, doc_len, suffix_len=12, scoring=Scoring.for_questions(), words=3, final=96)
    assert batched.keys[0].shape[2] == 96
    assert_same(batched, reference)


def test_calibrated_every_layer_scores_with_word_units_and_memory_keep_the_same_tokens():
    model = tiny_model("qwen2", vocab_size=256)
    scoring = Scoring(EveryLayer(LastTokenScorer()), Scoring.default().units)
    bias = torch.randn(model.config.num_hidden_layers, MCL, generator=torch.Generator().manual_seed(4))
    batched, reference, _ = both(model, 403, scoring=scoring, bias=bias, words=2, final=80)
    assert_same(batched, reference)


def test_eager_attention_batches_too():
    model = tiny_model("llama", vocab_size=256)
    model.set_attn_implementation("eager")
    batched, reference, tree = both(model, 403)
    assert tree.unbatchable is None
    assert_same(batched, reference)


def test_one_attention_call_per_layer_instead_of_one_per_leaf_and_layer(monkeypatch):
    model = tiny_model("llama", vocab_size=256)
    calls = []
    attention = DecoderStack.attention

    def counted(self, *args, **kwargs):
        calls.append(args[1].shape[0])  # the batch size
        return attention(self, *args, **kwargs)

    monkeypatch.setattr(DecoderStack, "attention", counted)
    batched, reference, _ = both(model, 805)
    leaf_layers = len(batched.schedule.layers_at(0))
    assert [len(level) for level in batched.schedule.levels[1:]] == [1, 1, 1]
    depth_first = [1] * (8 * leaf_layers + 4 + 2 + 1)  # one leaf or node at a time
    assert calls == depth_first + [8] * leaf_layers + [4, 2, 1]  # the reference ran first
    assert batched.peak_kv_bytes > reference.peak_kv_bytes, "every leaf is alive at once"


def test_a_single_chunk_is_one_node_either_way():
    batched, reference, _ = both(tiny_model("llama", vocab_size=256), 60)
    assert batched.plan.height == 0
    assert_same(batched, reference)


def unbatchable(model) -> str | None:
    settings = CompressorSettings(max_chunk_len=MCL, warmup_layers=3, final_cache_len=MCL, scoring=uncalibrated())
    return LevelBatchedTree(HomerCompressor(DecoderStack(model), settings, None).nodes).unbatchable


def test_sliding_windows_and_flash_attention_are_not_batched(monkeypatch):
    assert "sliding window" in unbatchable(tiny_model("mistral", vocab_size=256, sliding_window=64))
    assert unbatchable(tiny_model("llama", vocab_size=256)) is None
    monkeypatch.setattr(DecoderStack, "backend", property(lambda self: "flash_attention_2"))
    assert "flash" in unbatchable(tiny_model("llama", vocab_size=256))


def test_a_probing_scorer_falls_back_and_keeps_the_depth_first_tokens():
    model = tiny_model("llama", vocab_size=256)
    scoring = Scoring(ReconstructionScorer((1, 2, 3), merged=LastTokenScorer(calibrated=False)))
    batched, reference, tree = both(model, 403, scoring=scoring)
    assert "probes" in tree.unbatchable
    assert torch.equal(batched.origin, reference.origin)


def test_the_windowed_fallback_keeps_the_depth_first_tokens():
    batched, reference, tree = both(tiny_model("mistral", vocab_size=256, sliding_window=64), 403)
    assert tree.unbatchable is not None
    assert_same(batched, reference)


def test_padding_sits_between_document_and_suffix_and_is_masked():
    def chunk(doc: int, first: float) -> Chunk:
        n = 2 + doc + 1
        return Chunk(
            hidden=torch.arange(first, first + n).view(1, n, 1), position_ids=torch.arange(10, 10 + n),
            reducible=torch.ones(n, dtype=torch.bool), origin=torch.arange(n), memory=torch.zeros(n),
            prefix_len=2, suffix_len=1,
        )  # fmt: skip

    short, long = chunk(2, 100.0), chunk(4, 200.0)
    batch = PaddedLevel.of([short, long])
    assert batch.hidden[:, :, 0].tolist() == [[100, 101, 102, 103, 0, 0, 104], [200, 201, 202, 203, 204, 205, 206]]
    assert batch.positions.tolist() == [[10, 11, 12, 13, 0, 0, 14], [10, 11, 12, 13, 14, 15, 16]]
    hidden = batch.key_mask[:, 0, 0] < 0
    assert hidden.tolist() == [[False] * 4 + [True] * 2 + [False], [False] * 7]
    assert torch.equal(batch.rows_of(batch.hidden, 0, dim=1), short.hidden)
    assert torch.equal(batch.rows_of(batch.hidden, 1, dim=1), long.hidden)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_key_mask_without_a_cache_keeps_attention_causal(attn):
    model = tiny_model("llama", vocab_size=256)
    model.set_attn_implementation(attn)
    stack = DecoderStack(model)
    hidden = stack.embed(ids(model, 20, 5))
    rope = stack.rotary(hidden, torch.arange(20))
    plain, _ = stack.attention(0, hidden, rope, DynamicCache())
    no_mask = torch.zeros(1, 1, 1, 20)
    masked, _ = stack.attention(0, hidden, rope, DynamicCache(), key_mask=no_mask)
    torch.testing.assert_close(masked, plain, atol=1e-6, rtol=0)
