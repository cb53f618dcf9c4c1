"""``LocalStore``: entries as files in one directory, optionally within a byte budget (LRU eviction).

Per key ``<name>.safetensors`` and ``<name>.json``; ``locks/<name>.lock`` are the per-key file
locks (``clear`` also removes the ``<name>.index`` files earlier versions kept). Each file is
written to a temporary name beside it (fsync'd) and renamed into place.
With a budget, a writer holds ``locks/.budget.lock`` while it evicts the least recently used
entries (by the manifest's modification time, which every read refreshes) to make room and then
renames its files in, so the entries never exceed the budget, however many processes write.
An entry larger than the whole budget is not written (``EntryTooLarge``). A reader that loses an
entry to eviction between its manifest and its tensors sees a missing file, which the cache
treats as unusable (recomputed, never served half).

Only regular files are read, and manifests only up to ``MAX_MANIFEST_BYTES`` (``files``): a FIFO,
a link or a device at an entry's name is unusable, never opened for reading, and the lock directory
must be a directory of its own, not a link. A manifest over the limit that is the cache's (its name
is a key's, or it names the cache's format near its start) is listed as an unusable entry, so
``cache ls`` shows it and ``clear`` removes it.

Orphans (``orphans``) are files no entry needs: a leaf entry that no stored tier lists (its tier was
evicted, removed or refused over the budget), and a tensors file of the cache's with no manifest (its
writer died between the two renames, or the manifest was removed). A file a live writer may still claim
is no orphan: one whose own key's lock is held, and any changed since the oldest held key lock was
taken (``FileKeyLock`` stamps the lock file when it takes it; a tier's build holds its key's lock while
it writes its leaves, and lists them only when it writes the tier). ``remove_orphans`` removes them;
the budget counts them and evicts them before any entry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from homer_integrations.cache.entry import MAX_MANIFEST_BYTES, own_manifest, own_tensors, unusable_manifest
from homer_integrations.cache.files import OverLimit, own_directory, read_regular, regular_size, regular_stat
from homer_integrations.cache.flight import FileKeyLock, KeyLock, lock_held, remove_unheld_lock
from homer_integrations.cache.store_base import (
    HEAD_BYTES,
    INDEX,
    INDEX_NAME,
    KEY_NAME,
    MANIFEST,
    SAFE_NAME,
    TENSORS,
    DiskBudgetError,
    Store,
    entry_name,
    oversized_is_ours,
)

logger = logging.getLogger(__name__)

STALE_TEMP_SECONDS = 60.0
"""A writer's temporary file untouched this long, its process gone, is a leftover (``reap_dead_writers``)."""
TEMP_NAME = re.compile(r"\.[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}\.(json|safetensors|index)\.\d+\.[0-9a-f]{8}\.tmp")
BUDGET_LOCK = ".budget.lock"
CLAIM_SLACK_NS = 2_000_000_000
"""A file changed less than this before the oldest held lock was taken (or before the look began) may still be
a live writer's: file times come from a coarser clock than ``time.time_ns``, on some filesystems to the second."""


@dataclass(frozen=True)
class Orphan:
    """Files no entry needs (see the module docstring): a leaf entry no tier lists (``kind`` ``leaf``: its
    manifest and tensors), or a tensors file with no manifest (``tensors``). ``files``: each path with the
    modification time (ns) it had when found; ``nbytes``: their size."""

    name: str
    kind: str
    files: tuple[tuple[Path, int], ...]
    nbytes: int

    def unchanged(self) -> bool:
        """Whether every file is still as found (a build that took a leaf since has touched its manifest)."""
        try:
            return all(regular_stat(path).st_mtime_ns == mtime for path, mtime in self.files)
        except OSError:
            return False


class LocalStore(Store):
    """A directory of entries. ``budget_bytes``: most bytes of entries (manifests + tensors) kept."""

    def __init__(self, directory: Path, *, budget_bytes: int | None = None) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise DiskBudgetError("the disk budget must be >= 0 bytes")
        self.directory = directory
        self.location = str(directory)
        self.budget_bytes = budget_bytes
        self._reaped = False

    def __repr__(self) -> str:
        return f"LocalStore({self.directory}, budget_bytes={self.budget_bytes})"

    def paths(self, key: str) -> tuple[Path, Path]:
        """(safetensors, manifest) paths of ``key``."""
        name = entry_name(key)
        return self.directory / f"{name}{TENSORS}", self.directory / f"{name}{MANIFEST}"

    def where(self, key: str) -> str:
        return str(self.paths(key)[0])

    def read_manifest(self, key: str) -> bytes | None:
        try:
            return read_regular(self.paths(key)[1], MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None  # a safetensors file alone is an unfinished write: the writer adds the manifest

    def manifest_head(self, key: str) -> bytes:
        return read_regular(self.paths(key)[1], HEAD_BYTES, head=True)

    def read_tensors(self, key: str) -> bytes:
        return read_regular(self.paths(key)[0])

    def tensors_file(self, key: str) -> Path | None:
        """The safetensors file to map, when it is a regular file (else ``read_tensors`` says why not)."""
        path = self.paths(key)[0]
        return path if _is_regular(path) else None

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(self.paths(key)[1], follow_symlinks=False)

    def check(self) -> None:
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory} is not a directory")

    def staging_file(self, key: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = _temp_name(self.paths(key)[0])
        path.touch(exist_ok=False)
        return path

    def write(self, key: str, manifest: bytes, tensors: bytes | Path) -> None:
        if not self._reaped:
            self.reap_dead_writers()
        size = len(manifest) + (tensors.stat().st_size if isinstance(tensors, Path) else len(tensors))
        self.check_fits(size)
        tensors_path, manifest_path = self.paths(key)
        self.directory.mkdir(parents=True, exist_ok=True)
        staged: list[Path] = []
        try:
            staged = [_synced(tensors) if isinstance(tensors, Path) else _stage(tensors_path, tensors)]
            staged.append(_stage(manifest_path, manifest))
            with self._budget_lock():
                if self.budget_bytes is not None:
                    self._evict(self.budget_bytes - size, keep=key, listing=own_manifest(manifest))
                with contextlib.suppress(OSError):  # new until its manifest follows: no orphan meanwhile (``orphans``)
                    os.utime(staged[0])
                os.replace(staged[0], tensors_path)
                os.replace(staged[1], manifest_path)
        finally:
            for path in staged:
                with contextlib.suppress(OSError):
                    path.unlink()

    def write_manifest(self, key: str, manifest: bytes) -> None:
        _replace_with(self.paths(key)[1], manifest)

    def remove(self, key: str) -> bool:
        return _remove_entry_files(self.paths(key)[1])

    def listing(self) -> list[tuple[dict[str, Any], int]]:
        return [(manifest, size) for _, manifest, size, _ in self._scan()]

    def disk_bytes(self) -> int:
        """Bytes of the entries now stored (manifests + tensors)."""
        return sum(size for _, _, size, _ in self._scan())

    def orphans(self) -> list[Orphan]:
        """The files no entry needs and no live writer may claim (see the module docstring), oldest first."""
        since = self._unclaimed_before()  # before the look: a writer that starts later writes newer files
        return self._orphans(self._scan(), since)

    def remove_orphans(self) -> list[Orphan]:
        """Remove the ``orphans`` still as found, manifest first; those removed. A tier being written by a
        process that holds no lock (its lock timed out) may list a leaf removed here: reading that tier then
        finds the leaf missing and rebuilds it, as for any lost leaf."""
        removed = [orphan for orphan in self.orphans() if orphan.unchanged() and self._remove_orphan(orphan)]
        if removed:
            logger.info("removed %d orphaned file(s) from %s", len(removed), self.directory)
        return removed

    def trim(self, budget_bytes: int | None = None) -> list[str]:
        """Remove orphans, then evict least recently used entries, until at most ``budget_bytes`` (default:
        the store's budget) remain; the keys evicted."""
        limit = self.budget_bytes if budget_bytes is None else budget_bytes
        self.reap_dead_writers()
        if limit is None or not self.directory.is_dir():
            return []
        with self._budget_lock():
            return self._evict(limit, keep=None)

    def reap_dead_writers(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        """Remove temporary files whose writer is gone (``kill -9`` mid-write left them, unlisted and uncounted,
        until ``clear``): the writing process (its pid is in the name) no longer runs here and the file has not
        changed for ``older_than`` seconds (a writer on another machine sharing the directory keeps its file
        fresh). How many went."""
        self._reaped = True
        reaped = 0
        with contextlib.suppress(OSError):
            for path in self.directory.iterdir():
                match = TEMP_NAME.fullmatch(path.name)
                if match is None or _alive(int(path.name.rsplit(".", 3)[1])):
                    continue
                with contextlib.suppress(OSError):
                    if time.time() - path.lstat().st_mtime > older_than:
                        _unlink_file(path)
                        reaped += 1
        if reaped:
            logger.info("removed %d temporary file(s) of writers that died, from %s", reaped, self.directory)
        return reaped

    def clear(self) -> set[str]:
        keys: set[str] = set()
        if not self.directory.is_dir():
            return keys
        for path, manifest, _, _ in self._scan():
            keys.add(manifest["key"])
            _remove_entry_files(path)
        with contextlib.suppress(OSError):
            for path in self.directory.iterdir():
                if TEMP_NAME.fullmatch(path.name) or (path.suffix == INDEX and INDEX_NAME.fullmatch(path.stem)):
                    _unlink_file(path)
        locks = self.directory / "locks"
        if locks.is_dir() and not locks.is_symlink():
            with contextlib.suppress(OSError):
                for path in locks.iterdir():
                    if path.suffix == ".lock" and (SAFE_NAME.fullmatch(path.stem) or path.name == BUDGET_LOCK):
                        remove_unheld_lock(path)
        return keys

    def lock(self, key: str, timeout: float | None) -> KeyLock:
        return FileKeyLock(self.directory / "locks" / f"{entry_name(key)}.lock", timeout)

    # ----------------------------------------------------------------------------- budget
    @contextlib.contextmanager
    def _budget_lock(self) -> Any:
        """Serialises evict-and-commit across processes; nothing to serialise without a budget."""
        if self.budget_bytes is None:
            yield
            return
        locks = own_directory(self.directory / "locks")
        FileKeyLock.check(locks / BUDGET_LOCK)
        with FileLock(locks / BUDGET_LOCK):
            yield

    def _evict(self, limit: int, keep: str | None, listing: dict[str, Any] | None = None) -> list[str]:
        """Remove orphans, then least recently used entries (never ``keep``), until the rest hold at most ``limit``
        bytes; the keys of the entries evicted. ``listing``: the manifest about to be written (the leaves it lists
        are no orphans)."""
        scanned = self._scan()
        bare = self._bare_tensors({path.stem for path, _, _, _ in scanned})
        if sum(e[2] for e in scanned if e[1]["key"] != keep) + sum(orphan.nbytes for orphan in bare) <= limit:
            return []
        since = self._unclaimed_before()  # then the directory again: what a writer listed before it let go is seen
        scanned = self._scan()
        bare = self._bare_tensors({path.stem for path, _, _, _ in scanned})
        entries = [e for e in scanned if e[1]["key"] != keep]
        total = sum(size for _, _, size, _ in entries) + sum(orphan.nbytes for orphan in bare)
        gone: set[str] = set()
        written = None if keep is None else entry_name(keep)  # about to be replaced anyway
        for orphan in self._orphans(scanned, since, bare, listing):  # first: nothing reads them
            if total <= limit:
                break
            if orphan.name != written and orphan.unchanged() and self._remove_orphan(orphan):
                total -= orphan.nbytes
                gone.add(orphan.name)
                logger.info("removed orphaned document cache file(s) %s (%d bytes) over the disk budget",
                            orphan.name[:12], orphan.nbytes)  # fmt: skip
        entries = [e for e in entries if e[0].stem not in gone]
        entries.sort(key=lambda e: (e[3], e[1].get("created", 0)))  # least recently used first
        evicted: list[str] = []
        for path, manifest, size, _ in entries:
            if total <= limit:
                break
            if _remove_entry_files(path):
                total -= size
                evicted.append(manifest["key"])
                logger.info("evicted document cache entry %s (%d bytes) over the disk budget", path.stem[:12], size)
        return evicted

    # ----------------------------------------------------------------------------- orphans
    def _unclaimed_before(self) -> int:
        """A time (ns): files last changed before it are claimed by no live writer. The oldest held key lock's
        stamp (``FileKeyLock``), or now, less ``CLAIM_SLACK_NS``. Locks are tried oldest first, up to the first
        held one."""
        oldest = time.time_ns()
        locks = self.directory / "locks"
        if not locks.is_dir() or locks.is_symlink():
            return oldest - CLAIM_SLACK_NS
        stamped = []
        with contextlib.suppress(OSError):
            for path in locks.iterdir():
                if path.suffix == ".lock" and path.name != BUDGET_LOCK and SAFE_NAME.fullmatch(path.stem):
                    with contextlib.suppress(OSError):
                        stamped.append((regular_stat(path).st_mtime_ns, path))
        for mtime, path in sorted(stamped):
            if mtime >= oldest:
                break
            if lock_held(path):
                oldest = mtime
                break
        return oldest - CLAIM_SLACK_NS

    def _orphans(
        self,
        scanned: list[tuple[Path, dict[str, Any], int, int]],
        since: int,
        bare: list[Orphan] | None = None,
        listing: dict[str, Any] | None = None,
    ) -> list[Orphan]:
        """The orphans among ``scanned`` (``_scan``) and the tensors files with no manifest (``bare``, found now
        if None) last changed before ``since`` (ns), whose own lock nobody holds; oldest first. ``listing``: a
        manifest about to be written, whose leaves count as listed."""
        listed = {leaf for _, manifest, _, _ in scanned for leaf in _leaves(manifest)} | set(_leaves(listing or {}))
        found: list[Orphan] = []
        for path, manifest, size, _ in scanned:
            if manifest.get("kind") != "leaf" or manifest["key"] in listed:
                continue
            tensors = path.with_suffix(TENSORS)
            try:
                stamped = [(path, regular_stat(path).st_mtime_ns)]
                if os.path.lexists(tensors):
                    stamped.append((tensors, regular_stat(tensors).st_mtime_ns))
            except OSError:
                continue  # gone since the scan, or a tensors file that is not a regular one (left alone)
            found.append(Orphan(path.stem, "leaf", tuple(stamped), size))
        found += self._bare_tensors({path.stem for path, _, _, _ in scanned}) if bare is None else bare
        locks = self.directory / "locks"
        return sorted(
            (
                orphan
                for orphan in found
                if max(mtime for _, mtime in orphan.files) < since and not lock_held(locks / f"{orphan.name}.lock")
            ),
            key=lambda orphan: max(mtime for _, mtime in orphan.files),
        )

    def _bare_tensors(self, manifests: set[str]) -> list[Orphan]:
        """The cache's tensors files whose name has no manifest (``manifests``: the names that have one) and no
        other regular file at the manifest's name: the cache's own by their name (a key's) or their header."""
        found: list[Orphan] = []
        try:
            paths = sorted(self.directory.iterdir())
        except OSError:
            return found
        for path in paths:
            if path.suffix != TENSORS or path.name.startswith(".") or path.stem in manifests:
                continue
            if not SAFE_NAME.fullmatch(path.stem) or _is_regular(path.with_suffix(MANIFEST)):
                continue  # not a name of the cache's, or a manifest that is not the cache's (left alone)
            try:
                st = regular_stat(path)
                ours = KEY_NAME.fullmatch(path.stem) or own_tensors(read_regular(path, MAX_MANIFEST_BYTES, head=True))
            except OSError:
                continue
            if ours:
                found.append(Orphan(path.stem, "tensors", ((path, st.st_mtime_ns),), st.st_size))
        return found

    def _remove_orphan(self, orphan: Orphan) -> bool:
        """Remove ``orphan``'s files (a leaf's manifest first) and its key's lock file unless held; True if any went."""
        first = orphan.files[0][0]
        gone = _remove_entry_files(first) if orphan.kind == "leaf" else _unlink_file(first)
        locks = self.directory / "locks"
        if gone and locks.is_dir() and not locks.is_symlink():
            remove_unheld_lock(locks / f"{orphan.name}.lock")
        return gone

    def _scan(self) -> list[tuple[Path, dict[str, Any], int, int]]:
        """(manifest path, manifest, entry bytes, last use in ns) of every homer manifest in the directory.

        Only regular files are read. A manifest over ``MAX_MANIFEST_BYTES`` that is the cache's
        (``oversized_is_ours``) comes as ``unusable_manifest``: listed, counted, evicted and cleared."""
        try:
            paths = sorted(self.directory.iterdir())
        except OSError:
            return []
        found = []
        for path in paths:
            if path.suffix != MANIFEST or path.name.startswith("."):
                continue
            try:
                st = regular_stat(path)
                try:
                    manifest = own_manifest(read_regular(path, MAX_MANIFEST_BYTES))
                except OverLimit as exc:
                    head = read_regular(path, HEAD_BYTES, head=True)
                    why = f"the manifest has {exc.size:,} bytes, over the {exc.limit:,}-byte limit"
                    ours = oversized_is_ours(path.stem, head)
                    manifest = unusable_manifest(path.stem, why, st.st_mtime) if ours else None
            except OSError:
                continue
            if manifest is None:
                continue
            size = st.st_size + regular_size(path.with_suffix(TENSORS))
            found.append((path, manifest, size, st.st_mtime_ns))
        return found


def _leaves(manifest: dict[str, Any]) -> list[str]:
    """The leaf content keys a manifest lists (a tier stored by its leaves), none for any other."""
    leaves = manifest.get("leaves")
    return [leaf for leaf in leaves if isinstance(leaf, str)] if isinstance(leaves, list) else []


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _temp_name(path: Path) -> Path:
    """A unique temporary name beside ``path`` (``TEMP_NAME``: ``clear`` removes leftovers)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _synced(path: Path) -> Path:
    """``path`` (a staged file) flushed to disk before it is renamed in."""
    with path.open("rb+") as f:
        os.fsync(f.fileno())
    return path


def _replace_with(path: Path, data: bytes) -> None:
    """``path`` atomically replaced by a file holding ``data`` (``_stage``d, then renamed in)."""
    staged = _stage(path, data)
    try:
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise


def _stage(path: Path, data: bytes) -> Path:
    """``data`` written and fsync'd to a temporary name beside ``path``; the caller renames it in."""
    tmp = _temp_name(path)
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


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
    return _unlink_file(manifest_path.with_suffix(TENSORS)) or removed
