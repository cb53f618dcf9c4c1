"""``Lookup``: one key's way through a cache, memory first, then the store, then ``compute``.

Threads asking for one key share one pass (``SingleFlight``); processes sharing a store share it through
the store's per-key lock (``StoredEntries.load_or_compute``). ``Counters`` records what happened.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace

from homer_integrations.cache.entry import CacheSource, E, Entry, Unusable, document_nbytes
from homer_integrations.cache.flight import SingleFlight
from homer_integrations.cache.mapped import MAPPED, FileStamp, why_changed
from homer_integrations.cache.memory import MemoryLRU, Slot
from homer_integrations.cache.stored import DocumentCacheWarning, StoredEntries
from homer_integrations.homer.kv.compressed import CacheSpec, CompressedDocument
from homer_integrations.homer.leaves.leaf_tier import LeafTier

logger = logging.getLogger(__name__)


class Counters:
    """Thread-safe event counts."""

    NAMES = ("hits_memory", "hits_disk", "misses", "computations", "discarded")

    def __init__(self) -> None:
        self._counts = dict.fromkeys(self.NAMES, 0)
        self._lock = threading.Lock()

    def add(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Lookup:
    """Entries by key through ``memory`` and, when there is one, the store (``stored``); ``compute`` on a full miss.

    ``flights.waits`` counts the callers that waited for another's pass over the same key.
    """

    def __init__(self, memory: MemoryLRU, stored: StoredEntries | None, counts: Counters) -> None:
        self.memory = memory
        self.stored = stored
        self.counts = counts
        self.flights: SingleFlight[tuple[Entry, CacheSource]] = SingleFlight()
        self._warned_not_kept = False

    def get_or_compute(
        self,
        key: str,
        compute: Callable[[], E],
        label: str | None,
        spec: CacheSpec | None,
        lock_timeout: float | None,
    ) -> tuple[E, CacheSource]:
        """The entry for ``key`` and where it came from (see ``DocumentCache.get_or_compute``)."""
        slot: Slot | None = None

        def cached() -> tuple[Entry, CacheSource] | None:
            nonlocal slot
            slot = self._slot(key, spec)
            return (slot.doc, "memory") if slot is not None else None

        def keep(result: tuple[Entry, CacheSource]) -> None:
            doc, source = result
            unverified = source == "disk" and spec is None
            kept = self.memory.put(key, doc, label, unverified=unverified, files=self._mapped_files(key, doc))
            if not kept and self.stored is None:
                self._warn_not_kept(doc)

        def miss() -> tuple[Entry, CacheSource]:
            computed = lambda: self._compute(key, compute)  # noqa: E731
            if self.stored is None:
                return computed(), "computed"
            return self.stored.load_or_compute(key, computed, label, spec, lock_timeout)

        (doc, source), role = self.flights.run(key, cached, miss, keep)
        if role != "leader":
            self.counts.add("hits_memory")
        if role == "cached" and slot is not None and label is not None and slot.label != label:
            self.relabel(key, label)
        return doc, "memory" if role == "follower" else source  # type: ignore[return-value]

    def get(self, key: str, spec: CacheSpec | None) -> Entry | None:
        """The entry for ``key`` from memory or the store, or None; never computes (nor discards)."""
        slot = self._slot(key, spec)
        if slot is not None:
            return slot.doc
        if self.stored is None:
            return None
        try:
            loaded = self.stored.read(key, spec)
        except Unusable:
            return None
        if loaded is None:
            return None
        doc, manifest = loaded
        self.memory.put(key, doc, manifest.get("label"), unverified=spec is None, files=self._mapped_files(key, doc))
        return doc

    def _slot(self, key: str, spec: CacheSpec | None) -> Slot | None:
        """``key``'s slot in memory, unless the files it is memory-mapped from changed since they were mapped:
        truncated in place, a mapped page would raise SIGBUS (the process dies); written in place, it would read
        damaged K/V; replaced or removed (``cache rm``, another process's trim and rewrite), the mapping is valid
        but no longer the stored entry. Such a slot is dropped, and the store's verified read (or a computation)
        takes its place. A few ``lstat`` calls per use of a mapped entry (one per leaf of a content-split tier)."""
        slot = self.memory.get(key, verified=spec is not None)
        if slot is None or not slot.files:
            return slot
        why = why_changed(slot.files)
        if why is None:
            return slot
        self.memory.pop(key, slot)
        MAPPED.forget(slot.files)
        logger.info("document cache entry %s: its memory-mapped file changed (%s); reading it again", key[:12], why)
        return None

    def _mapped_files(self, key: str, doc: Entry) -> tuple[FileStamp, ...]:
        return self.stored.mapped_files(key, doc) if self.stored is not None else ()

    def relabel(self, key: str, label: str | None) -> bool:
        """Name the entry for ``key`` in memory and in the store; False when there is no such entry."""
        in_memory = self.memory.relabel(key, label)
        return (self.stored is not None and self.stored.write_label(key, label)) or in_memory

    def _compute(self, key: str, compute: Callable[[], E]) -> E:
        self.counts.add("misses", "computations")
        doc = compute()
        if not isinstance(doc, CompressedDocument | LeafTier):
            raise TypeError(f"compute() returned {type(doc).__name__}, not a CompressedDocument or LeafTier")
        if doc.key != key:
            logger.debug("compute() returned a document keyed %s; storing it under %s", doc.key[:12], key[:12])
            doc = replace(doc, key=key)
        return doc

    def _warn_not_kept(self, doc: Entry) -> None:
        """Once per cache: an entry neither memory nor a store keeps is computed again on every use."""
        if self._warned_not_kept:
            return
        self._warned_not_kept = True
        warnings.warn(
            f"a compressed document of {document_nbytes(doc) / 2**30:.2f} GiB does not fit this cache's memory budget "
            f"({self.memory.budget_bytes / 2**30:.2f} GiB) and the cache has no store, so it is not kept: every "
            "question about it computes it again. Keep documents on disk (HomerModel.from_pretrained(..., store=True) "
            "or store=DIR; the CLI's default) or raise memory_budget_bytes.",
            DocumentCacheWarning,
            stacklevel=5,  # DocumentCache.get_or_compute, as before (keep <- SingleFlight.run <- here)
        )
