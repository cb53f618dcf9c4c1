"""``DocumentCache``: one compression per document, kept in memory and optionally in a store.

It composes the parts of this package: ``MemoryLRU`` (memory, bounded by bytes); given a ``Store``
(``LocalStore``: a directory with an optional byte budget; ``FsspecStore``: any fsspec URL),
``StoredEntries`` (the store side: entries verified on every read by ``EntryCodec``, the store's
per-key lock across processes, writes); over both, ``Lookup`` (a key's way through memory, the store
and ``compute``, one pass per key across threads) and ``Inventory`` (what both hold: listed, sized,
removed). This class holds the settings and the one door to them.

Interface every caller relies on:
- ``get_or_compute(key, compute) -> (entry, source)`` with source in ``memory`` / ``disk`` /
  ``computed``; concurrent callers with one key cause one ``compute()``, in one process or many
  sharing a store.
- ``stats() -> CacheStats`` (``computations`` counts calls to ``compute``).

Anything unusable in the store (truncated, corrupted, tampered, foreign, an old format version,
another key's file, or, given the model's ``CacheSpec``, tensors of the wrong shape, NaN/inf values
or impossible positions) is removed and recomputed with a ``DocumentCacheWarning``; a directory in
an entry's place is reported, never removed. ``clear``/``discard`` remove only what this cache
wrote. Answering never changes a stored entry (a labelled hit rewrites only the manifest's label).

Labels: ``cache ls`` shows a human label per entry (e.g. the source file name). Pass ``label=`` to
``get_or_compute``, call ``set_label(key, label)``, or wrap calls that reach the cache through the
engine in ``with cache.labelled("book.txt"): ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from homer_integrations.cache.entry import FORMAT_VERSION, CacheEntry, CacheSource, E, Entry
from homer_integrations.cache.inventory import Inventory
from homer_integrations.cache.leaf_stash import LeafStashInStore
from homer_integrations.cache.local import LocalStore, Orphan
from homer_integrations.cache.lookup import Counters, Lookup
from homer_integrations.cache.memory import MemoryLRU
from homer_integrations.cache.secret import default_secret_path, load_secret
from homer_integrations.cache.store import DiskBudgetError, Store, open_store
from homer_integrations.cache.stored import StoredEntries
from homer_integrations.homer.kv.compressed import CacheSpec
from homer_integrations.homer.leaves.tier_file import Allocate

DEFAULT_MEMORY_BUDGET = 2 * 1024**3
_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("homer_document_label", default=None)


@dataclass(frozen=True)
class CacheStats:
    """Counters since this cache object was created, and what it holds now.

    ``hits_memory`` includes callers that waited for another caller's compression of the same
    key; ``misses`` are lookups found neither in memory nor in the store; ``computations`` counts
    calls to ``compute``; ``discarded`` counts unusable stored entries removed.
    """

    hits_memory: int = 0
    hits_disk: int = 0
    misses: int = 0
    computations: int = 0
    evictions: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    entries: int = 0
    disk_entries: int = 0
    discarded: int = 0
    waits: int = 0
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET

    @property
    def hits(self) -> int:
        return self.hits_memory + self.hits_disk


class DocumentCache:
    """Compressed documents by key: an in-memory LRU bounded by bytes over an optional store.

    Args:
        directory: None/False for memory only; True for the default local directory
            (``cache_root() / "documents"``, i.e. ``$HOMER_INTEGRATIONS_CACHE`` or the platform
            cache dir); a path; a URL fsspec knows (``s3://bucket/prefix``, ``file://``,
            ``memory://``); or a ``Store``.
        memory_budget_bytes: most bytes of documents kept in memory (least recently used go
            first); 0 keeps nothing in memory. A document larger than the budget is returned but
            not kept.
        disk_budget_bytes: most bytes a local directory keeps (least recently used entries are
            evicted; an entry larger than the budget is not written); None: no limit.
        lock_timeout: seconds to wait for another process compressing the same document before
            compressing anyway (with a warning); None waits as long as it takes.
        device: where documents loaded from the store go; None = the device they were computed on
            when it exists here, else the CPU.
        keyed: sign every entry written with a keyed checksum (HMAC-SHA256) and serve only entries
            that carry one made with the same secret, so an entry forged by anyone else who can write
            the store is recomputed: True keeps the secret in ``cache_root() / "cache.key"`` (made on
            first use, mode 600), a path names another file; share it with every process that shares
            the store (``cache.secret``). False (the default): the unkeyed sha256 only, as before.
        storage_options: passed to fsspec for a URL (credentials, endpoint).
    """

    def __init__(
        self,
        directory: str | Path | bool | Store | None = None,
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        disk_budget_bytes: int | None = None,
        lock_timeout: float | None = None,
        device: str | torch.device | None = None,
        keyed: bool | str | Path = False,
        **storage_options: Any,
    ) -> None:
        self._memory = memory = MemoryLRU(memory_budget_bytes)
        if directory is True:
            from homer_integrations.paths import cache_root

            directory = cache_root() / "documents"
        self.store: Store | None = (
            open_store(directory, budget_bytes=disk_budget_bytes, **storage_options) if directory else None
        )
        if self.store is None and disk_budget_bytes is not None:
            raise DiskBudgetError("disk_budget_bytes needs a directory")
        self.lock_timeout = lock_timeout
        self.device = torch.device(device) if device is not None else None
        self._counts = Counters()
        if keyed is not False and self.store is None:
            raise ValueError("keyed= signs the entries of a store: give a directory or URL too")
        secret = None
        if keyed is not False:
            secret = load_secret(default_secret_path() if keyed is True else Path(keyed).expanduser())
        self.keyed = secret is not None
        """Whether entries are signed and checked with a secret (``keyed=``)."""
        self.stored = (
            StoredEntries(self.store, self.device, self._counts.add, secret) if self.store is not None else None
        )
        """The store side (None for memory only): verified reads, the locked miss, writes, labels."""
        self._lookup = Lookup(memory, self.stored, self._counts)
        self._inventory = Inventory(memory, self.store)

    @classmethod
    def open(cls, store: str | Path | Store | None = None, disk_budget: int | None = None) -> DocumentCache:
        """The cache an engine builds: memory only; ``store`` (a directory, URL or ``Store``); or,
        with only ``disk_budget``, the default local directory within that budget."""
        if store is None and disk_budget is None:
            return cls()
        return cls(True if store is None else store, disk_budget_bytes=disk_budget)

    @property
    def directory(self) -> Path | None:
        """The local directory of a ``LocalStore``; None for memory only or a URL store."""
        return self.store.directory if isinstance(self.store, LocalStore) else None

    @property
    def location(self) -> str | None:
        """The store's directory or URL; None for memory only."""
        return self.store.location if self.store is not None else None

    @property
    def memory_budget_bytes(self) -> int:
        return self._memory.budget_bytes

    def __repr__(self) -> str:
        return f"DocumentCache({self.location or 'memory only'}, memory_budget_bytes={self.memory_budget_bytes})"

    # ----------------------------------------------------------------------------- lookup
    def get_or_compute(
        self,
        key: str,
        compute: Callable[[], E],
        *,
        label: str | None = None,
        spec: CacheSpec | None = None,
    ) -> tuple[E, CacheSource]:
        """The document for ``key`` and where it came from; ``compute()`` runs only on a full miss.

        Threads asking for one key share one lookup: the first loads or computes, the rest wait
        and get the same object (reported as ``memory``). Different keys proceed in parallel.
        ``label`` (default: the one set by ``labelled``) names the entry in ``entries()``.
        ``spec``: the model's cache layout; a stored entry that does not fit it is discarded and
        recomputed (without one, only model-independent checks apply).
        """
        label = label if label is not None else _LABEL.get()
        return self._lookup.get_or_compute(key, compute, label, spec, self.lock_timeout)

    async def aget_or_compute(
        self,
        key: str,
        compute: Callable[[], E],
        *,
        label: str | None = None,
        spec: CacheSpec | None = None,
    ) -> tuple[E, CacheSource]:
        """``get_or_compute`` in a worker thread, so the event loop keeps running."""
        return await asyncio.to_thread(self.get_or_compute, key, compute, label=label, spec=spec)

    def get(self, key: str, *, spec: CacheSpec | None = None) -> Entry | None:
        """The document for ``key`` from memory or the store, or None; never computes (nor discards)."""
        return self._lookup.get(key, spec)

    def __contains__(self, key: str) -> bool:
        return key in self._inventory

    @contextlib.contextmanager
    def labelled(self, label: str | None) -> Iterator[None]:
        """Entries created or used inside this block (in this thread or task) get ``label``."""
        token = _LABEL.set(label)
        try:
            yield
        finally:
            _LABEL.reset(token)

    def set_label(self, key: str, label: str | None) -> bool:
        """Name the entry for ``key`` (in memory and in the store); False when there is no such entry."""
        return self._lookup.relabel(key, label)

    def allocator(self, key: str) -> Allocate | None:
        """Storage for ``key``'s leaf tier (CPU) inside the file that becomes its stored entry, so the
        tier is never held whole in process memory (``StagedTensors``); None without a store. Pass it
        to the build inside ``get_or_compute``'s ``compute``; if the file cannot be made, it returns
        None and the build allocates in memory instead."""
        return self.stored.staged.allocator(key) if self.stored is not None else None

    def leaf_stash(self, spec: CacheSpec | None) -> LeafStashInStore | None:
        """Where a leaf tier's build keeps each leaf as an entry of its own under its content key, so the tier
        is stored as the list of its leaves (``cache.leaf_stash``); None without a store."""
        return LeafStashInStore(self.stored, spec) if self.stored is not None else None

    # ----------------------------------------------------------------------------- housekeeping
    def stats(self) -> CacheStats:
        """Counters and current sizes (store sizes are read from the store now)."""
        return CacheStats(
            **self._counts.snapshot(),
            **self._inventory.sizes(),
            waits=self._lookup.flights.waits,
            memory_budget_bytes=self.memory_budget_bytes,
        )

    def info(self) -> dict[str, Any]:
        """Where the cache lives, its limits and its statistics, as plain JSON-ready values."""
        return {
            "directory": str(self.directory) if self.directory else None,
            "store": self.location,
            "disk_budget_bytes": self.store.budget_bytes if self.store is not None else None,
            "format_version": FORMAT_VERSION,
            "lock_timeout": self.lock_timeout,
            **asdict(self.stats()),
        }

    def entries(self) -> list[CacheEntry]:
        """Every cached document, in memory or in the store, newest first."""
        return self._inventory.entries()

    def discard(self, key: str) -> bool:
        """Forget ``key`` in memory and in the store; True if anything was removed.

        In the store only an entry this cache wrote goes (a homer manifest and its safetensors twin).
        """
        return self._inventory.discard(key)

    def discard_many(self, keys: Iterable[str]) -> tuple[int, int]:
        """Forget every key of ``keys`` as ``discard`` does: (entries removed, leaf entries removed with them,
        those no tier left in the store lists)."""
        return self._inventory.discard_many(keys)

    def orphans(self) -> list[Orphan] | None:
        """The files in a local directory that no entry needs: leaves no stored tier lists (a tier evicted, removed
        or refused over the budget left them) and tensors files with no manifest; None for a URL store or memory
        only. Files a live writer may still claim are not among them (``LocalStore.orphans``)."""
        return self._inventory.orphans()

    def remove_orphans(self) -> list[Orphan] | None:
        """Remove the ``orphans``; those removed (None as for ``orphans``). Entries and the leaves tiers list stay."""
        return self._inventory.remove_orphans()

    def clear(self, *, memory: bool = True, disk: bool = True) -> int:
        """Remove every entry (from memory and/or the store); returns how many distinct keys went.

        In the store only what this cache wrote goes: homer manifests with their safetensors
        twins, its temporary files and its unheld locks; anything else stays.
        """
        return self._inventory.clear(memory=memory, disk=disk)

    def trim(self, budget_bytes: int | None = None) -> int:
        """Evict least recently used stored entries down to ``budget_bytes`` (default: the disk
        budget); how many went. Only a local directory has a budget."""
        return self._inventory.trim(budget_bytes)
