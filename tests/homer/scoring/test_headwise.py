"""Head-wise selection: per-head reconstruction scores against an eager forward, and the two cuts."""

import pytest
import torch

from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.headwise import head_scores, keep_global, keep_per_head
from tests.conftest import tiny_model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_head_scores_are_each_heads_best_attention_normalised_over_the_segment(kind):
    model = tiny_model(kind, vocab_size=256)
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, 256, (40,), generator=g)
    prompt = torch.tensor([7, 8, 9])
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    before = [k.clone() for k in keys]
    repeated = torch.arange(10, 30)  # slots 10..29 repeated, in two segments of 12 and 8
    scores = head_scores(
        DecoderStack(model),
        keys,
        values,
        torch.arange(40),
        prompt,
        context[repeated],
        repeated,
        segment_rows=12,
        sinks=2,
    )
    assert scores.shape == (6, 2, 40)
    assert all(torch.equal(k, b) for k, b in zip(keys, before, strict=True))  # the cache is left as it was
    assert torch.isinf(scores[:, :, :10]).all() and torch.isinf(scores[:, :, 30:]).all()
    model.set_attn_implementation("eager")
    expected = torch.full((6, 2, 40), float("-inf"))
    for own in repeated.split(12):
        ids = torch.cat([context, prompt, context[own]])
        with torch.no_grad():
            attentions = model(ids[None], output_attentions=True).attentions  # per layer [1, H, N, N]
        visible = torch.zeros(ids.numel(), dtype=torch.bool)
        visible[own], visible[:2], visible[40:] = True, True, True
        for layer, attention in enumerate(attentions):
            rows = attention[0, :, 40:][:, :, visible]  # [H, R, visible keys]
            rows = rows / rows.sum(-1, keepdim=True)  # the softmax over the visible keys only
            per_key = torch.zeros(4, rows.shape[1], ids.numel())
            per_key[:, :, visible] = rows
            best = per_key[:, :, own].amax(1).view(2, 2, -1).amax(1)  # [Hkv, segment]
            expected[layer][:, own] = best.clamp(min=1e-12).log()
    torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)


def kv(layers=3, heads=2, length=10):
    keys = [torch.randn(1, heads, length, 4) for _ in range(layers)]
    return keys, [k + 100 for k in keys]


def test_each_head_keeps_its_own_best_tokens_and_every_fixed_one():
    torch.manual_seed(0)
    keys, values = kv()
    scores = torch.randn(3, 2, 10)
    fixed = torch.zeros(10, dtype=torch.bool)
    fixed[[0, 9]] = True
    kept_keys, kept_values, kept = keep_per_head(keys, values, scores, fixed, budget=5)
    assert kept.shape == (3, 2, 5)
    for layer in range(3):
        for head in range(2):
            best = set(scores[layer, head, 1:9].topk(3).indices.add(1).tolist())
            assert kept[layer, head].tolist() == sorted(best | {0, 9})
            assert torch.equal(kept_keys[layer][0, head], keys[layer][0, head, kept[layer, head]])
            assert torch.equal(kept_values[layer][0, head], values[layer][0, head, kept[layer, head]])
    with pytest.raises(ValueError, match="never-pruned"):
        keep_per_head(keys, values, scores, fixed, budget=1)


def test_one_budget_over_all_heads_keeps_the_best_pairs_and_hides_the_padding():
    torch.manual_seed(1)
    keys, values = kv()
    scores = torch.randn(3, 2, 10)
    scores[1, 0, 1:9] += 10  # one head that needs many tokens
    fixed = torch.zeros(10, dtype=torch.bool)
    fixed[0] = True
    kept_keys, _, kept, hidden = keep_global(keys, values, scores, fixed, budget=4)
    room = 3 * 2 * 3  # layers x heads x (budget - fixed)
    chosen = {(la, h, int(kept[la, h, w])) for la, h, w in (~hidden).nonzero().tolist()}
    open_pairs = sorted(
        (
            (float(scores[layer, head, t]), layer, head, t)
            for layer in range(3)
            for head in range(2)
            for t in range(1, 10)
        ),
        reverse=True,
    )
    expected = {(layer, head, t) for _, layer, head, t in open_pairs[:room]} | {
        (la, h, 0) for la in range(3) for h in range(2)
    }
    assert chosen == expected
    assert kept.shape[2] == max(
        sum(1 for la, h, _ in expected if (la, h) == pair) for pair in {(la, h) for la, h, _ in expected}
    )
    assert kept.shape[2] >= 8  # the loud head holds its eight tokens and the fixed one ...
    assert int((~hidden[0]).sum()) < 2 * kept.shape[2]  # ... while quieter heads pad
    assert kept_keys[1].shape == (1, 2, kept.shape[2], 4)
