"""Placeholder in-memory document cache; replaced by the full store (LRU bytes, disk, locks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from homer_integrations.homer.compressed import CompressedDocument

CacheSource = Literal["memory", "disk", "computed"]


class DocumentCache:
    def __init__(self) -> None:
        self._items: dict[str, CompressedDocument] = {}
        self._lock = threading.Lock()

    def get_or_compute(
        self, key: str, compute: Callable[[], CompressedDocument]
    ) -> tuple[CompressedDocument, CacheSource]:
        with self._lock:
            if key in self._items:
                return self._items[key], "memory"
            doc = compute()
            self._items[key] = doc
            return doc, "computed"
