"""Leaves copied from a tier already held instead of computed again: what an edited document's tier reuses.

A leaf's K/V and hidden states depend only on (model, settings, prefix, its own tokens): its prefix and
piece never see the question, and its positions start at P wherever it lies (``leaf_tier``). So a leaf
is named by a content key (a hash of the engine's identity, the leaf layers, the prefix's and the
piece's token ids), and ``LeafIndex`` remembers where each content key was last seen: (tier entry key,
leaf index). Building another tier, ``LeafReuse`` finds each of its leaves there and, if that tier is
still held (memory or store), copies the leaf instead of running the leaf layers on it. With a
content-defined split (``content_split``) an edit changes only the leaves around it, so every other
leaf of the new version is copied. Where the engine has a store, a content-split tier's leaves are
also entries of their own under their content keys (``leaf_entry``, ``LeafPass.build``'s ``stash``):
that is how a new process finds the leaves of tiers an earlier one built; this index spares the store's
reads for the tiers this process holds.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.leaves.leaf_tier import LeafPiece, LeafTier


class LeafIndex:
    """Content key of a leaf -> (tier entry key, leaf index), for the last ``size`` leaves seen.

    ``identity``: what besides its tokens and leaf layers decides a leaf (model, tokenizer, dtype,
    settings: a tier key of no text serves)."""

    def __init__(self, identity: str, size: int = 1 << 16) -> None:
        self.identity, self.size = identity, size
        self._seen: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._tiers: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def keys(
        self, prefix_ids: torch.Tensor, document_ids: torch.Tensor, plan: ChunkPlan, leaf_layers: int
    ) -> list[str]:
        """The content key of every leaf of ``plan`` over the prefix [P] and document [L] token ids."""
        head = hashlib.sha256(f"{self.identity}\0{leaf_layers}\0".encode())
        head.update(prefix_ids.cpu().numpy().astype("<i8").tobytes())
        document = document_ids.cpu().numpy().astype("<i8")
        keys = []
        for index in range(plan.num_leaves):
            h = head.copy()
            h.update(b"\0" + document[plan.piece(index)].tobytes())
            keys.append(h.hexdigest())
        return keys

    def add(self, tier_key: str, keys: list[str]) -> None:
        """Leaf ``i`` of the tier stored under ``tier_key`` has content key ``keys[i]``."""
        with self._lock:
            self._tiers[tier_key] = None
            self._tiers.move_to_end(tier_key)
            for index, key in enumerate(keys):
                self._seen[key] = (tier_key, index)
                self._seen.move_to_end(key)
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)
            while len(self._tiers) > self.size:
                self._tiers.popitem(last=False)

    def has_tier(self, tier_key: str) -> bool:
        """Whether the leaves of the tier under ``tier_key`` were added."""
        with self._lock:
            return tier_key in self._tiers

    def find(self, key: str) -> tuple[str, int] | None:
        with self._lock:
            return self._seen.get(key)


class LeafReuse:
    """A tier build's source of already computed leaves: ``index`` says where each was seen, ``held(key)``
    gives that tier if it is still held (never computing it)."""

    def __init__(self, index: LeafIndex, held: Callable[[str], LeafTier | None]) -> None:
        self.index, self.held = index, held
        self.keys: list[str] = []
        self.copied = 0

    def prepare(self, prefix_ids: torch.Tensor, document_ids: torch.Tensor, plan: ChunkPlan, leaf_layers: int) -> None:
        """Content keys of the leaves about to be built (``plan``'s, over these token ids)."""
        self.keys = self.index.keys(prefix_ids, document_ids, plan, leaf_layers)

    def built(self, tier_key: str) -> None:
        """The tier of the prepared leaves was built under ``tier_key``: remembered."""
        self.index.add(tier_key, self.keys)

    def take(self, index: int, length: int, leaf_layers: int) -> LeafPiece | None:
        """Leaf ``index``'s piece (``length`` document tokens) as a held tier has it; None when no held tier has it."""
        found = self.index.find(self.keys[index])
        tier = None if found is None else self.held(found[0])
        if tier is None or tier.leaf_layers != leaf_layers or found[1] >= len(tier.pieces):
            return None
        piece = tier.pieces[found[1]]
        if piece.length != length:
            return None
        self.copied += 1
        return piece
