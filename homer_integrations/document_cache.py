"""Placeholder in-memory document cache (interface only); the full store replaces this module.

Interface every caller relies on:
- ``DocumentCache.get_or_compute(key, compute) -> (CompressedDocument, source)`` with source in
  ``memory`` / ``disk`` / ``computed``; concurrent callers with one key cause one ``compute()``.
- ``DocumentCache.stats() -> CacheStats`` (``computations`` counts calls to ``compute``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from homer_integrations.homer.compressed import CompressedDocument

CacheSource = Literal["memory", "disk", "computed"]


@dataclass(frozen=True)
class CacheStats:
    hits_memory: int = 0
    hits_disk: int = 0
    misses: int = 0
    computations: int = 0
    evictions: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    entries: int = 0


class DocumentCache:
    def __init__(self) -> None:
        self._items: dict[str, CompressedDocument] = {}
        self._lock = threading.Lock()
        self._hits = 0
        self._computations = 0

    def get_or_compute(
        self, key: str, compute: Callable[[], CompressedDocument]
    ) -> tuple[CompressedDocument, CacheSource]:
        with self._lock:
            if key in self._items:
                self._hits += 1
                return self._items[key], "memory"
            doc = compute()
            self._computations += 1
            self._items[key] = doc
            return doc, "computed"

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits_memory=self._hits,
                misses=self._computations,
                computations=self._computations,
                memory_bytes=sum(d.nbytes for d in self._items.values()),
                entries=len(self._items),
            )
