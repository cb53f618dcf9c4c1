"""The ``Store`` interface: where entries live beyond one process, as (manifest, safetensors) bytes per key.

A store moves bytes and names; ``EntryCodec`` (``entry.py``) makes and verifies them. Every store
keeps these promises: ``write`` is atomic per file and writes the tensors before the manifest that
vouches for them (a reader sees no entry, or a whole one, or a mismatch the checksum rejects);
``remove``/``discard``/``clear`` delete only files this cache wrote, never a directory; ``lock``
gives one process at a time a key (see ``flight.py``).

Implementations: ``LocalStore`` (``local.py``, a directory with a byte budget) and ``FsspecStore``
(``fsspec_store.py``, any URL fsspec knows: ``s3://``, ``gs://``, ``file://``, ``memory://``). They import
this module; ``store.py`` (``open_store``, which picks one of them) imports them, so the interface sits
below its implementations and nothing here imports back.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from homer_integrations.cache.entry import MANIFEST_FORMAT, CacheEntry, listed_entry, own_manifest
from homer_integrations.cache.files import OverLimit
from homer_integrations.cache.flight import KeyLock

SAFE_NAME = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}")
KEY_NAME = re.compile(r"(h-)?[0-9a-f]{64}")
"""The name of every entry an engine stores: its sha256 key, or a hashed key (``entry_name``)."""
TENSORS = ".safetensors"
MANIFEST = ".json"
INDEX = ".index"
INDEX_NAME = re.compile(r"[a-z]+-[0-9a-f]{32}")
"""The name of an index file earlier versions kept beside the entries (``leaves-<32 hex>.index``, a record
of the leaves of stored leaf tiers, now found as entries of their own): ``clear`` still removes them."""


HEAD_BYTES = 1 << 16
"""Bytes read of a manifest too large to read whole, to tell whether it is the cache's."""


def entry_name(key: str) -> str:
    """The file name stem of ``key``'s entry; keys that are not safe file names are hashed."""
    return key if SAFE_NAME.fullmatch(key) else "h-" + hashlib.sha256(key.encode()).hexdigest()


def oversized_is_ours(stem: str, head: bytes) -> bool:
    """Whether a manifest too large to read, named ``stem`` and starting with ``head``, is the cache's:
    its name is a key's, or it names the cache's format (anything else named ``*.json`` is left alone)."""
    return bool(SAFE_NAME.fullmatch(stem)) and (
        bool(KEY_NAME.fullmatch(stem)) or f'"{MANIFEST_FORMAT}"'.encode() in head
    )


class EntryTooLarge(OSError):
    """An entry larger than the store's whole byte budget (it is not written)."""


class DiskBudgetError(ValueError):
    """A disk budget that cannot apply: below zero, or for a URL store (object stores have lifecycle rules)."""


class Store(ABC):
    """Entries by key, as bytes. Methods raise ``OSError`` for I/O trouble unless they say otherwise."""

    location: str
    """The directory or URL, for messages and ``info()``."""
    budget_bytes: int | None = None
    """Most bytes of entries the store keeps (least recently used go first); None: no limit."""

    def check_fits(self, size: int) -> None:
        """Raise ``EntryTooLarge`` if an entry of ``size`` bytes exceeds the whole budget: before it is staged
        (a staged copy would hold the directory over its budget, then be refused) and before it commits."""
        if self.budget_bytes is not None and size > self.budget_bytes:
            raise EntryTooLarge(f"the entry's {size:,} bytes exceed the disk budget of {self.budget_bytes:,} bytes")

    @abstractmethod
    def where(self, key: str) -> str:
        """Where ``key``'s tensors file is (for messages)."""

    @abstractmethod
    def read_manifest(self, key: str) -> bytes | None:
        """``key``'s manifest bytes, None when there is none."""

    @abstractmethod
    def manifest_head(self, key: str) -> bytes:
        """The first ``HEAD_BYTES`` of ``key``'s manifest, whatever its size: enough to tell whose it is."""

    @abstractmethod
    def read_tensors(self, key: str) -> bytes:
        """``key``'s safetensors bytes (``FileNotFoundError`` when missing)."""

    @abstractmethod
    def write(self, key: str, manifest: bytes, tensors: bytes | Path) -> None:
        """Store an entry atomically: the tensors first, then the manifest that vouches for them.

        ``tensors``: the bytes, or a file from ``staging_file(key)`` holding them (moved or copied in;
        the caller removes what is left of it)."""

    @abstractmethod
    def write_manifest(self, key: str, manifest: bytes) -> None:
        """Replace ``key``'s manifest atomically (a new label)."""

    @abstractmethod
    def remove(self, key: str) -> bool:
        """Delete the files at ``key``'s entry names (an unusable entry), never a directory; True if any went."""

    @abstractmethod
    def listing(self) -> list[tuple[dict[str, Any], int]]:
        """Every homer manifest stored (any version) with its entry's stored bytes. Never raises.

        A manifest of the cache's that is too large to read comes as ``entry.unusable_manifest``."""

    @abstractmethod
    def clear(self) -> set[str]:
        """Delete every entry this cache wrote, its temporary files and unheld locks; the keys removed."""

    @abstractmethod
    def lock(self, key: str, timeout: float | None) -> KeyLock:
        """A cross-process lock on ``key`` (not yet acquired)."""

    def discard(self, key: str) -> bool:
        """Delete ``key``'s entry if it is one this cache wrote (a homer manifest, or one too large to read that
        ``oversized_is_ours``, as the listing shows it); True if it went."""
        try:
            raw = self.read_manifest(key)
        except OverLimit:
            try:
                ours = oversized_is_ours(entry_name(key), self.manifest_head(key))
            except OSError:
                return False
            return ours and self.remove(key)
        except OSError:
            return False
        if raw is None or own_manifest(raw) is None:
            return False
        return self.remove(key)

    def staging_file(self, key: str) -> Path:
        """A new empty local file to write ``key``'s tensors into before ``write``: entries are
        serialised there tensor by tensor rather than into one more in-memory copy. This default is
        a temporary file of the system's; a local store stages beside its entries so ``write`` renames."""
        fd, name = tempfile.mkstemp(prefix=".homer-", suffix=TENSORS + ".tmp")
        os.close(fd)
        return Path(name)

    def tensors_file(self, key: str) -> Path | None:
        """``key``'s safetensors file as a local path that can be memory-mapped; None when the store
        has no local files (then ``read_tensors`` is the only way in)."""
        return None

    def touch(self, key: str) -> None:  # noqa: B027 - optional: only stores with a budget track use
        """Mark ``key`` as just used (stores with a budget evict the least recently used)."""

    def check(self) -> None:  # noqa: B027 - optional: a store that can be unreachable says so
        """Raise ``OSError`` when the store cannot be used at all (no credentials, no such place),
        before anything is computed for it; an empty or missing store is fine."""

    def entries(self) -> dict[str, CacheEntry]:
        """The stored entries by key, as ``cache ls`` shows them."""
        found: dict[str, CacheEntry] = {}
        for manifest, disk_bytes in self.listing():
            try:
                entry = listed_entry(manifest, disk_bytes)
            except (ValueError, KeyError, TypeError):
                continue  # unreadable fields are dealt with when the key is next looked up
            found[entry.key] = entry
        return found
