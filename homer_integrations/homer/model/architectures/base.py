"""The Llama layout of a decoder layer, split where HOMER prunes; other families override a hook or two.

A family answers, for one architecture: which RoPE table and attention window a layer uses, how a
layer's attention half and MLP half run (norms and residuals), what query its attention computes
(projection and query norm, before RoPE), and how the final hidden state becomes logits. The
decoder loop (``DecoderStack``) owns everything else: caches, masks, positions, query rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar

import torch
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel

CosSin = tuple[torch.Tensor, torch.Tensor]
"""cos, sin [1, T, d] of one RoPE table."""


class UnsupportedModelError(ValueError):
    """The model cannot run HOMER (architecture, attention layout or settings)."""


class Family:
    """A Llama-layout decoder: ``x + attn(input_norm(x))``, then ``x + mlp(post_attention_norm(x))``.

    Shapes: hidden states [1, T, D]; normed rows [1, R, D]; queries [1, H, R, d] (B for 1 where a batch runs).
    """

    model_types: ClassVar[tuple[str, ...]] = ()
    """``config.model_type`` values this family runs."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.config = model.config
        self.backbone = model.model
        self.layers = self.backbone.layers
        attn = self.layers[0].self_attn
        # The modelling module's own RoPE (partial rotary in Phi-3/Phi-4, kernels where installed).
        self._apply_rope: Callable = sys.modules[type(attn).__module__].apply_rotary_pos_emb

    @classmethod
    def check(cls, config: PretrainedConfig) -> None:
        """Raise ``UnsupportedModelError`` for settings of this family HOMER cannot run."""
        if getattr(config, "num_hidden_layers", 0) < 2:
            raise UnsupportedModelError("HOMER needs a model with at least 2 decoder layers")
        if getattr(config, "use_bidirectional_attention", False):
            raise UnsupportedModelError(
                f"{config.model_type} with bidirectional attention is an encoder; HOMER needs a causal decoder"
            )

    # ------------------------------------------------------------------ positions and windows
    def rope_kind(self, layer_idx: int) -> str:
        """Which RoPE table (a key of ``rotary``'s result) layer ``layer_idx`` uses."""
        return "default"

    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, CosSin]:
        """Every RoPE table the layers use, for ``position_ids`` [1, T], RoPE scaling applied."""
        return {"default": self.backbone.rotary_emb(hidden, position_ids)}

    def window(self, layer_idx: int) -> int | None:
        """Keys a query of layer ``layer_idx`` sees (itself included, in sequence order); None: all."""
        size = getattr(self.config, "sliding_window", None)
        layer_types = getattr(self.config, "layer_types", None)
        if layer_types is not None:
            return size if layer_types[layer_idx] == "sliding_attention" else None
        return size

    # ------------------------------------------------------------------ one layer, in two halves
    def attend(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        rope: CosSin,
        cache: DynamicCache,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention half with its residual: (new hidden [1, T, D], the normed input [1, T, D])."""
        layer = self.layers[layer_idx]
        normed = layer.input_layernorm(hidden)
        out, _ = layer.self_attn(hidden_states=normed, position_embeddings=rope, attention_mask=mask, cache=cache)
        return hidden + out, normed

    def feed_forward(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """MLP half with its residual: [1, T, D] -> [1, T, D]."""
        layer = self.layers[layer_idx]
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def query_states(self, layer_idx: int, normed_rows: torch.Tensor) -> torch.Tensor:
        """Queries [1, H, R, d] of normed rows [1, R, D] as the attention computes them, before RoPE."""
        attn = self.layers[layer_idx].self_attn
        return attn.q_proj(normed_rows).view(*normed_rows.shape[:2], -1, attn.head_dim).transpose(1, 2)

    def rotate(self, query: torch.Tensor, rope: CosSin) -> torch.Tensor:
        """RoPE on queries [1, H, R, d] with their rows' cos, sin [1, R, d]."""
        rotated, _ = self._apply_rope(query, query, *rope)
        return rotated

    # ------------------------------------------------------------------ output
    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the last position: [1, 1, D] -> [V] float32."""
        return self.model.lm_head(self.backbone.norm(hidden_last))[0, -1].float()
