"""The head-wise probe's masked answering: hidden cache slots are as good as removed ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from homer_integrations.homer.kv import cache_from_tensors
from tests.conftest import tiny_model

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from headwise_probe import hidden_slots


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
