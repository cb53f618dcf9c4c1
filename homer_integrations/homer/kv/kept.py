"""Decoding over a kept document cache at the memory-bandwidth limit.

A kept cache (a full prefill, a root) is read by every question and never written. transformers'
``DynamicLayer.update`` concatenates each new token onto the whole layer (a copy of the document's
K/V per layer per answer token), and its eager and SDPA paths on a CPU repeat every K/V head for
each query head of its group (``repeat_kv``). ``KeptLayer`` leaves the stored K/V where they are
(memory-mapped or not) and writes what a question appends into a preallocated tail; its ``update``
hands attention a ``KeptKV``, and ``kept_attention`` computes grouped-query attention as such: the
query heads of a group become rows of one product with their K/V head, so the stored keys and
values are each read once per step, nothing is copied, and only the small tail is masked causally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_SCORE_BYTES = 256 << 20
"""Most bytes of float32 scores one block of query rows may hold (a long continuation runs in blocks)."""


@dataclass(frozen=True)
class KeptKV:
    """One layer's keys (or values) for attention: the ``stored`` [1, Hkv, K, d] every row sees, then the
    ``tail`` [1, Hkv, t, d] (the question and answer so far), causal."""

    stored: torch.Tensor
    tail: torch.Tensor
    attended: torch.Tensor | None = None
    """[K] float32, or None: where attention adds what every query row paid each stored token (``sources``)."""

    def whole(self) -> torch.Tensor:
        """Stored and tail concatenated [1, Hkv, K + t, d] (a copy: for the attention paths that need one)."""
        return torch.cat([self.stored, self.tail], dim=-2)


class KeptLayer(DynamicLayer):
    """A layer of a kept cache: ``stored`` K/V [1, Hkv, K, d], never written, and a tail of ``capacity``
    rows written in place as a question and its answer are fed (grown by doubling past it). ``attended``
    [K] (shared by the layers of one cache), if given, sums the attention each stored token receives."""

    def __init__(
        self, keys: torch.Tensor, values: torch.Tensor, capacity: int, attended: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.stored_keys, self.stored_values = keys, values
        self.attended = attended
        self.device, self.is_initialized = keys.device, True
        shape = (keys.shape[0], keys.shape[1], max(1, capacity), keys.shape[-1])
        self._tail_keys, self._tail_values = keys.new_empty(shape), values.new_empty(shape)
        self.length = 0
        self.keys, self.values = self._tail_keys[..., :0, :], self._tail_values[..., :0, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        """Write [1, Hkv, q, d] after the tail; return the layer as two ``KeptKV``."""
        end = self.length + key_states.shape[-2]
        if end > self._tail_keys.shape[-2]:
            self._tail_keys = _grown(self._tail_keys, self.length, end)
            self._tail_values = _grown(self._tail_values, self.length, end)
        self._tail_keys[..., self.length : end, :] = key_states
        self._tail_values[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self._tail_keys[..., :end, :], self._tail_values[..., :end, :]
        return KeptKV(self.stored_keys, self.keys, self.attended), KeptKV(self.stored_values, self.values)

    def get_seq_length(self) -> int:
        """Stored tokens plus the tail: what transformers sizes its (unused here) mask by."""
        return self.stored_keys.shape[-2] + self.length


def _grown(tail: torch.Tensor, used: int, needed: int) -> torch.Tensor:
    """A tail of at least ``needed`` rows (twice the old size or more) holding ``tail``'s first ``used``."""
    shape = (*tail.shape[:-2], max(needed, 2 * tail.shape[-2]), tail.shape[-1])
    grown = tail.new_empty(shape)
    grown[..., :used, :] = tail[..., :used, :]
    return grown


def kept_cache(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    capacity: int,
    attended: torch.Tensor | None = None,
    attended_from: int = 0,
) -> DynamicCache:
    """A cache of ``KeptLayer`` s over ``keys[i]``/``values[i]`` [1, Hkv, K, d], each tail sized for ``capacity``
    rows (the question and the answer's tokens); ``attended`` [K] float32 (zeros), if given, sums the
    attention every query row and head of layers ``attended_from`` and up pays each stored token."""
    cache = DynamicCache()
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.layers.append(KeptLayer(k, v, capacity, attended if i >= attended_from else None))
    return cache


def kept_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: KeptKV,
    value: KeptKV,
    attention_mask: Any,
    scaling: float | None = None,
    base: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` [1, H, q, d] (the last q tail tokens) to every stored token and to the tail up
    to itself. Returns [1, q, H, d], as transformers' attention functions do.

    A layer with a sliding window or soft-capped scores goes to ``base`` (the model's own function) over
    the concatenated K/V with its ``attention_mask``: those rules are the model's, not this product's."""
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        if base is None:
            raise ValueError("a sliding-window or soft-capped layer needs the model's attention function")
        return base(module, query, key.whole(), value.whole(), attention_mask, scaling=scaling, **kwargs)
    _, heads, rows, dim = query.shape
    kv_heads, stored = key.stored.shape[1], key.stored.shape[-2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    tail = key.tail.shape[-2]
    # a block of query rows times every key in float32 stays under _SCORE_BYTES
    block = max(1, _SCORE_BYTES // (4 * heads * (stored + tail)))
    out = query.new_empty(1, heads, rows, dim)
    for start in range(0, rows, block):
        end = min(rows, start + block)
        q = query[:, :, start:end].reshape(1, kv_heads, group * (end - start), dim)  # a group's heads as rows
        scores = torch.cat([q @ key.stored.transpose(-1, -2), q @ key.tail.transpose(-1, -2)], dim=-1).float()
        scores *= scale
        if tail:  # row i (of the last ``rows`` tail tokens) sees the tail up to its own token
            seen = torch.arange(start, end, device=query.device) + (tail - rows)
            hidden = torch.arange(tail, device=query.device)[None, :] > seen[:, None]  # [n, t]
            scores[..., stored:].masked_fill_(hidden.repeat(group, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if key.attended is not None:
            key.attended.add_(probs[..., :stored].sum(dim=(0, 1, 2)))
        weights = probs.to(value.stored.dtype)
        mixed = weights[..., :stored] @ value.stored + weights[..., stored:] @ value.tail
        out[:, :, start:end] = mixed.view(1, heads, end - start, dim)
    return out.transpose(1, 2).contiguous(), None


def kept_decoding(config: Any) -> bool:
    """Whether a model of ``config`` may decode over ``KeptLayer`` s: every layer attends to every earlier
    token with unscaled scores (no sliding window, no soft-capping), the one rule ``kept_attention`` applies."""
    types = getattr(config, "layer_types", None) or ()
    sliding = any(t != "full_attention" for t in types) or (
        not types and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    )
    return not sliding and not getattr(config, "attn_logit_softcapping", None)
