"""Merging two pruned sibling chunks into their parent (paper, section 5)."""

from __future__ import annotations

import torch

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors


def _merge_along(left: torch.Tensor, right: torch.Tensor, lc: Chunk, rc: Chunk, dim: int) -> torch.Tensor:
    """prefix mean + left document + right document + suffix mean, along ``dim``."""

    def part(t: torch.Tensor, s: slice) -> torch.Tensor:
        return t.narrow(dim, s.start, s.stop - s.start)

    prefix = (part(left, lc.prefix) + part(right, rc.prefix)) / 2
    suffix = (part(left, lc.suffix) + part(right, rc.suffix)) / 2
    return torch.cat([prefix, part(left, lc.document), part(right, rc.document), suffix], dim=dim)


def merge_siblings(left: Chunk, right: Chunk) -> Chunk:
    """The parent of two pruned children: affixes averaged, documents concatenated in order.

    Averaging applies to the hidden states and to every cached layer's keys and values. Position
    ids are concatenated (left prefix, both documents, right suffix) and never reassigned, so the
    parent has repeated, non-monotonic positions; cached keys stay rotated at their own positions.
    """
    if (left.prefix_len, left.suffix_len) != (right.prefix_len, right.suffix_len):
        raise ValueError("siblings must share prefix and suffix lengths")
    lk, lv = layer_tensors(left.cache)
    rk, rv = layer_tensors(right.cache)
    if len(lk) != len(rk):
        raise ValueError(f"siblings computed different layer counts: {len(lk)} vs {len(rk)}")
    keys = [_merge_along(a, b, left, right, dim=2) for a, b in zip(lk, rk, strict=True)]
    values = [_merge_along(a, b, left, right, dim=2) for a, b in zip(lv, rv, strict=True)]

    def cat1d(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a[left.prefix], a[left.document], b[right.document], b[right.suffix]])

    return Chunk(
        hidden=_merge_along(left.hidden, right.hidden, left, right, dim=1),
        position_ids=cat1d(left.position_ids, right.position_ids),
        reducible=cat1d(left.reducible, right.reducible),
        origin=cat1d(left.origin, right.origin),
        memory=cat1d(left.memory, right.memory),
        prefix_len=left.prefix_len,
        suffix_len=left.suffix_len,
        cache=cache_from_tensors(keys, values),
    )
