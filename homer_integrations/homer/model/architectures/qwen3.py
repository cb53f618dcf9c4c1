"""Qwen3: the Llama layout with a per-head RMSNorm on queries and keys before RoPE."""

from __future__ import annotations

import torch

from homer_integrations.homer.model.architectures.base import Family


class Qwen3Family(Family):
    model_types = ("qwen3",)

    def query_states(self, layer_idx: int, normed_rows: torch.Tensor) -> torch.Tensor:
        """Projected queries through ``q_norm`` (over each head's d), [1, H, R, d], before RoPE."""
        attn = self.layers[layer_idx].self_attn
        q = attn.q_proj(normed_rows).view(*normed_rows.shape[:2], -1, attn.head_dim)
        return attn.q_norm(q).transpose(1, 2)
