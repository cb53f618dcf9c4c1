"""``log_max_attention`` reads a block's keys up to its last row only (``research/headwise_speed.py``):
the same scores as the whole causal map it replaced (kept here as the reference), so the head-wise
probe and every path that scores by it (the leaves' reconstruction probe, question attention) keep
their output."""

from unittest import mock

import pytest
import torch

from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring import headwise as selection
from homer_integrations.homer.scoring.scorers import ScoreInput, log_max_attention
from tests.conftest import tiny_model


def reference_log_max_attention(x: ScoreInput, length: int, block: int, per_head: bool) -> torch.Tensor:
    """The former implementation: every block's logits over all keys, the causal part masked."""
    rows, keys = x.queries.shape[2], x.keys.shape[2]
    heads, kv_heads = x.queries.shape[1], x.keys.shape[1]
    k = x.keys[0].float()
    best = torch.full((kv_heads, length) if per_head else (length,), float("-inf"))
    reduce = (1, 2) if per_head else (0, 1, 2)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        q = x.queries[0, :, start:stop].float().view(kv_heads, heads // kv_heads, stop - start, -1)
        logits = torch.einsum("hgrd,hkd->hgrk", q, k).mul_(x.scaling)
        row_pos = torch.arange(keys - rows + start, keys - rows + stop)
        unseen = torch.arange(keys)[None, :] > row_pos[:, None]
        probs = logits.masked_fill_(unseen, float("-inf")).softmax(-1)[..., :length]
        best = torch.maximum(best, probs.amax(dim=reduce))
    return best.clamp(min=1e-12).log()


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize(
    ("cached", "rows", "length", "block"),
    [
        (40, 30, 40, 7),  # a probe after a leaf: the cached keys scored
        (40, 30, 70, 7),  # a question's rows score every key, their own included
        (40, 30, 52, 256),  # one block; a length inside the rows
        (0, 25, 25, 4),  # rows alone
        (9, 1, 10, 3),  # one row
    ],
)
def test_log_max_attention_matches_the_whole_causal_map(per_head, cached, rows, length, block):
    g = torch.Generator().manual_seed(cached * 1000 + rows + length)
    heads, kv_heads, dim = 6, 2, 16
    queries = torch.randn(1, heads, rows, dim, generator=g).mul(2).to(torch.bfloat16)
    keys = torch.randn(1, kv_heads, cached + rows, dim, generator=g).mul(2).to(torch.bfloat16)
    everything = torch.ones(cached + rows, dtype=torch.bool)
    x = ScoreInput(queries, keys, torch.arange(cached + rows), everything, 0, 0.25, None)
    got = log_max_attention(x, length, block, per_head=per_head)
    want = reference_log_max_attention(x, length, block, per_head)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(got.argsort(dim=-1, stable=True), want.argsort(dim=-1, stable=True)), "the same ranking"


def test_head_scores_are_those_of_the_whole_causal_map():
    model = tiny_model("llama", vocab_size=256)
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, 256, (40,), generator=g)
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    repeated = torch.arange(4, 36)
    args = (keys, values, torch.arange(40), torch.tensor([7, 8, 9]), context[repeated], repeated, 20)
    got = selection.head_scores(DecoderStack(model), *args)

    def former(x, length, per_head=False):
        return reference_log_max_attention(x, length, 5, per_head)  # blocks of 5 rows: several per segment

    with mock.patch.object(selection, "log_max_attention", former):
        want = selection.head_scores(DecoderStack(model), *args)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(got.isinf(), want.isinf())
