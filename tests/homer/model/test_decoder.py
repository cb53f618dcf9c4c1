"""``DecoderStack``'s own operations beyond running layers."""

from __future__ import annotations

import torch

from homer_integrations.homer.model.decoder import DecoderStack
from tests.conftest import tiny_model
from tests.homer.leaves.tier_helpers import ids


def test_keys_turned_by_delta_are_the_keys_at_the_new_positions():
    model = tiny_model("llama", vocab_size=256)
    tokens = ids(model, 12, 4)
    delta = torch.tensor([3, -2, 7, 0, 5, 1, 9, 4, 2, 6, 8, 3])
    with torch.no_grad():  # layer 0's keys depend on each token alone, before RoPE
        at = model(tokens[None], position_ids=torch.arange(12)[None], use_cache=True).past_key_values
        moved = model(tokens[None], position_ids=(torch.arange(12) + delta)[None], use_cache=True).past_key_values
    turned = DecoderStack(model).turned_keys(at.layers[0].keys, 0, DecoderStack(model).turns(delta))
    torch.testing.assert_close(turned, moved.layers[0].keys, atol=1e-5, rtol=0)
    assert not torch.allclose(at.layers[0].keys, moved.layers[0].keys, atol=1e-3)
