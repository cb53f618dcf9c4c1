"""Re-rotating cached keys to new RoPE positions.

RoPE rotates a key at position p by R(p); rotations compose, so R(q) k_p = R(q - p) R(p) k.
Keys cached at HOMER's repeated positions can therefore be moved to contiguous positions
0..K-1 without recomputing anything. The model's own rotary module supplies R (with its RoPE
type); its attention scaling (YaRN's mscale), already applied once, is divided out.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor, rotary_emb) -> torch.Tensor:
    """Keys [1, Hkv, K, d] rotated by ``delta`` [K] positions each."""
    cos, sin = rotary_emb(keys, delta.to(keys.device)[None])
    scale = float(getattr(rotary_emb, "attention_scaling", 1.0) or 1.0)
    cos, sin = cos / scale, sin / scale
    rotated, _ = apply_rotary_pos_emb(keys.float(), keys.float(), cos.float(), sin.float())
    return rotated.to(keys.dtype)


def contiguous_positions(
    keys: list[torch.Tensor], position_ids: torch.Tensor, rotary_emb
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Move every layer's cached keys to positions 0..K-1 in sequence order; returns (keys, positions)."""
    new = torch.arange(position_ids.numel())
    delta = new - position_ids
    return [rotate_keys(k, delta, rotary_emb) for k in keys], new
