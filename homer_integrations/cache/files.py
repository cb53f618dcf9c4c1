"""Opening files in a cache directory without trusting what is there.

The cache reads only regular files it wrote. Anything else at an entry's name (a FIFO, whose
``open`` blocks until a writer comes; a symbolic link to ``/dev/zero`` or to a file outside the
directory; a device; a socket) is refused before it is read: ``read_regular`` looks at the name
with ``lstat`` first, opens it without following a link and without blocking
(``O_NOFOLLOW | O_NONBLOCK``, for whatever is swapped in after the look), checks the open file again
with ``fstat`` and reads at most ``limit`` bytes. ``own_directory`` and ``check_lock_file`` keep
the lock directory and its lock files to the cache's own, so a link there never makes the cache
create or truncate a file elsewhere. Each refusal is an ``OSError`` (``NotRegularFile``,
``OverLimit``), which the cache treats like any unreadable entry.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """A name in the cache that is not a regular file (a link, a FIFO, a device, a socket)."""


class OverLimit(OSError):
    """A file larger than what may be read of it; ``size`` and ``limit`` are bytes."""

    def __init__(self, path: Path, size: int, limit: int) -> None:
        super().__init__(f"{path}: {size:,} bytes, over the {limit:,}-byte limit")
        self.size, self.limit = size, limit


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a FIFO``)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def regular_stat(path: Path) -> os.stat_result:
    """``lstat`` of ``path``, a regular file; ``FileNotFoundError`` when absent, ``IsADirectoryError``
    for a directory, ``NotRegularFile`` for anything else."""
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        return st
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    raise NotRegularFile(f"{path}: {kind(st.st_mode)}, not a regular file")


def read_regular(path: Path, limit: int | None = None, *, head: bool = False) -> bytes:
    """The bytes of the regular file at ``path`` (never through a link, never blocking on a FIFO).

    ``limit``: a larger file raises ``OverLimit`` without being read, or with ``head`` gives its first
    ``limit`` bytes. Without one, at most the size the file has when it is opened is read."""
    before = regular_stat(path)
    if limit is not None and before.st_size > limit and not head:
        raise OverLimit(path, before.st_size, limit)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # replaced by a link or a socket since the look
            raise NotRegularFile(f"{path}: replaced while it was opened, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegularFile(f"{path}: replaced while it was opened, not a regular file")
        if limit is not None and st.st_size > limit and not head:
            raise OverLimit(path, st.st_size, limit)
        want = st.st_size if limit is None else min(st.st_size, limit) if head else limit + 1
        chunks: list[bytes] = []
        got = 0
        while got < want:
            chunk = os.read(fd, min(want - got, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if limit is not None and len(data) > limit and not head:  # grown since it was looked at
        raise OverLimit(path, len(data), limit)
    return data


def regular_size(path: Path) -> int:
    """Bytes of the regular file at ``path``; 0 when it is absent or not a regular file."""
    try:
        return regular_stat(path).st_size
    except OSError:
        return 0


def own_directory(path: Path) -> Path:
    """``path``, made if missing (with its parents), and a directory itself: never a link to one
    elsewhere (the cache would create its files there)."""
    path.mkdir(parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path}: not a directory of the cache's own ({kind(st.st_mode)})")
    return path


def check_lock_file(path: Path) -> None:
    """Raise ``NotRegularFile`` unless ``path`` is absent or a regular file (a lock library may open a
    link's target, even truncate it)."""
    with contextlib.suppress(FileNotFoundError):
        regular_stat(path)
