"""``LeafStashInStore``: a content-split tier's leaves as store entries of their own, and reading them back.

Each leaf of a tier built with ``split="content"`` is an entry under its content key (``homer.leaves.leaf_entry``),
written as the build finishes it, and the tier's own entry lists those keys (``homer.leaves.tier_file``). The same
text under the same prefix and model is stored once, whichever document holds it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from safetensors import SafetensorError

from homer_integrations.cache.entry import Entry, Unusable, mapped_entry
from homer_integrations.cache.store_base import Store
from homer_integrations.homer.kv.compressed import CacheSpec
from homer_integrations.homer.leaves.leaf_entry import LeafEntry
from homer_integrations.homer.leaves.leaf_tier import LeafPiece, LeafTier

logger = logging.getLogger(__name__)


class Entries(Protocol):
    """What of ``stored.StoredEntries`` the leaves use: its store, verified reads and warned writes."""

    store: Store

    def read(self, key: str, spec: CacheSpec | None = None) -> tuple[Entry, dict[str, Any]] | None: ...

    def write(self, key: str, doc: Entry, label: str | None) -> bool: ...


def stored_by_leaves(store: Store, doc: Entry) -> bool:
    """Whether ``doc`` is a tier whose pieces are all stored in ``store`` as leaf entries (then only its prefix
    and its leaves' keys are written); a tier one of whose leaves could not be kept is written whole."""
    if not isinstance(doc, LeafTier) or doc.storage is not None or doc.leaf_keys is None:
        return False
    return all(store.read_manifest(k) is not None for k in doc.leaf_keys)


class LeafStashInStore:
    """``LeafPass``'s ``LeafStash`` over the store of ``entries``: each leaf an entry under its content key,
    written as the build finishes it and memory-mapped back where the store has local files (the build then
    holds one leaf at a time); one already stored is read, not computed. ``spec``: what the entries must fit."""

    def __init__(self, entries: Entries, spec: CacheSpec | None) -> None:
        self.entries, self.spec = entries, spec
        self.written = 0  # bytes of leaves this build wrote
        self.failed = False  # a write failed (and warned): the rest of the build keeps its leaves in memory

    def read(self, key: str) -> LeafEntry:
        """The stored leaf entry under content key ``key``, verified. Raises ``Unusable`` (and removes the leaf)
        when it is missing or cannot be trusted, so a tier that lists it is built again and writes it anew."""
        try:
            loaded = self.entries.read(key, self.spec)
        except Unusable as exc:
            self.entries.store.remove(key)
            raise Unusable(f"its leaf {key[:12]} is unusable ({exc})") from exc
        if loaded is None or not isinstance(loaded[0], LeafEntry) or loaded[0].key != key:
            raise Unusable(f"its leaf {key[:12]} is not in the store")
        self.entries.store.touch(key)
        return loaded[0]

    def find(self, key: str) -> LeafPiece | None:
        try:
            return self.read(key).piece
        except Unusable:
            return None

    def keep(self, key: str, piece: LeafPiece) -> LeafPiece:
        store = self.entries.store
        if store.read_manifest(key) is not None:
            store.touch(key)
            return piece
        entry = LeafEntry(key, piece)
        budget = store.budget_bytes
        if self.failed or (budget is not None and self.written + entry.nbytes > budget // 2):
            # past half the disk budget a tier's own leaves would evict its first ones (or every other
            # document): the rest stay in memory and the tier is written whole, or refused as too large
            return piece
        if not self.entries.write(key, entry, None):
            self.failed = True
            return piece
        self.written += entry.nbytes
        path = store.tensors_file(key)
        if path is None:
            return piece
        try:
            entry = mapped_entry(path)
        except (SafetensorError, ValueError, KeyError, OSError) as exc:
            logger.warning("could not map the leaf just written for %s: %s", key[:12], exc)
            return piece
        return entry.piece if isinstance(entry, LeafEntry) else piece
