"""The head-wise shared root: each K/V head of each layer keeps its own tokens of one budget.

HOMER's other roots keep one token set for every head and layer; this one (``strategies.HeadwiseRoot``,
the default where a model allows it) lets every (layer, K/V head) keep its own, KVzip's allocation,
in a ragged cache of a dense root's bytes. The unit, in the order a root is built and read:

- ``selection``: per-head reconstruction scores (``head_scores``) and the cuts over them
  (``survivors``, ``keep_ragged``; ``keep_per_head`` and ``keep_global`` for research).
- ``root``: building the root (``compress_headwise``) and why a model cannot hold one
  (``headwise_refusal``).
- ``cache``: the ragged cache layer (``HeadwiseLayer``, ``headwise_cache``) and the attention
  function that reads it (``HeadwiseAttention``), registered once per engine build by
  ``register_headwise_attention``.

The names below load on first use (PEP 562), as the package's own do: ``cache`` sits below the
modules that store and decode documents (``compressed``, ``generation``), ``root`` above the
compressors, so importing one part must not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homer_integrations.homer.headwise.cache import (
        PREFIX,
        HeadwiseAttention,
        HeadwiseKV,
        HeadwiseLayer,
        headwise_attention,
        headwise_cache,
        headwise_ready,
        register_headwise_attention,
    )
    from homer_integrations.homer.headwise.root import compress_headwise, headwise_refusal, select_candidates
    from homer_integrations.homer.headwise.selection import (
        SEGMENT_ROWS,
        head_scores,
        keep_global,
        keep_per_head,
        keep_ragged,
        survivors,
    )

_PARTS = {
    "cache": (
        "PREFIX",
        "HeadwiseAttention",
        "HeadwiseKV",
        "HeadwiseLayer",
        "headwise_attention",
        "headwise_cache",
        "headwise_ready",
        "register_headwise_attention",
    ),
    "root": ("compress_headwise", "headwise_refusal", "select_candidates"),
    "selection": ("SEGMENT_ROWS", "head_scores", "keep_global", "keep_per_head", "keep_ragged", "survivors"),
}
_EXPORTS = {name: f"{__name__}.{part}" for part, names in _PARTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "PREFIX",
    "SEGMENT_ROWS",
    "HeadwiseAttention",
    "HeadwiseKV",
    "HeadwiseLayer",
    "compress_headwise",
    "head_scores",
    "headwise_attention",
    "headwise_cache",
    "headwise_ready",
    "headwise_refusal",
    "keep_global",
    "keep_per_head",
    "keep_ragged",
    "register_headwise_attention",
    "select_candidates",
    "survivors",
]
