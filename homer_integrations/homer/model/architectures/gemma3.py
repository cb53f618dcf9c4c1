"""Gemma-3 (text): scaled embeddings, four norms per layer, q/k norms, sliding and global layers.

Sliding layers use their own RoPE table (local base frequency) and see the last ``sliding_window``
keys in sequence order, in leaves and merged nodes alike (the decoder loop builds their masks);
the embedding module scales by sqrt(D) itself; the logits may be soft-capped.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from homer_integrations.homer.model.architectures.base import CosSin, Family


class Gemma3Family(Family):
    model_types = ("gemma3_text",)

    def rope_kind(self, layer_idx: int) -> str:
        return self.config.layer_types[layer_idx]

    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, CosSin]:
        kinds = set(self.config.layer_types)
        return {kind: self.backbone.rotary_emb(hidden, position_ids, kind) for kind in kinds}

    def attend(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        rope: CosSin,
        cache: DynamicCache,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        normed = layer.input_layernorm(hidden)
        out, _ = layer.self_attn(hidden_states=normed, position_embeddings=rope, attention_mask=mask, cache=cache)
        return hidden + layer.post_attention_layernorm(out), normed

    def feed_forward(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_idx]
        return hidden + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(hidden)))

    def query_states(self, layer_idx: int, normed_rows: torch.Tensor) -> torch.Tensor:
        attn = self.layers[layer_idx].self_attn
        q = attn.q_proj(normed_rows).view(*normed_rows.shape[:2], -1, attn.head_dim)
        return attn.q_norm(q).transpose(1, 2)

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden_last)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
