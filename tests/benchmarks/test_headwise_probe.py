"""The head-wise probe: hidden cache slots are as good as removed ones; the chunks base reads pieces alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from tests.conftest import tiny_model

sys.path.insert(0, str(Path(__file__).parents[2] / "research"))  # it puts benchmarks/ on the path itself
from headwise_probe import CommonWords, close_statements, hidden_slots, share, word_counts


@pytest.mark.parametrize("rows", [1, 5])
def test_hidden_slots_answer_as_if_they_were_removed(rows: int) -> None:
    model = tiny_model("qwen2", vocab_size=256)
    context = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    gone = torch.zeros(30, dtype=torch.bool)
    gone[[3, 7, 8, 20]] = True
    follow = torch.tensor([[5, 6, 7, 8, 9][:rows]])
    positions = torch.arange(30, 30 + rows)[None]

    def logits(cache_keys, cache_values, hidden=None) -> torch.Tensor:
        with torch.no_grad(), hidden_slots(hidden):
            kept = cache_from_tensors(cache_keys, cache_values)
            return model(input_ids=follow, position_ids=positions, cache=kept, use_cache=True).logits

    removed = logits([k[:, :, ~gone] for k in keys], [v[:, :, ~gone] for v in values])
    hidden = [gone.expand(k.shape[1], -1) for k in keys]  # [Hkv, 30] per layer, the same slots everywhere
    masked = logits(keys, values, hidden)
    torch.testing.assert_close(masked, removed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(keys, values), removed, atol=1e-3)  # the hidden slots did matter
    # one head of one layer hides a slot: only that changes the answer
    one = [torch.zeros(k.shape[1], 30, dtype=torch.bool) for k in keys]
    one[2][1, 0] = True
    assert not torch.allclose(logits(keys, values, one), logits(keys, values), atol=1e-6)


def test_chunks_run_alone_at_their_document_positions(tokenizer, novel, tmp_path) -> None:
    from headwise_probe import encode_chunks

    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe

    config = HomerConfig(max_chunk_len=128, warmup_layers=3, final_cache_len=64)
    recipe = Recipe(calibration_segments=2)
    engine = HomerModel(tiny_model("llama"), tokenizer, config, calibration_dir=tmp_path, progress=False, recipe=recipe)
    prefix, document, suffix = engine.tiers.prompting.encode_span("Context:\n", novel[:1200], "\nEnd.")
    compressor = engine.tiers.builder().compressor(True, query_aware=False)
    P, N, S = prefix.numel(), document.numel(), suffix.numel()
    whole, _ = encode_chunks(compressor, prefix, document, suffix, N)
    halves, scores = encode_chunks(compressor, prefix, document, suffix, N // 2 + 1)
    assert scores.shape == (6, 2, P + N + S) and torch.isfinite(scores[:, :, P : P + N]).all()
    assert torch.equal(halves.position_ids, torch.arange(P + N + S)) and halves.origin.numel() == P + N + S
    with torch.no_grad():
        cache = engine.model(torch.cat([prefix, document, suffix])[None], use_cache=True).cache
    first = P + N // 2 + 1  # causal: the first piece sees exactly what a plain prefill shows it
    for layer in (0, 5):
        torch.testing.assert_close(whole.keys[layer], cache.layers[layer].keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(halves.keys[layer][:, :, :first], cache.layers[layer].keys[:, :, :first])
    later = halves.values[5][:, :, first:]  # layer 0's values are the embeddings' alone, the same either way
    assert not torch.allclose(later, cache.layers[5].values[:, :, first:], atol=1e-3), "the second piece read alone"


def test_share_counts_the_tokens_among_the_candidates() -> None:
    candidates = torch.tensor([-1, 3, 4, 9, -2])  # prefix and suffix slots are negative
    assert share([3, 4, 5, 6], candidates) == 0.5
    assert share([], candidates) == 0.0, "a value not found in the text: nothing to count"


def test_common_words_rank_below_the_words_they_frame() -> None:
    # words: "magic" (tokens 5, 6) twice, "is" (7) twice, the keys 8 and 9 once each
    document = torch.tensor([5, 6, 8, 7, 5, 6, 9, 7])
    words = torch.tensor([0, 0, 1, 2, 3, 3, 4, 5])
    counts = word_counts(document, words)
    assert counts.tolist() == [2, 2, 1, 2, 2, 2, 1, 2], "a word is its token ids: 'magic' counts as one word, twice"
    penalty = counts.log() - counts.log().mean()
    chunk = Chunk(
        hidden=torch.zeros(1, 6, 0),
        position_ids=torch.arange(6),
        reducible=torch.tensor([False, True, True, True, True, False]),
        origin=torch.tensor([-1, 1, 2, 3, 6, -1]),  # a prefix slot, four document tokens, a suffix slot
        memory=torch.zeros(6),
        prefix_len=1,
        suffix_len=1,
    )
    lowered = CommonWords(penalty, weight=2.0)(torch.ones(6), chunk, None)
    assert lowered[0] == lowered[5] == 1.0, "prefix and suffix keep their scores"
    assert lowered[2] > lowered[1] and lowered[4] > lowered[3], "the keys outrank the shared words"


def test_close_statements_takes_whole_the_short_statements_of_the_best_tokens() -> None:
    statements = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2])  # sizes 3, 4, 9
    kept = torch.tensor([1, 4, 8, 9, 10])
    memory = torch.tensor([0.1, 5.0, 4.0, -1.0, float("-inf")])  # 4 and 8 are the best two
    closed = close_statements(kept, memory, statements, top=0.5, longest=8)
    assert closed.tolist() == [1, 3, 4, 5, 6, 8, 9, 10]  # statement 1 whole; 2 is past longest; 0's best is low
    assert close_statements(kept, memory, statements, top=0.5, longest=9).tolist() == [1, *range(3, 16)]
