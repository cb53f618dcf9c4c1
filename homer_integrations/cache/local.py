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
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from filelock import FileLock

from homer_integrations.cache.entry import MAX_MANIFEST_BYTES, own_manifest, unusable_manifest
from homer_integrations.cache.files import OverLimit, own_directory, read_regular, regular_size, regular_stat
from homer_integrations.cache.flight import FileKeyLock, KeyLock, remove_unheld_lock
from homer_integrations.cache.store_base import (
    INDEX,
    INDEX_NAME,
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
                    self._evict(self.budget_bytes - size, keep=key)
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

    def trim(self, budget_bytes: int | None = None) -> list[str]:
        """Evict least recently used entries until at most ``budget_bytes`` (default: the store's
        budget) remain; the keys evicted."""
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

    def _evict(self, limit: int, keep: str | None) -> list[str]:
        """Remove least recently used entries (never ``keep``) until the rest hold at most ``limit`` bytes."""
        entries = [e for e in self._scan() if e[1]["key"] != keep]
        entries.sort(key=lambda e: (e[3], e[1].get("created", 0)))  # least recently used first
        total = sum(size for _, _, size, _ in entries)
        evicted: list[str] = []
        for path, manifest, size, _ in entries:
            if total <= limit:
                break
            if _remove_entry_files(path):
                total -= size
                evicted.append(manifest["key"])
                logger.info("evicted document cache entry %s (%d bytes) over the disk budget", path.stem[:12], size)
        return evicted

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
                    head = read_regular(path, 1 << 16, head=True)
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
