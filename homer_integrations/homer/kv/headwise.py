"""The ragged cache of a head-wise root: every K/V head of every layer keeps its own tokens.

transformers' caches hold one [B, Hkv, K, d] tensor per layer, the same K tokens in every head. A
head-wise root keeps n[l, h] tokens in head h of layer l. ``HeadwiseLayer`` stores a layer's heads
flat ([sum_h n[l, h], d], heads in order, each a view of it) and what decoding appends as a dense tail
[1, Hkv, t, d]; its ``update`` hands attention a ``HeadwiseKV`` in place of a tensor. ``HeadwiseAttention``
attends each K/V head to its own tokens and the tail, and passes every other call to the model's own
attention function (a one-row step on a CPU to the model's eager attention, faster there than
SDPA). A padded dense layout with a mask would answer the same but hold every head at the widest
head's length (1.9x the budget on RULER): the memory the selection saves would be spent again.

transformers picks a layer's attention function by the name in ``config._attn_implementation``, from
its ``AttentionInterface`` registry. ``register_headwise_attention`` registers ``HeadwiseAttention`` there
and names it in the model's config once, when the engine is built (``HomerModel``): decoding then
needs no registration and no config change of its own, so answers running at the same time on one
model never see the setting change under them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.utils.generic import is_flash_attention_requested

from homer_integrations.homer.kv.kept import KeptKV, kept_attention

PREFIX = "homer_headwise+"
"""Name of the registered attention function: this prefix + the implementation it wraps."""
_registering = threading.Lock()


@dataclass(frozen=True)
class HeadwiseKV:
    """One layer's keys (or values) for attention: ``stored[h]`` [n_h, d] per K/V head, then the
    ``tail`` [1, Hkv, t, d] every head shares (the question and answer tokens so far)."""

    stored: Sequence[torch.Tensor]
    tail: torch.Tensor


class HeadwiseLayer(DynamicLayer):
    """A layer of a head-wise cache: ``keys``/``values`` [sum(lengths), d] flat, head h holding
    ``lengths[h]`` rows; the stored rows are never written, so one root backs many questions."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, lengths: Sequence[int]) -> None:
        super().__init__()
        self.stored_keys = keys.split(list(lengths))
        self.stored_values = values.split(list(lengths))
        self.widest = max(lengths)
        self.device, self.is_initialized = keys.device, True
        self.keys = keys.new_zeros(1, len(lengths), 0, keys.shape[-1])
        self.values = values.new_zeros(1, len(lengths), 0, values.shape[-1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        """Append [1, Hkv, q, d] to the tail; return the layer as two ``HeadwiseKV``."""
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return HeadwiseKV(self.stored_keys, self.keys), HeadwiseKV(self.stored_values, self.values)

    def get_seq_length(self) -> int:
        """The widest head plus the tail: what transformers sizes its (unused here) mask by."""
        return self.widest + self.keys.shape[-2]


def headwise_cache(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], lengths: torch.Tensor) -> DynamicCache:
    """A cache of ``HeadwiseLayer`` s: layer l from ``keys[l]``/``values[l]`` [n_l, d] and ``lengths[l]`` [Hkv]."""
    cache = DynamicCache()
    for k, v, n in zip(keys, values, lengths.tolist(), strict=True):
        cache.layers.append(HeadwiseLayer(k, v, n))
    return cache


def headwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: HeadwiseKV,
    value: HeadwiseKV,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` [1, H, q, d] (the last q tail tokens) to each K/V head's own tokens and
    the tail, causal within the tail. Returns [1, q, H, d], as transformers' attention functions do."""
    heads, rows = query.shape[1], query.shape[2]
    group = heads // len(key.stored)
    outputs = []
    for h, (k_h, v_h) in enumerate(zip(key.stored, value.stored, strict=True)):
        k = torch.cat([k_h[None, None], key.tail[:, h : h + 1]], dim=2)
        v = torch.cat([v_h[None, None], value.tail[:, h : h + 1]], dim=2)
        total = k.shape[2]
        # row i sees every stored token and the tail up to itself (the triangle aligned bottom-right)
        mask = None if rows == 1 else torch.ones(rows, total, dtype=torch.bool, device=query.device).tril(total - rows)
        q = query[:, h * group : (h + 1) * group]
        shape = (1, group, total, k.shape[-1])
        out = F.scaled_dot_product_attention(q, k.expand(shape), v.expand(shape), attn_mask=mask, scale=scaling)
        outputs.append(out)
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous(), None


@dataclass(frozen=True)
class HeadwiseAttention:
    """The attention function registered as ``PREFIX + wraps``: ``headwise_attention`` for a head-wise
    layer's ``HeadwiseKV``, ``kept.kept_attention`` for a kept layer's ``KeptKV``, the ``wraps``
    implementation (``sdpa``, ``eager``, ...) for every other call,
    so a dense cache answers as without it; but a one-row SDPA step on a CPU (decoding) runs the model's
    eager attention, which rounds differently in the last bits. ``DecoderStack.backend`` reads ``wraps``."""

    wraps: str

    def __call__(
        self, module: torch.nn.Module, query: torch.Tensor, key: Any, value: Any, attention_mask: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        if isinstance(key, HeadwiseKV):
            return headwise_attention(module, query, key, value, **kwargs)
        if isinstance(key, KeptKV):
            base = _base_attention(module, self.wraps)
            return kept_attention(module, query, key, value, attention_mask, base=base, **kwargs)
        if self.wraps == "sdpa" and query.shape[2] == 1 and query.device.type == "cpu":
            # a decoding step: torch's CPU SDPA kernel spends 2.5 ms a layer on one query row over 2k keys, a
            # third of the step (research/decode_profile.py); the model's eager attention does it in a fraction
            if attention_mask is not None and attention_mask.dtype == torch.bool:  # sdpa's mask: True = attend
                attention_mask = torch.zeros_like(attention_mask, dtype=query.dtype).masked_fill(
                    ~attention_mask, torch.finfo(query.dtype).min
                )
            return _base_attention(module, "eager")(module, query, key, value, attention_mask, **kwargs)
        return _base_attention(module, self.wraps)(module, query, key, value, attention_mask, **kwargs)


def _base_attention(module: torch.nn.Module, base: str) -> Callable[..., Any]:
    """The function transformers would call for ``base``: registered ones by name, eager from the
    module's own modeling file (each model has its own)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    return ALL_ATTENTION_FUNCTIONS.get_interface(base, eager)


def headwise_ready(model: PreTrainedModel) -> bool:
    """Whether ``model``'s config names a registered ``HeadwiseAttention`` (it answers from head-wise caches)."""
    return isinstance(ALL_ATTENTION_FUNCTIONS.get(str(model.config._attn_implementation)), HeadwiseAttention)


def register_headwise_attention(model: PreTrainedModel) -> bool:
    """Let ``model`` answer from head-wise caches; called once, when the engine is built.

    Registers ``HeadwiseAttention(base)`` (and ``base``'s mask function) as ``PREFIX + base`` with
    transformers, ``base`` being the model's implementation, and names it in the model's config.
    Idempotent: a model already set, or a name already registered, is left as it is. Returns whether
    the model is set; False for flash attention, whose kernels read the implementation's name from
    the config (``strategies.HeadwiseRoot`` refuses such a model, so it never holds a head-wise cache)."""
    with _registering:
        if headwise_ready(model):
            return True
        base = str(model.config._attn_implementation)
        if is_flash_attention_requested(requested_attention_implementation=base):
            return False
        name, wrapper = PREFIX + base, HeadwiseAttention(base)
        if ALL_ATTENTION_FUNCTIONS.get(name) != wrapper:
            AttentionInterface.register(name, wrapper)
        if base in ALL_MASK_ATTENTION_FUNCTIONS and name not in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        model.config._attn_implementation = name
        return True
