"""``StoredEntries``: a ``DocumentCache``'s entries in its ``Store``.

The store side of the cache: verified reads, the locked miss (re-read under the key's lock, compute,
write), atomic writes (a leaf tier built straight into the file that becomes its entry), memory
mapping of a tier just written, and label rewrites. ``DocumentCache`` adds memory and single flight
in front of it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from homer_integrations.cache.entry import (
    CacheSource,
    E,
    Entry,
    EntryCodec,
    Unusable,
    document_nbytes,
    mapped_tier,
    relabelled,
    to_device,
)
from homer_integrations.cache.flight import KeyLock, LockTimeout
from homer_integrations.cache.leaf_stash import LeafStashInStore, stored_by_leaves
from homer_integrations.cache.mapped import MAPPED, FileStamp
from homer_integrations.cache.staged import StagedTensors, StagedTiers
from homer_integrations.cache.store_base import Store
from homer_integrations.homer.kv.compressed import CacheSpec
from homer_integrations.homer.leaves.leaf_entry import LeafEntry
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.leaves.tier_file import whole_tensors

logger = logging.getLogger(__name__)

FULL_DISK = tuple(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)
"""Errors that mean the disk (or the user's quota) is full."""
FULL_DISK_QUIET = 60.0
"""Seconds after a full-disk warning in which the next full-disk write failure is logged, not warned again."""


class DocumentCacheWarning(UserWarning):
    """A stored entry was unusable (and removed), or could not be written."""


class StoredEntries:
    """Entries of one ``store``, loaded onto ``device`` (None: where they were computed, if it exists here).

    ``count(name)`` is told of each ``hits_disk`` and ``discarded`` event. ``secret``: a keyed cache's
    (``cache.secret``): every entry written carries its keyed checksum, and an entry read without a
    matching one is unusable.
    """

    def __init__(
        self, store: Store, device: torch.device | None, count: Callable[..., None], secret: bytes | None = None
    ) -> None:
        self.store = store
        self.device = device
        self._count = count
        self._secret = secret
        self.staged = StagedTiers(store)  # leaf tiers being built into their entries' files
        self._full_since: float | None = None  # when a write last found the disk full (one warning says so)

    def read(self, key: str, spec: CacheSpec | None = None) -> tuple[Entry, dict[str, Any]] | None:
        """Load and verify ``key``'s stored entry: None if absent; raises ``Unusable`` if it cannot be trusted."""
        store = self.store
        try:
            raw = store.read_manifest(key)
        except OSError as exc:
            raise Unusable(f"cannot read the manifest: {exc}") from exc
        if raw is None:
            return None
        doc, manifest = EntryCodec.decode(
            key,
            raw,
            lambda: store.read_tensors(key),
            spec,
            store.tensors_file(key),
            self._secret,
            LeafStashInStore(self, spec).read,
        )
        return to_device(doc, manifest.get("device"), self.device), manifest

    def load_or_compute(
        self,
        key: str,
        compute: Callable[[], E],
        label: str | None,
        spec: CacheSpec | None,
        lock_timeout: float | None,
    ) -> tuple[E, CacheSource]:
        """``key``'s stored entry, or ``compute()`` under the key's lock and write it (a miss).

        Anything unusable is removed and recomputed with a warning; a store that cannot be locked
        (or a lock held past ``lock_timeout``) leaves the document computed and kept in memory only.
        """
        with contextlib.suppress(Unusable):  # anything odd is re-examined under the lock
            loaded = self.read(key, spec)
            if loaded is not None:
                return self._loaded(key, loaded, label), "disk"
        lock: KeyLock | None = None
        try:
            lock = self.store.lock(key, lock_timeout)  # a store may fail here already (its lock folder)
            lock.acquire()
        except LockTimeout:
            warnings.warn(
                f"another process has held the cache lock for {key[:12]} over {lock_timeout}s; compressing without it",
                DocumentCacheWarning,
                stacklevel=5,
            )
            lock = None
        except OSError as exc:
            warnings.warn(
                f"cannot use the document cache directory {self.store.location}: {exc}; "
                f"keeping documents in memory only",
                DocumentCacheWarning,
                stacklevel=5,
            )
            try:
                return compute(), "computed"
            finally:
                self.staged.drop(key)  # a tier built in a staged file stays readable through its mapping
        try:
            try:
                loaded = self.read(key, spec)
            except Unusable as exc:
                self._count("discarded")
                warnings.warn(
                    f"discarding unusable document cache entry {self.store.where(key)}: {exc}; recomputing",
                    DocumentCacheWarning,
                    stacklevel=5,
                )
                self.store.remove(key)
                loaded = None
            if loaded is not None:  # written by another process while we waited for the lock
                return self._loaded(key, loaded, label, locked=True), "disk"
            doc = compute()
            staged = self.staged.get(key)
            built_in = staged is not None and isinstance(doc, LeafTier) and staged.backs(doc.prefix_hidden)
            in_place = staged if built_in else None
            by_leaves = in_place is None and stored_by_leaves(self.store, doc)
            if self.write(key, doc, label, in_place, by_leaves=by_leaves) and isinstance(doc, LeafTier):
                # a tier built in its staged file already lives in the stored file (renamed, same pages); one
                # stored by its leaves holds the pieces its build found or kept in the store, mapped
                kept = in_place is not None or by_leaves
                if in_place is not None:  # its pages are the stored file's now: noted as a mapping of it
                    self._note_mapped(key)
                doc = replace(doc, mapped=True) if kept else self._remapped(key, doc)  # type: ignore[assignment]
            return doc, "computed"
        finally:
            self.staged.drop(key)
            if lock is not None:
                lock.release()

    def _loaded(self, key: str, loaded: tuple[E, dict[str, Any]], label: str | None, *, locked: bool = False) -> E:
        """A store hit: counted, marked used, relabelled if ``label`` is new."""
        doc, manifest = loaded
        self._count("hits_disk")
        self.store.touch(key)
        if label is not None and manifest.get("label") != label:
            self.write_label(key, label, locked=locked)
        return doc

    def mapped_files(self, key: str, doc: Entry) -> tuple[FileStamp, ...]:
        """The files ``doc`` (``key``'s entry) is memory-mapped from, as they were when mapped: a mapped entry's
        own file, and the leaves of a tier stored by its leaves (mapped as its build kept or found them); what
        ``Lookup`` checks before it uses ``doc`` again. Empty for an entry held in process or device memory."""
        if not isinstance(doc, LeafTier | LeafEntry) or doc.device.type != "cpu":  # a copy on a GPU maps nothing
            return ()
        keys = [key] if doc.mapped else []
        if isinstance(doc, LeafTier):
            keys += doc.leaf_keys or ()
        return MAPPED.stamps(self.store.where(k) for k in keys)

    def _note_mapped(self, key: str) -> None:
        """Note ``key``'s tensors file as this process maps it now (a tier built in its staged file, renamed in)."""
        path = self.store.tensors_file(key)
        if path is not None:
            with contextlib.suppress(OSError):
                MAPPED.note(FileStamp.of(path))

    def _remapped(self, key: str, tier: LeafTier) -> LeafTier:
        """The leaf tier just written (under ``key``'s lock), memory-mapped from its file so the built
        copy can be freed; ``tier`` itself when the store has no local file or the mapping fails.
        Not re-verified by checksum: this process wrote the file a moment ago."""
        path = self.store.tensors_file(key)
        if path is None or tier.device.type != "cpu":
            return tier
        try:
            return mapped_tier(path, LeafStashInStore(self, None).read)
        except (Unusable, SafetensorError, ValueError, KeyError, OSError) as exc:
            logger.warning("could not map the leaf tier just written for %s: %s", key[:12], exc)
            return tier

    # ----------------------------------------------------------------------------- writes
    def write(
        self,
        key: str,
        doc: Entry,
        label: str | None,
        in_place: StagedTensors | None = None,
        *,
        by_leaves: bool | None = None,
    ) -> bool:
        """Store ``doc``'s entry (atomically); on failure warn, keep it in memory only and return False.

        The tensors are serialised into a staged file (no second copy in memory), or, for a leaf tier
        built in its staged file (``in_place``, see ``StagedTiers.allocator``), that file only gets its header
        (whatever is left of it is ``StagedTiers.drop``'s). ``by_leaves``: whether a leaf tier is stored by its
        leaves (``leaf_stash.stored_by_leaves``; None: found out here)."""
        staged: Path | None = None
        try:
            if by_leaves is None:
                by_leaves = stored_by_leaves(self.store, doc)
            if in_place is None and not by_leaves:  # its size is known from its tensors: refused before staging
                self.store.check_fits(document_nbytes(doc))
            if in_place is not None:
                manifest, tensors = EntryCodec.encode(
                    key, doc, label, into=in_place.finish(whole_tensors(doc)[1]), written=True, secret=self._secret
                )
            else:
                staged = self.store.staging_file(key)
                manifest, tensors = EntryCodec.encode(
                    key, doc, label, into=staged, secret=self._secret, by_leaves=by_leaves
                )
            self.store.write(key, manifest, tensors)
            return True
        except (OSError, SafetensorError, ValueError) as exc:
            why = _why(exc)
            full = why.startswith("the disk is full")
            if full and self._full_since is not None and time.monotonic() - self._full_since < FULL_DISK_QUIET:
                # the same full disk again (a content-split tier's whole write after its leaf's): said once
                logger.debug("could not write %s either: %s", self.store.where(key), why)
            else:
                warnings.warn(
                    f"could not write the document cache entry {self.store.where(key)}: {why}; "
                    f"keeping it in memory only",
                    DocumentCacheWarning,
                    stacklevel=6,
                )
            self._full_since = time.monotonic() if full else None
            self.store.remove(key)
            return False
        finally:
            if staged is not None:  # renamed into place, or left over from a failed write
                with contextlib.suppress(OSError):
                    staged.unlink(missing_ok=True)

    def write_label(self, key: str, label: str | None, *, locked: bool = False) -> bool:
        """Rewrite the label in ``key``'s stored manifest (best effort); False when there is none.

        ``locked``: the caller already holds ``key``'s lock.
        """
        lock = None if locked else self.store.lock(key, 1.0)
        try:
            if lock is not None:
                lock.acquire()
            try:
                raw = self.store.read_manifest(key)
                manifest = relabelled(raw, key, label) if raw is not None else None
                if manifest is None:
                    return False
                self.store.write_manifest(key, manifest)
                return True
            finally:
                if lock is not None:
                    lock.release()
        except (OSError, ValueError, LockTimeout):
            return False


def _why(exc: Exception) -> str:
    """Why a write failed, in words: a full disk says so first (an ``OSError``'s errno, or safetensors'
    ``I/O error: ... (os error 28)``), as a failure to write does not otherwise name its cause."""
    text = str(exc)
    code = exc.errno if isinstance(exc, OSError) else None
    if code in FULL_DISK or any(f"(os error {c})" in text for c in FULL_DISK):
        return f"the disk is full ({text})"
    return text
