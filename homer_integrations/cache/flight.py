"""Single flight: one computation per key, across threads (``SingleFlight``) and processes (key locks).

Across processes a store hands out a per-key lock; the cache reads the entry again once it holds
it, so the second process loads what the first one wrote instead of computing it.

- ``FileKeyLock`` (a local directory): an OS file lock (``filelock``). Mutual exclusion is exact;
  a process that dies releases it. The lock directory must be a directory itself and each lock a
  regular file (``files``): a link there is refused, never followed to create or truncate a file.
- ``LeaseLock`` (any fsspec URL, e.g. ``s3://``): a lease object next to the entries. It is taken
  with an exclusive create (S3 ``If-None-Match: *``, ``O_EXCL`` on a local disk), renewed by a
  heartbeat thread every ``ttl / 3`` seconds while held, and deleted on release. A waiter breaks a
  lease that is stale: its content (which every renewal changes) stayed the same for ``ttl``
  seconds of the waiter's own clock (so clocks of different machines need not agree), or its
  expiry lies more than ``ttl`` in the past. Mutual exclusion holds while the holder lives; when
  a holder dies (or stalls past ``ttl``), or two waiters break one stale lease at the same moment,
  two processes may compress one document. That costs time only: each writes a complete,
  verified entry under the same key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from filelock import FileLock, Timeout
from fsspec.implementations.local import LocalFileSystem

from homer_integrations.cache.files import check_lock_file, own_directory

logger = logging.getLogger(__name__)

T = TypeVar("T")
Role = Literal["cached", "leader", "follower"]


class LockTimeout(Exception):
    """Another process held a key's lock longer than the caller wanted to wait."""


class KeyLock(Protocol):
    """A cross-process lock on one key: ``acquire`` raises ``LockTimeout`` (or ``OSError``)."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...


@dataclass
class _Flight(Generic[T]):
    """One in-progress lookup of a key; other callers wait on ``done``."""

    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None


class SingleFlight(Generic[T]):
    """Threads asking for one key share one ``work()``; different keys run side by side.

    ``waits`` counts callers that waited for another caller's work.
    """

    def __init__(self) -> None:
        self.waits = 0
        self._flights: dict[str, _Flight[T]] = {}
        self._lock = threading.Lock()  # never held during work()

    def run(
        self,
        key: str,
        cached: Callable[[], T | None],
        work: Callable[[], T],
        keep: Callable[[T], None],
    ) -> tuple[T, Role]:
        """``cached()`` if it has the value, else the value of the one ``work()`` for ``key``.

        ``cached`` and ``keep`` run under this object's lock (keep them short): ``keep`` stores a
        leader's value before its flight ends, so no later caller misses both. A leader's error
        reaches every follower; the next call tries again.
        """
        with self._lock:
            hit = cached()
            if hit is not None:
                return hit, "cached"
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            else:
                self.waits += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.value is not None
            return flight.value, "follower"
        try:
            value = work()
        except BaseException as exc:
            with self._lock:
                del self._flights[key]
            flight.error = exc
            flight.done.set()
            raise
        with self._lock:
            try:
                keep(value)
            finally:
                del self._flights[key]
        flight.value = value
        flight.done.set()
        return value, "leader"


class FileKeyLock:
    """An OS file lock at ``path`` (its directory is created on first use; ``check`` refuses links)."""

    def __init__(self, path: Path, timeout: float | None) -> None:
        self.path = path
        self.timeout = timeout
        self._lock: FileLock | None = None

    @staticmethod
    def check(path: Path) -> None:
        """``OSError`` unless ``path``'s directory is a directory of its own and ``path`` is absent or a
        regular file."""
        own_directory(path.parent)
        check_lock_file(path)

    def acquire(self) -> None:
        self.check(self.path)
        self._lock = FileLock(self.path, timeout=-1 if self.timeout is None else self.timeout)
        try:
            self._lock.acquire()
        except Timeout as exc:
            raise LockTimeout(str(exc)) from exc
        # the lock file's modification time says since when it is held: whatever its holder writes (a tier's leaves,
        # listed only once the tier is written) is newer, so ``LocalStore.orphans`` leaves it alone meanwhile
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(self.path, follow_symlinks=False)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()


def lock_held(path: Path) -> bool:
    """Whether a thread or process holds the lock file ``path`` now; one that cannot be tried (not a regular file,
    unreadable) counts as held, an absent one as free (and is not created)."""
    try:
        check_lock_file(path)
        if not path.exists():
            return False
    except OSError:
        return True
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except (Timeout, OSError):
        return True
    lock.release()
    return False


def remove_unheld_lock(path: Path) -> bool:
    """Remove a lock file unless a thread or process holds it now (or it is not a regular file); True if it went."""
    lock = FileLock(path, timeout=0)
    try:
        check_lock_file(path)
        lock.acquire()
    except (Timeout, OSError):
        return False
    try:
        path.unlink()
        return True
    except OSError:
        return False
    finally:
        lock.release()


class LeaseLock:
    """A lease object at ``path`` on the fsspec filesystem ``fs`` (see the module docstring).

    Args:
        ttl: seconds a lease that stopped changing stays valid; the holder renews it every ttl / 3.
        timeout: seconds to wait for it; None waits as long as a live holder holds it.
        poll: the first wait between tries (it doubles up to 0.5 s).
    """

    def __init__(self, fs: Any, path: str, *, ttl: float = 30.0, timeout: float | None = None, poll: float = 0.05):
        self.fs, self.path, self.ttl, self.timeout, self.poll = fs, path, ttl, timeout, poll
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._beats = 0

    def acquire(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        delay = self.poll
        seen: bytes | None = None
        seen_since = time.monotonic()
        while True:
            try:
                create_exclusive(self.fs, self.path, self._lease())
                break
            except FileExistsError:
                pass
            current = self._read()
            now = time.monotonic()
            if current != seen:
                seen, seen_since = current, now
            if current is not None and self._stale(current, now - seen_since):
                logger.warning("breaking the stale cache lease %s (%s)", self.path, current[:200])
                with contextlib.suppress(FileNotFoundError, OSError):
                    self.fs.rm_file(self.path)
                continue
            if deadline is not None and now >= deadline:
                raise LockTimeout(f"the lease {self.path} is held by {(current or b'?')[:200]!r}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._renew, name=f"lease {self.path}", daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self._holder() == self.owner:
            with contextlib.suppress(FileNotFoundError, OSError):
                self.fs.rm_file(self.path)

    def _lease(self) -> bytes:
        self._beats += 1
        return json.dumps({"owner": self.owner, "expires": time.time() + self.ttl, "beat": self._beats}).encode()

    def _read(self) -> bytes | None:
        with contextlib.suppress(FileNotFoundError):
            return bytes(self.fs.cat_file(self.path))
        return None

    def _holder(self) -> str | None:
        with contextlib.suppress(ValueError, TypeError, AttributeError, UnicodeDecodeError):
            return str(json.loads(self._read() or b"null")["owner"])
        return None

    def _stale(self, raw: bytes, unchanged_for: float) -> bool:
        return unchanged_for > self.ttl or self.expired(raw)

    def expired(self, raw: bytes) -> bool:
        """The lease ``raw`` ran out more than a TTL ago by its own expiry (a margin for clock skew)."""
        try:
            expires = float(json.loads(raw)["expires"])
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            return False  # half written (a local O_EXCL file before its bytes): judged by how long it stays so
        return expires + self.ttl < time.time()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            if self._holder() != self.owner:
                logger.warning("lost the cache lease %s to another process", self.path)
                return
            with contextlib.suppress(OSError):
                replace_file(self.fs, self.path, self._lease())


def replace_file(fs: Any, path: str, data: bytes) -> None:
    """Overwrite ``path`` so a reader sees the old or the new bytes: a rename on a local disk, one put
    elsewhere (atomic on object stores)."""
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    local = fs._strip_protocol(path)
    tmp = f"{local}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_exclusive(fs: Any, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data`` unless it exists (then ``FileExistsError``), in one atomic step
    where the filesystem offers one (S3 conditional put, ``O_EXCL``)."""
    try:
        with fs.open(path, "xb") as f:
            f.write(data)
    except FileExistsError:
        raise
    except OSError as exc:  # S3 answers a taken name with 412 Precondition Failed
        if "PreconditionFailed" in repr(exc) or "412" in str(exc) or "Precondition" in str(exc):
            raise FileExistsError(path) from exc
        raise
