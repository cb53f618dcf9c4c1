"""``StagedTensors``: a safetensors file laid out before its tensors are computed, filled in place.

A leaf tier holds the K/V of every document token in the leaf layers (1.25 GB for 64k tokens on
Qwen2.5-0.5B). Built in process memory and then written, it would sit in RAM whole, whatever the
cache's byte budget. Instead the cache lays out the entry's safetensors file first (the tier's
shapes are known from its plan), maps it, and lets the build write each leaf straight into the
mapped tensors; the pages belong to the OS page cache (written back and dropped under memory
pressure), and finishing the entry is writing its header and renaming the file into place.

safetensors has no API to allocate a file and hand out writable views of it (it serialises
finished tensors), hence this small writer of its documented format: an 8-byte little-endian
header length, a JSON header (``__metadata__`` and per tensor ``dtype``, ``shape``,
``data_offsets`` relative to the data section, contiguous and in order), padded with spaces, then
the data. Files written here are read back by ``safetensors.safe_open`` like any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import struct
from pathlib import Path

import torch

from homer_integrations.cache.store_base import Store
from homer_integrations.homer.leaves.tier_file import Allocate, Layout

logger = logging.getLogger(__name__)

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
METADATA_RESERVE = 8192
"""Header bytes kept for ``__metadata__``, written when the entry is finished (a tier's is < 1 KB)."""


class StagedTensors:
    """A safetensors file at ``path`` holding ``layout``'s tensors, writable in place before it is finished.

    Attributes:
        path: the file (a staging name; the store renames it into place once finished).
        tensors: name -> tensor of the layout's shape and dtype, a view of the mapped file.
    """

    def __init__(self, path: Path, layout: Layout) -> None:
        unknown = {str(dtype) for _, dtype in layout.values() if dtype not in DTYPES}
        if unknown:
            raise ValueError(f"cannot stage tensors of dtype {', '.join(sorted(unknown))}")
        self.path = path
        # 8-byte elements first: every tensor then starts at a multiple of its element size
        names = sorted(layout, key=lambda name: -layout[name][1].itemsize)
        self._entries: dict[str, dict[str, object]] = {}
        offset = 0
        for name in names:
            shape, dtype = layout[name]
            nbytes = dtype.itemsize * math.prod(shape)
            self._entries[name] = {
                "dtype": DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
        self._header_len = _round8(len(self._header({})) + METADATA_RESERVE)
        start = 8 + self._header_len
        size = start + offset
        with path.open("r+b") as f:
            if hasattr(os, "posix_fallocate"):
                # reserve the blocks now: a full disk is an OSError here (the caller builds in memory
                # instead), not a SIGBUS when the build writes a page of a sparse mapping
                os.posix_fallocate(f.fileno(), 0, size)
            else:
                f.truncate(size)
        data = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        self.tensors: dict[str, torch.Tensor] = {}
        for name in names:
            shape, dtype = layout[name]
            lo, hi = self._entries[name]["data_offsets"]  # type: ignore[misc]
            self.tensors[name] = data[start + lo : start + hi].view(dtype).view(shape)

    def backs(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is one of this file's tensors (or a view of one)."""
        return any(tensor.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in self.tensors.values())

    def finish(self, metadata: dict[str, str]) -> Path:
        """Write the header with ``metadata``; the file is then a complete safetensors file."""
        header = self._header(metadata)
        if len(header) > self._header_len:
            raise ValueError(f"the metadata needs {len(header):,} header bytes, {self._header_len:,} were reserved")
        header += b" " * (self._header_len - len(header))
        with self.path.open("r+b") as f:  # the data pages are the mapping's; the header is written apart
            f.write(struct.pack("<Q", self._header_len) + header)
        return self.path

    def _header(self, metadata: dict[str, str]) -> bytes:
        return json.dumps({"__metadata__": metadata, **self._entries}, separators=(",", ":")).encode()


class StagedTiers:
    """The leaf tiers of one ``store`` being built straight into the files that become their entries."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._files: dict[str, StagedTensors] = {}

    def allocator(self, key: str) -> Allocate:
        """Storage for ``key``'s leaf tier (CPU) inside the file that becomes its stored entry; it returns
        None, and the build allocates in memory, if the file cannot be made."""

        def allocate(layout: Layout) -> dict[str, torch.Tensor] | None:
            self.drop(key)
            path = None
            try:
                self.store.check_fits(sum(math.prod(shape) * dtype.itemsize for shape, dtype in layout.values()))
                path = self.store.staging_file(key)
                staged = StagedTensors(path, layout)
            except (OSError, ValueError, RuntimeError) as exc:
                logger.warning("building the leaf tier %s in memory: cannot stage it in a file (%s)", key[:12], exc)
                if path is not None:
                    path.unlink(missing_ok=True)
                return None
            self._files[key] = staged
            return staged.tensors

        return allocate

    def get(self, key: str) -> StagedTensors | None:
        """``key``'s staged file, while its tier is being built and written."""
        return self._files.get(key)

    def drop(self, key: str) -> None:
        """Forget ``key``'s staged file and remove it if it was not renamed into the store (a failed
        build or write; a tier built in it stays readable through its mapping)."""
        staged = self._files.pop(key, None)
        if staged is not None:
            with contextlib.suppress(OSError):
                staged.path.unlink(missing_ok=True)


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8
