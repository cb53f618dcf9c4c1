"""Files this process memory-maps entries from, as they were when mapped, and whether they changed since.

A leaf tier, or a leaf of a content-split tier, read from a local directory is memory-mapped
(safetensors), and ``MemoryLRU`` keeps it across questions. The cache never changes such a file in
place: every write goes to a new file renamed over the name, and eviction, ``rm``, ``clear`` and
``trim`` unlink, so a mapping keeps the bytes it was verified with. Another program can still
truncate the file or write into it in place: a mapped page then reads the new bytes (damaged K/V), or,
past the new end of the file, raises SIGBUS, which kills the process. So each mapping notes its file's
``FileStamp`` (device, inode, size, modification and change times) when it is made, and before a
mapping held from an earlier call is used again (``Lookup``) its files are compared with those
stamps: any difference drops it, and the store's verified read (or a computation) replaces it.
A change made while a question is reading the mapping is not caught; nor is one that leaves all five
the same (the change time cannot be set back without changing the clock).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of the file at ``path``: (device, inode, size, mtime ns, ctime ns)."""

    path: str
    identity: tuple[int, int, int, int, int]

    @classmethod
    def of(cls, path: Path | str) -> FileStamp:
        """The stamp of ``path`` now (its ``lstat``); ``OSError`` when it cannot be looked at."""
        st = os.lstat(path)
        return cls(str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))

    def why_changed(self) -> str | None:
        """None while ``path`` is the file this stamp was taken of, unchanged; else what differs, in words."""
        try:
            now = FileStamp.of(self.path)
        except FileNotFoundError:
            return f"{self.path} was removed"
        except OSError as exc:
            return f"{self.path} cannot be looked at ({exc})"
        if now.identity[:2] != self.identity[:2]:
            return f"{self.path} was replaced by another file"
        if now.identity[2] != self.identity[2]:
            return f"{self.path} changed size in place ({self.identity[2]:,} -> {now.identity[2]:,} bytes)"
        if now != self:
            return f"{self.path} was written in place"
        return None


class MappedFiles:
    """The ``FileStamp`` of each file this process mapped an entry from, taken when it was mapped (thread-safe).

    One per process: a file is the same file for every cache object that maps it."""

    def __init__(self) -> None:
        self._stamps: dict[str, FileStamp] = {}
        self._lock = threading.Lock()

    def note(self, stamp: FileStamp) -> None:
        """``stamp``'s file was just mapped, as it was when stamped."""
        with self._lock:
            self._stamps[stamp.path] = stamp

    def stamps(self, paths: Iterable[Path | str]) -> tuple[FileStamp, ...]:
        """The stamps noted for ``paths`` (those this process never mapped are left out)."""
        with self._lock:
            return tuple(s for p in paths if (s := self._stamps.get(str(p))) is not None)

    def forget(self, stamps: Iterable[FileStamp]) -> None:
        """Drop the notes of ``stamps`` that are still current (their files changed: nothing maps them now)."""
        with self._lock:
            for stamp in stamps:
                if self._stamps.get(stamp.path) == stamp:
                    del self._stamps[stamp.path]


MAPPED = MappedFiles()
"""This process's mapped files."""


def why_changed(stamps: Iterable[FileStamp]) -> str | None:
    """None while every file of ``stamps`` is as it was when stamped; else what happened to the first that is not."""
    return next((why for stamp in stamps if (why := stamp.why_changed()) is not None), None)
