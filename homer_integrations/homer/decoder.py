"""Our own loop over a decoder's modules, split at the point where HOMER prunes.

transformers' decoder layers run attention and MLP in one call; HOMER must prune between the
two (after attention + residual, before the MLP) and needs the last token's rotated query.
Calling the layer's own submodules in the same order keeps the model's numerics, every
attention backend (SDPA, flash-attn) and RoPE scaling, without patching any class.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from homer_integrations.homer.architectures import check_supported


class DecoderStack:
    """Layer-by-layer access to a Llama-family ``*ForCausalLM`` model.

    Shapes: hidden states [1, T, D]; position ids [T]; cos/sin [1, T, d]; a layer's cached keys
    and values [1, Hkv, T, d]; queries [1, H, T, d].
    """

    def __init__(self, model: PreTrainedModel) -> None:
        check_supported(model.config)
        self.model = model
        self.backbone = model.model
        self.layers = self.backbone.layers
        self.num_layers = len(self.layers)
        attn = self.layers[0].self_attn
        self.head_dim: int = attn.head_dim
        self.scaling: float = attn.scaling
        self.num_heads: int = model.config.num_attention_heads
        self.num_kv_heads: int = model.config.num_key_value_heads

    @property
    def device(self) -> torch.device:
        return self.backbone.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.embed_tokens.weight.dtype

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised tensor of the model's dtype on its device."""
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [1, T, D] input embeddings."""
        return self.backbone.embed_tokens(input_ids.to(self.device)[None])

    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, T, d] for ``position_ids`` [T], with the config's RoPE scaling applied."""
        return self.backbone.rotary_emb(hidden, position_ids.to(self.device)[None])

    def attention(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: DynamicCache,
        query_rows: int = 0,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal self-attention of layer ``layer_idx`` with the residual added.

        The layer's rotated keys/values are appended to ``cache`` (layer ``layer_idx``). Returns
        the new hidden states [1, T, D] and, if ``query_rows`` > 0, the rotated queries
        [1, H, R, d] of the last R tokens (pruning uses the last one, calibration several).
        ``mask``: from ``causal_mask_after`` when ``cache`` already holds earlier tokens.
        """
        layer = self.layers[layer_idx]
        normed = layer.input_layernorm(hidden)
        out, _ = layer.self_attn(
            hidden_states=normed, position_embeddings=rope, attention_mask=mask, past_key_values=cache
        )
        query = None
        if query_rows:
            r = query_rows
            query = self.queries(layer_idx, normed[:, -r:], (rope[0][:, -r:], rope[1][:, -r:]))
        return hidden + out, query

    def causal_mask_after(self, past: int, rows: int) -> torch.Tensor | None:
        """Additive mask [1, 1, R, past + R] for R new rows after ``past`` cached tokens (row i sees
        keys ``0..past + i``), or None where the backend's own causal flag is right.

        SDPA's ``is_causal`` aligns the triangle top-left (and transformers then drops the cached
        keys), so rows after a cache need this mask; flash-attn aligns bottom-right by itself.
        """
        if past == 0 or rows == 1 or "flash" in str(self.model.config._attn_implementation):
            return None
        seen = (
            torch.arange(past + rows, device=self.device)[None, :]
            <= (past + torch.arange(rows, device=self.device))[:, None]
        )
        mask = torch.zeros(rows, past + rows, dtype=self.dtype, device=self.device)
        return mask.masked_fill(~seen, torch.finfo(self.dtype).min)[None, None]

    def queries(
        self, layer_idx: int, normed_rows: torch.Tensor, rope_rows: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Rotated queries [1, H, R, d] of R tokens from their normed hidden states [1, R, D].

        ``rope_rows`` are those tokens' cos/sin [1, R, d]. The attention module does not expose
        its queries, so they are recomputed from its own projection (R is 1 when pruning).
        """
        attn = self.layers[layer_idx].self_attn
        rows = normed_rows.shape[1]
        q = attn.q_proj(normed_rows).view(1, rows, -1, self.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, *rope_rows)
        return q

    def mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's MLP block with its residual: [1, T, D] -> [1, T, D]."""
        layer = self.layers[layer_idx]
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the last position only: [1, 1, D] -> [V] float32."""
        return self.model.lm_head(self.backbone.norm(hidden_last))[0, -1].float()
