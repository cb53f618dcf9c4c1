"""Decoding over a kept document cache at the memory-bandwidth limit.

A kept cache (a full prefill, a root) is read by every question and never written. transformers'
``DynamicLayer.update`` concatenates each new token onto the whole layer (a copy of the document's
K/V per layer per answer token), and its eager and SDPA paths on a CPU repeat every K/V head for
each query head of its group (``repeat_kv``). ``KeptLayer`` leaves the stored K/V where they are
(memory-mapped or not) and writes what a question appends into a preallocated tail; its ``update``
hands attention a ``KeptKV``, and ``kept_attention`` computes grouped-query attention as such: the
query heads of a group become rows of one product with their K/V head, so the stored keys and
values are each read once per step, nothing is copied, and only the small tail is masked causally.
A read of many rows at once (a question, its passages after a kept root) goes to PyTorch's fused
attention instead: there the products, not the reading of K/V, are the cost, and its kernel never
holds the float32 scores (600 rows over 17.7k kept tokens: 0.1 s a layer against 0.7 s, bfloat16, 2 cores).
On a CPU the fused kernel runs over the stored K/V alone, a group's query heads as rows of one K/V head
(no copy of the cache, no head repeated), and the small tail apart; the two are joined by their
log-sum-exps (``_split``): 30 question rows over 32.5k kept tokens, 9.5 ms a layer against 19 ms for the
fused kernel over the concatenated K/V with its grouped-query option and 42 ms for the grouped product.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

try:  # PyTorch's CPU flash attention, which returns each row's log-sum-exp (the public function does not)
    _FLASH_CPU: Any = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
except (AttributeError, RuntimeError):  # pragma: no cover - an older or stripped PyTorch
    _FLASH_CPU = None

_SCORE_BYTES = 256 << 20
"""Most bytes of float32 scores one block of query rows may hold (a long continuation runs in blocks)."""

FUSED_ROWS = 16
"""Rows read at once from which the fused kernel is faster than the grouped product (bfloat16, 2 cores:
at 8 rows the two are level at 4k kept tokens, the grouped product ahead past it; at 32 rows the fused
kernel is 2.5-3x faster at 4k-32k)."""

ATTENDED_ROWS = 64
"""The last rows of a longer read whose attention ``attended`` sums: the question and the turn's end (the
passages read before them are not what the answer cites, and every row costs as much again). A read of
at most this many rows in a layer that sums goes to the grouped product whole: its weights are needed."""


@dataclass(frozen=True)
class KeptKV:
    """One layer's keys (or values) for attention: the ``stored`` [1, Hkv, K, d] every row sees, then the
    ``tail`` [1, Hkv, t, d] (the question and answer so far), causal."""

    stored: torch.Tensor
    tail: torch.Tensor
    attended: torch.Tensor | None = None
    """[A] float32, or None: where attention adds what every query row paid each of the first A tokens, the
    stored ones and the tail's first rows (an ``Echo`` written there before the question; ``sources``)."""
    deferred: list[Callable[[], None]] | None = None
    """Where a fused read leaves the sums it needs a product of its own for, to run once the answer's first
    token is out (None: at once)."""

    def whole(self) -> torch.Tensor:
        """Stored and tail concatenated [1, Hkv, K + t, d] (a copy: for the attention paths that need one)."""
        return torch.cat([self.stored, self.tail], dim=-2)


class KeptLayer(DynamicLayer):
    """A layer of a kept cache: ``stored`` K/V [1, Hkv, K, d], never written, and a tail of ``capacity``
    rows written in place as a question and its answer are fed (grown by doubling past it). ``attended``
    [A] (shared by the layers of one cache), if given, sums the attention each of the first A tokens (stored,
    then the tail's) receives."""

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        capacity: int,
        attended: torch.Tensor | None = None,
        deferred: list[Callable[[], None]] | None = None,
    ) -> None:
        super().__init__()
        self.stored_keys, self.stored_values = keys, values
        self.attended, self.deferred = attended, deferred
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
        keys = KeptKV(self.stored_keys, self.keys, self.attended, self.deferred)
        return keys, KeptKV(self.stored_values, self.values)

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
    deferred: list[Callable[[], None]] | None = None,
) -> DynamicCache:
    """A cache of ``KeptLayer`` s over ``keys[i]``/``values[i]`` [1, Hkv, K, d], each tail sized for ``capacity``
    rows (the question and the answer's tokens); ``attended`` [A] float32 (zeros), if given, sums the
    attention every query row (of a read of more than ``ATTENDED_ROWS``, its last ``ATTENDED_ROWS``) and head of
    layers ``attended_from`` and up pays each of the first A tokens (K stored, then rows written first); a fused
    read's sums are appended to ``deferred`` if given (the caller runs them before reading ``attended``)."""
    cache = DynamicCache()
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.layers.append(KeptLayer(k, v, capacity, attended if i >= attended_from else None, deferred))
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
    rows, dim = query.shape[2], query.shape[3]
    scale = dim**-0.5 if scaling is None else scaling
    summed = key.attended is not None
    split = _splits(query, key)
    if rows < FUSED_ROWS or (summed and rows <= ATTENDED_ROWS and not split):  # the weights are computed anyway
        return _grouped(query, key, value, scale, key.attended).transpose(1, 2).contiguous(), None
    if split:
        out, lse = _split(query, key, value, scale)
        if summed and key.deferred is not None:  # its own product over the cache: not before the first token
            key.deferred.append(functools.partial(_add_weights, query, key, scale, lse, key.attended))
        elif summed:
            _add_weights(query, key, scale, lse, key.attended)
        return out.transpose(1, 2).contiguous(), None
    if summed:  # the sums only: the fused kernel gives no weights
        _grouped(query[:, :, -ATTENDED_ROWS:], key, value, scale, key.attended, outputs=False)
    seen = _seen(rows, key.tail.shape[-2], query.device)
    visible = torch.cat([seen.new_ones(rows, key.stored.shape[-2]), seen], dim=-1)
    out = F.scaled_dot_product_attention(
        query, key.whole(), value.whole(), attn_mask=visible, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def _splits(query: torch.Tensor, key: KeptKV) -> bool:
    """Whether a read goes to ``_split``: on a CPU with its flash kernel, a tail whose float32 scores fit."""
    _, heads, rows, _ = query.shape
    return (
        _FLASH_CPU is not None
        and query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.bfloat16)
        and 4 * heads * rows * key.tail.shape[-2] <= _SCORE_BYTES
    )


def _split(query: torch.Tensor, key: KeptKV, value: KeptKV, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``query`` [1, H, q, d] (the last q tail tokens) as two parts joined by their log-sum-exps:
    the flash kernel over the stored K/V (every row sees them all) and a float32 product over the tail
    (causal). A group's query heads are rows of its K/V head. Returns [1, H, q, d] and each row's
    log-sum-exp over everything it sees [1, Hkv, group * q] (float32)."""
    _, heads, rows, dim = query.shape
    kv_heads = key.stored.shape[1]
    group = heads // kv_heads
    q = query.reshape(1, kv_heads, group * rows, dim)
    out, lse = _FLASH_CPU(q, key.stored, value.stored, 0.0, False, scale=scale)[:2]
    scores = (q @ key.tail.transpose(-1, -2)).float().mul_(scale)
    scores.masked_fill_(~_seen(rows, key.tail.shape[-2], query.device).repeat(group, 1), float("-inf"))
    tail_lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - tail_lse[..., None]).to(value.tail.dtype)
    total = torch.logaddexp(lse, tail_lse)
    mixed = out.float() * torch.exp(lse - total)[..., None]
    mixed += (weights @ value.tail).float() * torch.exp(tail_lse - total)[..., None]
    return mixed.to(query.dtype).view(1, heads, rows, dim), total


def _add_weights(query: torch.Tensor, key: KeptKV, scale: float, lse: torch.Tensor, attended: torch.Tensor) -> None:
    """Add into ``attended`` [A] the weights the last ``ATTENDED_ROWS`` of ``query`` [1, H, q, d] pay each of the
    first A tokens (stored, then the tail's first), from each row's log-sum-exp ``lse`` [1, Hkv, group * q]
    (``_split``'s): exp(score - lse), no softmax pass; the stored and tail parts apart (no copy of the cache)."""
    _, heads, rows, dim = query.shape
    kv_heads, stored, tail = key.stored.shape[1], key.stored.shape[-2], key.tail.shape[-2]
    group, last = heads // kv_heads, min(rows, ATTENDED_ROWS)
    q = query[:, :, -last:].reshape(1, kv_heads, group * last, dim)
    lse = lse.view(1, kv_heads, group, rows)[..., -last:].reshape(1, kv_heads, group * last, 1)
    block = max(1, _SCORE_BYTES // (4 * stored))
    for start in range(0, group * last, block):
        end = min(group * last, start + block)
        scores = (q[:, :, start:end] @ key.stored[..., : attended.numel(), :].transpose(-1, -2)).float()
        attended[:stored].add_(scores.mul_(scale).sub_(lse[:, :, start:end]).exp_().sum(dim=(0, 1, 2)))
    extra = min(attended.numel() - stored, tail)
    if extra > 0:  # the tail's first tokens (an echo), as far as each row sees them
        scores = (q @ key.tail[..., :extra, :].transpose(-1, -2)).float().mul_(scale).sub_(lse).exp_()
        seen = _seen(rows, tail, query.device)[-last:, :extra].repeat(group, 1)
        attended[stored : stored + extra].add_((scores * seen).sum(dim=(0, 1, 2)))


def _seen(rows: int, tail: int, device: torch.device, start: int = 0) -> torch.Tensor:
    """[n, tail] bool: which tail tokens query rows ``start..start+n`` (of the last ``rows`` of a ``tail``-token
    tail, ``n = rows - start`` unless cut by the caller) see: the tail up to their own token, causal."""
    own = torch.arange(start, rows, device=device) + (tail - rows)
    return torch.arange(tail, device=device)[None, :] <= own[:, None]


def _grouped(
    query: torch.Tensor,
    key: KeptKV,
    value: KeptKV,
    scale: float,
    attended: torch.Tensor | None,
    outputs: bool = True,
) -> torch.Tensor:
    """Grouped-query attention of ``query`` [1, H, q, d] (the last q tail tokens) over ``key``/``value``, the
    query heads of a K/V head stacked as rows of one product, in blocks of rows under ``_SCORE_BYTES`` of
    float32 scores; adds the first A tokens' weights into ``attended`` [A] if given. Returns [1, H, q, d]
    (left empty if not ``outputs``)."""
    _, heads, rows, dim = query.shape
    kv_heads, stored = key.stored.shape[1], key.stored.shape[-2]
    group = heads // kv_heads
    tail = key.tail.shape[-2]
    block = max(1, _SCORE_BYTES // (4 * heads * (stored + tail)))
    out = query.new_empty(1, heads, rows, dim)
    for start in range(0, rows, block):
        end = min(rows, start + block)
        q = query[:, :, start:end].reshape(1, kv_heads, group * (end - start), dim)  # a group's heads as rows
        scores = torch.cat([q @ key.stored.transpose(-1, -2), q @ key.tail.transpose(-1, -2)], dim=-1).float()
        scores *= scale
        if tail:
            hidden = ~_seen(rows, tail, query.device, start)[: end - start]
            scores[..., stored:].masked_fill_(hidden.repeat(group, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if attended is not None:
            attended.add_(probs[..., : attended.numel()].sum(dim=(0, 1, 2)))
        if outputs:
            weights = probs.to(value.stored.dtype)
            mixed = weights[..., :stored] @ value.stored + weights[..., stored:] @ value.tail
            out[:, :, start:end] = mixed.view(1, heads, end - start, dim)
    return out


def kept_decoding(config: Any) -> bool:
    """Whether a model of ``config`` may decode over ``KeptLayer`` s: every layer attends to every earlier
    token with unscaled scores (no sliding window, no soft-capping), the one rule ``kept_attention`` applies."""
    types = getattr(config, "layer_types", None) or ()
    sliding = any(t != "full_attention" for t in types) or (
        not types and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    )
    return not sliding and not getattr(config, "attn_logit_softcapping", None)
