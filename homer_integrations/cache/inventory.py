"""``Inventory``: what a cache holds in memory and in its store, listed, sized and removed."""

from __future__ import annotations

from collections.abc import Iterable

from homer_integrations.cache.entry import KINDS, CacheEntry, own_manifest
from homer_integrations.cache.local import LocalStore, Orphan
from homer_integrations.cache.memory import MemoryLRU
from homer_integrations.cache.store import Store


class Inventory:
    """The entries of ``memory`` and of ``store`` (None for memory only), as one cache's."""

    def __init__(self, memory: MemoryLRU, store: Store | None) -> None:
        self.memory = memory
        self.store = store

    def __contains__(self, key: str) -> bool:
        if key in self.memory:
            return True
        if self.store is None:
            return False
        try:
            return self.store.read_manifest(key) is not None
        except OSError:
            return False

    def sizes(self) -> dict[str, int]:
        """``CacheStats``'s sizes: bytes and entries in memory and in the store (read now), memory evictions."""
        stored = self.store.entries() if self.store is not None else {}
        return {
            "evictions": self.memory.evictions,
            "memory_bytes": self.memory.nbytes,
            "disk_bytes": sum(e.disk_bytes for e in stored.values()),
            "entries": len(self.memory),
            "disk_entries": len(stored),
        }

    def entries(self) -> list[CacheEntry]:
        """Every entry, in memory or in the store, newest first; one held in both is listed once."""
        found = self.store.entries() if self.store is not None else {}
        for key, slot in self.memory.items():
            old = found.get(key)
            found[key] = CacheEntry(
                key=key,
                nbytes=slot.nbytes,
                tokens=slot.doc.num_tokens,
                document_tokens=slot.doc.document_tokens,
                created=old.created if old else slot.created,
                label=slot.label if slot.label is not None else (old.label if old else None),
                in_memory=True,
                on_disk=old is not None,
                disk_bytes=old.disk_bytes if old else 0,
                kind=KINDS[type(slot.doc)],
            )
        return sorted(found.values(), key=lambda e: e.created, reverse=True)

    def discard(self, key: str) -> bool:
        """Forget ``key`` in memory and in the store; True if anything was removed (``discard_many``)."""
        return self.discard_many([key])[0] > 0

    def discard_many(self, keys: Iterable[str]) -> tuple[int, int]:
        """Forget ``keys`` in memory and in the store: (entries removed, leaf entries removed with them).

        A tier stored by its leaves takes along the leaf entries no other stored tier lists; a leaf another
        document's tier shares stays. The store is listed once, after the tiers went. (An eviction leaves
        them to the budget, which takes them next: nothing reads them. A tier another process is building
        at that moment may list a leaf removed here: reading that tier then finds it missing and rebuilds
        that leaf, as for any lost leaf.)"""
        removed, leaves = 0, set[str]()
        for key in dict.fromkeys(keys):
            gone = self.memory.pop(key) is not None
            if self.store is not None:
                leaves |= self._listed_leaves(key)
                gone = self.store.discard(key) or gone
            removed += gone
        if self.store is None or not leaves:
            return removed, 0
        return removed, sum(self.store.discard(leaf) for leaf in leaves - self._listed_leaves())

    def _listed_leaves(self, key: str | None = None) -> set[str]:
        """The leaf content keys the stored manifest of ``key`` lists (None: of every stored entry)."""
        assert self.store is not None
        if key is None:
            manifests = [manifest for manifest, _ in self.store.listing()]
        else:
            try:
                raw = self.store.read_manifest(key)
            except OSError:
                return set()
            manifests = [own_manifest(raw) or {}] if raw is not None else []
        return {
            leaf
            for manifest in manifests
            if isinstance(leaves := manifest.get("leaves"), list)
            for leaf in leaves
            if isinstance(leaf, str)
        }

    def orphans(self) -> list[Orphan] | None:
        """The store's orphaned files (``LocalStore.orphans``: leaves no tier lists, tensors with no manifest);
        None where the store cannot tell (memory only, a URL)."""
        return self.store.orphans() if isinstance(self.store, LocalStore) else None

    def remove_orphans(self) -> list[Orphan] | None:
        """Remove the store's orphaned files (``LocalStore.remove_orphans``); those removed, None as for ``orphans``."""
        return self.store.remove_orphans() if isinstance(self.store, LocalStore) else None

    def clear(self, *, memory: bool, disk: bool) -> int:
        """Remove every entry from memory and/or the store; how many distinct keys went."""
        keys: set[str] = set(self.memory.clear()) if memory else set()
        if disk and self.store is not None:
            keys |= self.store.clear()
        return len(keys)

    def trim(self, budget_bytes: int | None) -> int:
        """Evict least recently used stored entries down to ``budget_bytes`` (default: the store's budget);
        how many went. Only a local directory has a budget."""
        return len(self.store.trim(budget_bytes)) if isinstance(self.store, LocalStore) else 0
