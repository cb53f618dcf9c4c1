"""``MemoryLRU``: entries in memory, least recently used evicted first, bounded by bytes."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from homer_integrations.cache.entry import Entry, document_nbytes, resident_nbytes
from homer_integrations.cache.mapped import FileStamp

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One entry held in memory; ``unverified``: read from a store without a ``CacheSpec``.
    ``nbytes``: the entry's size; ``resident``: what of it counts against the budget (``resident_nbytes``);
    ``files``: the files it is memory-mapped from, as they were when mapped (``cache.mapped``)."""

    doc: Entry
    nbytes: int
    created: float
    label: str | None
    unverified: bool = False
    resident: int = 0
    files: tuple[FileStamp, ...] = ()


class MemoryLRU:
    """Entries by key within ``budget_bytes`` (``resident_nbytes`` each); thread-safe.

    An entry larger than the whole budget is not kept (``put`` returns False). A memory-mapped leaf
    tier costs nothing here: its pages are the OS's to keep or drop.
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
        self.budget_bytes = budget_bytes
        self.evictions = 0
        self._slots: OrderedDict[str, Slot] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: str) -> bool:
        return key in self._slots

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._slots)

    def items(self) -> list[tuple[str, Slot]]:
        with self._lock:
            return list(self._slots.items())

    def get(self, key: str, *, verified: bool = False) -> Slot | None:
        """The slot for ``key`` (now the most recently used), or None. ``verified``: an unverified
        slot is dropped and reported missing, so the caller reads it again with its checks."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return None
            if verified and slot.unverified:
                self._pop(key)
                return None
            self._slots.move_to_end(key)
            return slot

    def put(
        self, key: str, doc: Entry, label: str | None, *, unverified: bool = False, files: tuple[FileStamp, ...] = ()
    ) -> bool:
        """Keep ``doc`` as the most recently used, evicting the least recently used over budget; ``files``: what
        it is mapped from (``Slot.files``)."""
        nbytes, resident = document_nbytes(doc), resident_nbytes(doc)
        with self._lock:
            old = self._pop(key)
            label = label if label is not None or old is None else old.label
            if resident > self.budget_bytes:
                logger.info("document %s (%d bytes) exceeds the memory budget; not kept in memory", key[:12], nbytes)
                return False
            while self._slots and self._nbytes + resident > self.budget_bytes:
                _, evicted = self._slots.popitem(last=False)
                self._nbytes -= evicted.resident
                self.evictions += 1
            created = old.created if old else time.time()
            self._slots[key] = Slot(doc, nbytes, created, label, unverified, resident, files)
            self._nbytes += resident
            return True

    def relabel(self, key: str, label: str | None) -> bool:
        """Set the label of ``key``'s slot; False when it is not in memory."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                slot.label = label
            return slot is not None

    def pop(self, key: str, slot: Slot | None = None) -> Slot | None:
        """Forget ``key`` (only while it holds ``slot``, if given); its slot, if it had one."""
        with self._lock:
            if slot is not None and self._slots.get(key) is not slot:
                return None
            return self._pop(key)

    def clear(self) -> list[str]:
        """Forget everything; the keys that were held."""
        with self._lock:
            keys = list(self._slots)
            self._slots.clear()
            self._nbytes = 0
            return keys

    def _pop(self, key: str) -> Slot | None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._nbytes -= slot.resident
        return slot
