"""The document cache: one compression per document, kept in memory and optionally on disk.

Interface every caller relies on:
- ``DocumentCache.get_or_compute(key, compute) -> (entry, source)`` with source in
  ``memory`` / ``disk`` / ``computed``; concurrent callers with one key cause one ``compute()``.
- ``DocumentCache.stats() -> CacheStats`` (``computations`` counts calls to ``compute``).

Memory: an LRU of documents bounded by bytes. Disk (opt-in): per key a safetensors file and a
JSON manifest holding a format version, the key and a sha256 over the key and the file (so an entry
copied under another key fails it); both written atomically (temporary file + ``os.replace``).
Anything unusable on disk (truncated, corrupted, tampered, foreign, an old format version, another
key's file, or, given the model's ``CacheSpec``, tensors of the wrong shape, NaN/inf values or
impossible positions) is removed and recomputed with a ``DocumentCacheWarning``; a directory in an
entry's place is reported, never removed. ``clear``/``discard`` remove only files this cache wrote
(homer manifests and their safetensors twins, its temporary and lock files). A per-key file lock
stops two processes from compressing one document at once: the second waits, then loads the first
one's file. Nothing is ever pickled.

Labels: ``cache ls`` shows a human label per entry (e.g. the source file name). Pass
``label=`` to ``get_or_compute``, call ``set_label(key, label)``, or wrap calls that reach the
cache through the engine in ``with cache.labelled("book.txt"): ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import re
import struct
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from homer_integrations.homer.compressed import CacheSpec, CompressedDocument, check_consistent, validate
from homer_integrations.homer.leaf_tier import SERIAL_FORMAT as LEAF_TIER_FORMAT
from homer_integrations.homer.leaf_tier import LeafTier

logger = logging.getLogger(__name__)

CacheSource = Literal["memory", "disk", "computed"]
Entry = CompressedDocument | LeafTier
"""What the cache holds: a document's compressed root cache, or its leaf tier (``homer.leaf_tier``)."""
_KINDS = {CompressedDocument: "root", LeafTier: "leaf_tier"}
E = TypeVar("E", CompressedDocument, LeafTier)

DEFAULT_MEMORY_BUDGET = 2 * 1024**3
MANIFEST_FORMAT = "homer-document-cache-entry"
FORMAT_VERSION = 2
"""Version of the on-disk entry (manifest + safetensors layout); other versions are discarded.
2: the manifest's sha256 covers the key as well as the tensors file (``entry_checksum``)."""

_TENSORS = ".safetensors"
_MANIFEST = ".json"
_SAFE_NAME = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}")
_TEMP_NAME = re.compile(r"\.[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}\.(json|safetensors)\.\d+\.[0-9a-f]{8}\.tmp")
_MAX_MANIFEST_BYTES = 1 << 20
_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("homer_document_label", default=None)


class DocumentCacheWarning(UserWarning):
    """A cache file on disk was unusable (and removed), or could not be written."""


class _Unusable(Exception):
    """An entry on disk exists but cannot be trusted; the message says why."""


@dataclass(frozen=True)
class CacheStats:
    """Counters since this cache object was created, and what it holds now.

    ``hits_memory`` includes callers that waited for another caller's compression of the same
    key; ``misses`` are lookups found neither in memory nor on disk; ``computations`` counts
    calls to ``compute``; ``discarded`` counts unusable disk entries removed.
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


@dataclass(frozen=True)
class CacheEntry:
    """One cached entry as ``cache ls`` shows it. ``created`` is a Unix time; ``kind`` is ``root``
    (a compressed cache) or ``leaf_tier`` (what a question replays from)."""

    key: str
    nbytes: int
    tokens: int
    document_tokens: int
    created: float
    label: str | None
    in_memory: bool
    on_disk: bool
    disk_bytes: int = 0
    kind: str = "root"


@dataclass
class _Slot:
    doc: Entry
    nbytes: int
    created: float
    label: str | None
    unverified: bool = False  # read from disk without a CacheSpec: checked again when one is given


@dataclass
class _Flight:
    """One in-progress lookup of a key; other callers wait on ``done``."""

    done: threading.Event = field(default_factory=threading.Event)
    doc: Entry | None = None
    error: BaseException | None = None


def document_nbytes(doc: Entry) -> int:
    """Bytes an entry's tensors occupy (K/V, positions, origins, logits; a leaf tier's all)."""
    if isinstance(doc, LeafTier):
        return doc.nbytes
    extra = [doc.position_ids, doc.origin]
    if doc.next_token_logits is not None:
        extra.append(doc.next_token_logits)
    return doc.nbytes + sum(t.numel() * t.element_size() for t in extra)


def entry_checksum(key: str, data: bytes) -> str:
    """The manifest's sha256: over ``key``, a NUL byte and the safetensors bytes, binding the file to its key."""
    h = hashlib.sha256(key.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(data)
    return h.hexdigest()


class DocumentCache:
    """Compressed documents by key: an in-memory LRU bounded by bytes over an optional disk store.

    Args:
        directory: None/False for memory only; True for the default location
            (``cache_root() / "documents"``, i.e. ``$HOMER_INTEGRATIONS_CACHE`` or the platform
            cache dir); or a path.
        memory_budget_bytes: most bytes of documents kept in memory (least recently used go
            first); 0 keeps nothing in memory. A document larger than the budget is returned but
            not kept.
        lock_timeout: seconds to wait for another process compressing the same document before
            compressing anyway (with a warning); None waits as long as it takes.
        device: where documents loaded from disk go; None = the device they were computed on when
            it exists here, else the CPU.
    """

    def __init__(
        self,
        directory: str | Path | bool | None = None,
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        lock_timeout: float | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
        if directory is True:
            from homer_integrations.paths import cache_root

            directory = cache_root() / "documents"
        self.directory: Path | None = Path(directory).expanduser() if directory else None
        self.memory_budget_bytes = memory_budget_bytes
        self.lock_timeout = lock_timeout
        self.device = torch.device(device) if device is not None else None
        self._lock = threading.Lock()  # guards the fields below, never held during compute or I/O
        self._memory: OrderedDict[str, _Slot] = OrderedDict()
        self._memory_bytes = 0
        self._flights: dict[str, _Flight] = {}
        self._counts = dict.fromkeys(
            ("hits_memory", "hits_disk", "misses", "computations", "evictions", "discarded", "waits"), 0
        )

    def __repr__(self) -> str:
        where = str(self.directory) if self.directory else "memory only"
        return f"DocumentCache({where}, memory_budget_bytes={self.memory_budget_bytes})"

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
        ``spec``: the model's cache layout; a disk entry that does not fit it is discarded and
        recomputed (without one, only model-independent checks apply).
        """
        label = label if label is not None else _LABEL.get()
        with self._lock:
            slot = self._memory.get(key)
            if slot is not None and spec is not None and slot.unverified:
                self._forget(key)  # read from disk without a spec: read again, checked this time
                slot = None
            if slot is not None:
                self._memory.move_to_end(key)
                self._counts["hits_memory"] += 1
                relabel = label is not None and slot.label != label
                if relabel:
                    slot.label = label
            else:
                flight = self._flights.get(key)
                leader = flight is None
                if flight is None:
                    flight = self._flights[key] = _Flight()
                else:
                    self._counts["waits"] += 1
        if slot is not None:
            if relabel:
                self._write_label(key, label)
            return slot.doc, "memory"
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.doc is not None
            self._count("hits_memory")
            return flight.doc, "memory"
        try:
            doc, source = self._load_or_compute(key, compute, label, spec)
        except BaseException as exc:
            with self._lock:
                del self._flights[key]
            flight.error = exc
            flight.done.set()
            raise
        with self._lock:
            self._remember(key, doc, label, unverified=source == "disk" and spec is None)
            del self._flights[key]
        flight.doc = doc
        flight.done.set()
        return doc, source

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
        """The document for ``key`` from memory or disk, or None; never computes (nor discards)."""
        with self._lock:
            slot = self._memory.get(key)
            if slot is not None and not (spec is not None and slot.unverified):
                self._memory.move_to_end(key)
                return slot.doc
        if self.directory is None:
            return None
        try:
            loaded = self._read(key, spec)
        except _Unusable:
            return None
        if loaded is None:
            return None
        doc, manifest = loaded
        with self._lock:
            self._remember(key, doc, manifest.get("label"), unverified=spec is None)
        return doc

    def __contains__(self, key: str) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        return self.directory is not None and self._paths(key)[1].is_file()

    @contextlib.contextmanager
    def labelled(self, label: str | None) -> Iterator[None]:
        """Entries created or used inside this block (in this thread or task) get ``label``."""
        token = _LABEL.set(label)
        try:
            yield
        finally:
            _LABEL.reset(token)

    def set_label(self, key: str, label: str | None) -> bool:
        """Name the entry for ``key`` (in memory and on disk); False when there is no such entry."""
        with self._lock:
            slot = self._memory.get(key)
            if slot is not None:
                slot.label = label
        on_disk = self._write_label(key, label)
        return slot is not None or on_disk

    # ----------------------------------------------------------------------------- housekeeping
    def stats(self) -> CacheStats:
        """Counters and current sizes (disk sizes are read from the directory now)."""
        on_disk = self._disk_entries()
        disk_bytes, disk_entries = sum(e.disk_bytes for e in on_disk.values()), len(on_disk)
        with self._lock:
            return CacheStats(
                **self._counts,
                memory_bytes=self._memory_bytes,
                disk_bytes=disk_bytes,
                entries=len(self._memory),
                disk_entries=disk_entries,
                memory_budget_bytes=self.memory_budget_bytes,
            )

    def info(self) -> dict[str, Any]:
        """Where the cache lives, its limits and its statistics, as plain JSON-ready values."""
        return {
            "directory": str(self.directory) if self.directory else None,
            "format_version": FORMAT_VERSION,
            "lock_timeout": self.lock_timeout,
            **asdict(self.stats()),
        }

    def entries(self) -> list[CacheEntry]:
        """Every cached document, in memory or on disk, newest first."""
        found = self._disk_entries()
        with self._lock:
            slots = list(self._memory.items())
        for key, slot in slots:
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
                kind=_KINDS[type(slot.doc)],
            )
        return sorted(found.values(), key=lambda e: e.created, reverse=True)

    def discard(self, key: str) -> bool:
        """Forget ``key`` in memory and on disk; True if anything was removed.

        On disk only an entry this cache wrote goes (a homer manifest and its safetensors twin).
        """
        with self._lock:
            slot = self._forget(key)
        removed = slot is not None
        if self.directory is not None:
            manifest_path = self._paths(key)[1]
            if _own_manifest(manifest_path) is not None:
                removed = _remove_entry_files(manifest_path) or removed
        return removed

    def clear(self, *, memory: bool = True, disk: bool = True) -> int:
        """Remove every entry (from memory and/or disk); returns how many distinct keys went.

        On disk only what this cache wrote goes: homer manifests with their safetensors twins,
        its temporary files and its unheld lock files; anything else in the directory stays.
        """
        keys: set[str] = set()
        if memory:
            with self._lock:
                keys.update(self._memory)
                self._memory.clear()
                self._memory_bytes = 0
        if disk and self.directory is not None and self.directory.is_dir():
            for path, manifest in self._own_manifests():
                keys.add(manifest["key"])
                _remove_entry_files(path)
            self._remove_leftovers()
        return len(keys)

    # ----------------------------------------------------------------------------- memory
    def _forget(self, key: str) -> _Slot | None:
        """Drop ``key`` from memory (caller holds ``_lock``); its slot, if it had one."""
        slot = self._memory.pop(key, None)
        if slot is not None:
            self._memory_bytes -= slot.nbytes
        return slot

    def _remember(self, key: str, doc: Entry, label: str | None, *, unverified: bool = False) -> None:
        """Insert ``doc`` as most recently used, evicting the least recently used over budget."""
        old = self._memory.pop(key, None)
        if old is not None:
            self._memory_bytes -= old.nbytes
            label = label if label is not None else old.label
        nbytes = document_nbytes(doc)
        if nbytes > self.memory_budget_bytes:
            logger.info("document %s (%d bytes) exceeds the memory budget; not kept in memory", key[:12], nbytes)
            return
        while self._memory and self._memory_bytes + nbytes > self.memory_budget_bytes:
            _, evicted = self._memory.popitem(last=False)
            self._memory_bytes -= evicted.nbytes
            self._counts["evictions"] += 1
        self._memory[key] = _Slot(doc, nbytes, old.created if old else time.time(), label, unverified)
        self._memory_bytes += nbytes

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # ----------------------------------------------------------------------------- disk
    def _load_or_compute(
        self, key: str, compute: Callable[[], E], label: str | None, spec: CacheSpec | None
    ) -> tuple[E, CacheSource]:
        if self.directory is None:
            return self._compute(key, compute), "computed"
        with contextlib.suppress(_Unusable):  # anything odd is re-examined under the lock
            loaded = self._read(key, spec)
            if loaded is not None:
                self._count("hits_disk")
                return self._loaded(key, loaded, label), "disk"
        lock: FileLock | None = None
        try:
            lock = FileLock(self._lock_path(key), timeout=-1 if self.lock_timeout is None else self.lock_timeout)
            lock.acquire()
        except Timeout:
            warnings.warn(
                f"another process has held the cache lock for {key[:12]} over {self.lock_timeout}s; "
                f"compressing without it",
                DocumentCacheWarning,
                stacklevel=4,
            )
            lock = None
        except OSError as exc:
            warnings.warn(
                f"cannot use the document cache directory {self.directory}: {exc}; keeping documents in memory only",
                DocumentCacheWarning,
                stacklevel=4,
            )
            return self._compute(key, compute), "computed"
        try:
            try:
                loaded = self._read(key, spec)
            except _Unusable as exc:
                self._count("discarded")
                warnings.warn(
                    f"discarding unusable document cache entry {self._paths(key)[0]}: {exc}; recomputing",
                    DocumentCacheWarning,
                    stacklevel=4,
                )
                self._remove_files(key)
                loaded = None
            if loaded is not None:  # written by another process while we waited for the lock
                self._count("hits_disk")
                return self._loaded(key, loaded, label, locked=True), "disk"
            doc = self._compute(key, compute)
            self._write(key, doc, label)
            return doc, "computed"
        finally:
            if lock is not None:
                lock.release()

    def _compute(self, key: str, compute: Callable[[], Entry]) -> Entry:
        with self._lock:
            self._counts["misses"] += 1
            self._counts["computations"] += 1
        doc = compute()
        if not isinstance(doc, CompressedDocument | LeafTier):
            raise TypeError(f"compute() returned {type(doc).__name__}, not a CompressedDocument or LeafTier")
        if doc.key != key:
            logger.debug("compute() returned a document keyed %s; storing it under %s", doc.key[:12], key[:12])
            doc = replace(doc, key=key)
        return doc

    def _loaded(
        self, key: str, loaded: tuple[Entry, dict[str, Any]], label: str | None, *, locked: bool = False
    ) -> Entry:
        doc, manifest = loaded
        if label is not None and manifest.get("label") != label:
            self._write_label(key, label, locked=locked)
        return doc

    def _paths(self, key: str) -> tuple[Path, Path]:
        """(safetensors, manifest) paths of ``key``; keys that are not safe file names are hashed."""
        assert self.directory is not None
        name = key if _SAFE_NAME.fullmatch(key) else "h-" + hashlib.sha256(key.encode()).hexdigest()
        return self.directory / f"{name}{_TENSORS}", self.directory / f"{name}{_MANIFEST}"

    def _lock_path(self, key: str) -> Path:
        assert self.directory is not None
        locks = self.directory / "locks"  # created here: the first use of a new directory
        locks.mkdir(parents=True, exist_ok=True)
        return locks / (self._paths(key)[0].stem + ".lock")

    def _own_manifests(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every ``*.json`` in the directory that is a homer cache manifest (any version), with its content."""
        if self.directory is None:
            return []
        try:
            paths = sorted(self.directory.iterdir())
        except OSError:
            return []
        found = []
        for path in paths:
            if path.suffix == _MANIFEST and not path.name.startswith("."):
                manifest = _own_manifest(path)
                if manifest is not None:
                    found.append((path, manifest))
        return found

    def _disk_entries(self) -> dict[str, CacheEntry]:
        """The entries on disk by key, as ``entries()`` and ``stats()`` count them."""
        found: dict[str, CacheEntry] = {}
        for path, manifest in self._own_manifests():
            try:
                entry = _entry_from_manifest(path, manifest)
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable fields are dealt with when the key is next looked up
            found[entry.key] = entry
        return found

    def _remove_leftovers(self) -> None:
        """Remove this cache's temporary files and the lock files no process holds."""
        assert self.directory is not None
        with contextlib.suppress(OSError):
            for path in self.directory.iterdir():
                if _TEMP_NAME.fullmatch(path.name):
                    _unlink_file(path)
        locks = self.directory / "locks"
        if not locks.is_dir() or locks.is_symlink():
            return
        with contextlib.suppress(OSError):
            for path in locks.iterdir():
                if path.suffix == ".lock" and _SAFE_NAME.fullmatch(path.stem):
                    _remove_unheld_lock(path)

    def _read(self, key: str, spec: CacheSpec | None = None) -> tuple[Entry, dict[str, Any]] | None:
        """Load and verify ``key``'s entry: None if absent; raises ``_Unusable`` if it cannot be trusted.

        With ``spec`` the document must also fit the model (``validate``); without one the
        model-independent checks apply (``check_consistent``).
        """
        tensors_path, manifest_path = self._paths(key)
        try:
            raw_manifest = manifest_path.read_bytes()
        except FileNotFoundError:
            return None  # a safetensors file alone is an unfinished write: the writer adds the manifest
        except OSError as exc:
            raise _Unusable(f"cannot read the manifest: {exc}") from exc
        try:
            manifest = json.loads(raw_manifest)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Unusable(f"the manifest is not JSON ({exc})") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise _Unusable("the manifest is not a homer document cache manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise _Unusable(f"format version {manifest.get('version')!r}, this version reads {FORMAT_VERSION}")
        if manifest.get("key") != key:
            raise _Unusable("the manifest belongs to another document")
        try:
            data = tensors_path.read_bytes()
        except FileNotFoundError as exc:
            raise _Unusable("the safetensors file is missing") from exc
        except OSError as exc:
            raise _Unusable(f"cannot read the safetensors file: {exc}") from exc
        size = manifest.get("size")
        if type(size) is not int:
            raise _Unusable(f"the manifest's size {size!r} ({type(size).__name__}) is not a whole number of bytes")
        if len(data) != size:
            raise _Unusable(f"the safetensors file has {len(data)} bytes, the manifest says {size}")
        if entry_checksum(key, data) != manifest.get("sha256"):
            raise _Unusable("the safetensors file fails its sha256 checksum (for this key)")
        try:
            metadata = _safetensors_metadata(data)
            doc = entry_from_tensors(load_safetensors(data), metadata)
        except (SafetensorError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise _Unusable(f"the safetensors file does not hold a compressed document ({exc})") from exc
        if doc.key != key:
            raise _Unusable("the safetensors file holds another document")
        try:
            if isinstance(doc, LeafTier):
                doc.check() if spec is None else doc.validate(spec)
            elif spec is None:
                check_consistent(doc)
            else:
                validate(doc, spec)
        except ValueError as exc:
            raise _Unusable(f"the stored document fails validation: {exc}") from exc
        return self._to_device(doc, manifest.get("device")), manifest

    def _to_device(self, doc: Entry, stored: str | None) -> Entry:
        device = self.device
        if device is None and stored:
            with contextlib.suppress(RuntimeError, AssertionError, ValueError):
                candidate = torch.device(stored)
                cuda_ok = torch.cuda.is_available() and (candidate.index or 0) < torch.cuda.device_count()
                if candidate.type == "cpu" or (candidate.type == "cuda" and cuda_ok):
                    device = candidate
        if device is None or device.type == "cpu":
            return doc
        return doc.to(device)

    def _write(self, key: str, doc: Entry, label: str | None) -> None:
        """Write ``doc``'s entry atomically (tensors first, then the manifest that vouches for them)."""
        tensors_path, manifest_path = self._paths(key)
        try:
            tensors, metadata = doc.to_tensors()
            data = save_safetensors({k: t.detach().cpu().contiguous() for k, t in tensors.items()}, metadata)
            manifest = {
                "format": MANIFEST_FORMAT,
                "version": FORMAT_VERSION,
                "key": key,
                "sha256": entry_checksum(key, data),
                "size": len(data),
                "created": time.time(),
                "label": label,
                "tokens": doc.num_tokens,
                "document_tokens": doc.document_tokens,
                "kind": _KINDS[type(doc)],
                "nbytes": document_nbytes(doc),
                "dtype": str(doc.keys[0].dtype).removeprefix("torch."),
                "device": str(doc.keys[0].device),
                "compress_seconds": doc.stats.seconds if isinstance(doc, CompressedDocument) else doc.seconds,
            }
            _atomic_write(tensors_path, data)
            _atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
        except (OSError, SafetensorError, ValueError) as exc:
            warnings.warn(
                f"could not write the document cache entry {tensors_path}: {exc}; keeping it in memory only",
                DocumentCacheWarning,
                stacklevel=5,
            )
            self._remove_files(key)

    def _write_label(self, key: str, label: str | None, *, locked: bool = False) -> bool:
        """Rewrite the label in ``key``'s manifest (best effort); False when there is none.

        ``locked``: the caller already holds ``key``'s file lock.
        """
        if self.directory is None:
            return False
        manifest_path = self._paths(key)[1]
        try:
            with contextlib.nullcontext() if locked else FileLock(self._lock_path(key), timeout=1.0):
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
                if not isinstance(manifest, dict) or manifest.get("key") != key:
                    return False
                manifest["label"] = label
                _atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
                return True
        except (OSError, ValueError, Timeout):
            return False

    def _remove_files(self, key: str) -> bool:
        """Remove the files at ``key``'s entry paths (an unusable entry); never a directory."""
        return _remove_entry_files(self._paths(key)[1])


def _unlink_file(path: Path) -> bool:
    """Remove ``path`` if it is a file or a link, never a directory; True if it went. Never raises."""
    try:
        if path.is_dir() and not path.is_symlink():
            return False
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("cannot remove document cache file %s: %s", path, exc)
        return False


def _remove_entry_files(manifest_path: Path) -> bool:
    """Remove an entry's manifest, then its safetensors twin (readers then never see a manifest alone)."""
    removed = _unlink_file(manifest_path)
    return _unlink_file(manifest_path.with_suffix(_TENSORS)) or removed


def _remove_unheld_lock(path: Path) -> None:
    """Remove a lock file unless a thread or process holds it now."""
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except (Timeout, OSError):
        return
    try:
        _unlink_file(path)
    finally:
        lock.release()


def _own_manifest(path: Path) -> dict[str, Any] | None:
    """The content of ``path`` if it is a homer document cache manifest (any version, a string key), else None."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_MANIFEST_BYTES:
            return None
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    return manifest if isinstance(manifest.get("key"), str) else None


def _entry_from_manifest(path: Path, manifest: dict[str, Any]) -> CacheEntry:
    """The ``CacheEntry`` a manifest describes; raises ``OSError``/``ValueError``/``KeyError``/``TypeError``."""
    tensors = path.with_suffix(_TENSORS)
    return CacheEntry(
        key=manifest["key"],
        nbytes=int(manifest["nbytes"]),
        tokens=int(manifest["tokens"]),
        document_tokens=int(manifest["document_tokens"]),
        created=float(manifest["created"]),
        label=manifest.get("label"),
        in_memory=False,
        on_disk=True,
        disk_bytes=path.stat().st_size + (tensors.stat().st_size if tensors.is_file() else 0),
        kind=str(manifest.get("kind", "root")),
    )


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length, JSON header)."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise ValueError("safetensors header runs past the end of the file")
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise ValueError("no metadata in the safetensors header")
    return {str(k): str(v) for k, v in metadata.items()}


def entry_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> Entry:
    """A leaf tier or a compressed document, by the format its metadata names."""
    if meta.get("format") == LEAF_TIER_FORMAT:
        return LeafTier.from_tensors(tensors, meta)
    return document_from_tensors(tensors, meta)


def document_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> CompressedDocument:
    """``CompressedDocument.from_tensors``, then the stricter checks a file read from disk gets.

    On top of what ``from_tensors`` checks (format, version, fields, one cache length): at least
    one layer, no stray tensors, per layer K/V of one shape ``[1, Hkv, K, d]``, 1-D positions and
    origins of length K, logits 1-D, the question text or None.
    Raises ``ValueError`` on anything foreign, old or inconsistent.
    """
    try:
        doc = CompressedDocument.from_tensors(tensors, meta)
    except IndexError as exc:  # a key/value tensor with fewer than two dimensions
        raise ValueError(f"key/value tensors are not all [heads, tokens, head_dim]: {exc}") from exc
    layers = len(doc.keys)
    expected = {f"k.{i}" for i in range(layers)} | {f"v.{i}" for i in range(layers)} | {"position_ids", "origin"}
    if doc.next_token_logits is not None:
        expected.add("next_token_logits")
    if layers < 1 or set(tensors) != expected:
        raise ValueError(f"unexpected tensors {sorted(set(tensors) ^ expected)[:4]} for {layers} layers")
    kv = doc.keys + doc.values
    if any(t.dim() != 4 for t in kv) or len({t.shape for t in kv}) != 1:
        raise ValueError("key/value tensors are not all [heads, tokens, head_dim] of one shape")
    tokens = doc.num_tokens
    if doc.position_ids.shape != (tokens,) or doc.origin.shape != (tokens,):
        raise ValueError(
            f"inconsistent cache lengths: {tokens} cached tokens, "
            f"{tuple(doc.position_ids.shape)} positions, {tuple(doc.origin.shape)} origins"
        )
    if doc.next_token_logits is not None and doc.next_token_logits.dim() != 1:
        raise ValueError("next-token logits are not one vector")
    if doc.question is not None and not isinstance(doc.question, str):
        raise ValueError("the stored question is not text")
    return doc
