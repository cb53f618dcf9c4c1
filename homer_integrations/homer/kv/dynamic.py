"""Helpers that move K/V tensors in and out of transformers' ``DynamicCache``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def cache_from_tensors(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> DynamicCache:
    """A ``DynamicCache`` whose layer ``i`` holds ``keys[i]``/``values[i]`` ([1, Hkv, K, d]) without copying.

    ``DynamicLayer.update`` concatenates into new tensors, so a forward on this cache never
    writes into the tensors passed here: a stored compressed cache can back many questions.
    """
    cache = DynamicCache()
    for k, v in zip(keys, values, strict=True):
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


def layer_tensors(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer key and value tensors ([1, Hkv, T, d] each) of an initialised cache."""
    return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def tensors_nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
