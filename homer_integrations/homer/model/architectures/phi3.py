"""Phi-3 / Phi-4-mini: fused ``qkv_proj`` (queries first) and fused ``gate_up_proj`` inside the MLP."""

from __future__ import annotations

import torch

from homer_integrations.homer.model.architectures.base import Family


class Phi3Family(Family):
    """The MLP module unfuses gate/up itself; only the query projection needs slicing here.

    Partial rotary (Phi-4-mini rotates 3/4 of each head) comes with the module's own RoPE function.
    """

    model_types = ("phi3",)

    def query_states(self, layer_idx: int, normed_rows: torch.Tensor) -> torch.Tensor:
        attn = self.layers[layer_idx].self_attn
        width = self.config.num_attention_heads * attn.head_dim
        q = attn.qkv_proj(normed_rows)[..., :width]
        return q.view(*normed_rows.shape[:2], -1, attn.head_dim).transpose(1, 2)
