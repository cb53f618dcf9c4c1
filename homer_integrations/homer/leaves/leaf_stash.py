"""``StashedBuild``: a leaf tier built leaf by leaf into a ``LeafStash``, where each leaf is kept under its content key.

With a store and the content split (``content_split``) each leaf is an entry of its own (``leaf_entry``,
``cache.leaf_stash``), so the tier is stored as the list of its leaves' keys (``tier_file.head_tensors``)
and a leaf already kept by any document's tier is read, not computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.layers.nodes import ProgressFn
from homer_integrations.homer.leaves.leaf_reuse import LeafReuse
from homer_integrations.homer.leaves.leaf_tier import LeafPiece, LeafSlice, LeafTier

LeafPart = Callable[[LeafSlice, torch.Tensor, int, range], LeafSlice]
"""``LeafPass.leaf_part``: (prefix through the layers, a piece's token ids, its first document index, the
layers) -> that leaf's prefix + piece through them."""


class LeafStash(Protocol):
    """Where a tier build keeps each leaf as it finishes, under its content key (a store's leaf entries,
    ``cache.leaf_stash``)."""

    def find(self, key: str) -> LeafPiece | None:
        """The piece kept under content key ``key``, or None."""
        ...

    def keep(self, key: str, piece: LeafPiece) -> LeafPiece:
        """Keep ``piece`` under ``key``; the piece to hold from now on (the kept copy, or ``piece``)."""
        ...


class StashedBuild:
    """``LeafPass.build`` with every leaf taken from a tier ``reuse`` holds, else found in ``stash``, else
    computed by ``leaf_part`` and kept in ``stash``; ``reuse`` names the leaves by their content keys."""

    def __init__(self, leaf_part: LeafPart, reuse: LeafReuse, stash: LeafStash) -> None:
        self.leaf_part, self.reuse, self.stash = leaf_part, reuse, stash

    def build(
        self,
        prefix: LeafSlice,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        plan: ChunkPlan,
        layers: range,
        progress: ProgressFn | None = None,
    ) -> LeafTier:
        """The tier of ``plan`` over the document [L] after ``prefix`` (the prefix [P] through ``layers``);
        its pieces are the kept ones and its ``leaf_keys`` their content keys (no key, word ids or time)."""
        reuse, P = self.reuse, plan.prefix_len
        reuse.prepare(prefix_ids, document_ids, plan, len(layers))
        pieces = []
        for index, content_key in enumerate(reuse.keys):
            span = plan.piece(index)
            # a tier the cache holds first (one read of it serves all its leaves), then the stash
            piece = reuse.take(index, span.stop - span.start, len(layers))
            if piece is None and (piece := self.stash.find(content_key)) is not None:
                reuse.copied += 1
            if piece is None:
                part = self.leaf_part(prefix, document_ids[span], span.start, layers)
                cut = lambda ts: tuple(t[:, :, P:] for t in ts)  # noqa: E731
                piece = LeafPiece(cut(part.keys), cut(part.values), part.hidden[:, P:])
                del part
            pieces.append(self.stash.keep(content_key, piece))
            if progress is not None:
                progress(span.stop - span.start)
        return LeafTier(
            key="",
            plan=plan,
            leaf_layers=len(layers),
            prefix_keys=tuple(prefix.keys),
            prefix_values=tuple(prefix.values),
            prefix_hidden=prefix.hidden,
            pieces=tuple(pieces),
            word_ids=None,
            leaf_keys=tuple(reuse.keys),
        )
