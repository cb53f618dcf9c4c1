"""``FsspecStore``: entries under any URL fsspec knows (``s3://bucket/prefix``, ``gs://``, ``file://``, ``memory://``).

Layout under the URL: ``<name>.safetensors`` and ``<name>.json`` per key, ``locks/<name>.lease``
(``LeaseLock``, see ``flight.py``) and ``.tmp/`` (files being written).

Atomic writes: on object stores (S3, GCS, Azure, memory) one PUT is atomic by the service (an
object appears whole or not at all), so each file is put under its final name. Elsewhere
(``file://``, SFTP, ...) a file is written under ``.tmp/`` and renamed into place. Tensors go
first, then the manifest that vouches for them. No byte budget here: object stores have their own
lifecycle rules; ``LocalStore`` has one.

Credentials and endpoints come from ``storage_options`` or the environment, as fsspec/s3fs read
them (for example ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from homer_integrations.cache.entry import MAX_MANIFEST_BYTES, own_manifest
from homer_integrations.cache.flight import KeyLock, LeaseLock
from homer_integrations.cache.store import MANIFEST, TENSORS, Store, entry_name

logger = logging.getLogger(__name__)

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
"""Protocols whose single PUT is atomic: files are written under their final names."""
TMP_DIR = ".tmp"
LOCK_DIR = "locks"


class FsspecStore(Store):
    """Entries under ``url``. ``lease_ttl``: seconds a dead process's lease blocks a key (``LeaseLock``);
    ``storage_options`` go to fsspec (e.g. ``endpoint_url=...`` for s3fs: ``client_kwargs``)."""

    def __init__(self, url: str, *, lease_ttl: float = 30.0, **storage_options: Any) -> None:
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self.location = url
        self.lease_ttl = lease_ttl
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.object_store = bool(protocols & OBJECT_STORES)
        self._dirs_made = False

    def __repr__(self) -> str:
        return f"FsspecStore({self.location!r})"

    def paths(self, key: str) -> tuple[str, str]:
        """(safetensors, manifest) paths of ``key`` on ``fs``."""
        name = entry_name(key)
        return f"{self.root}/{name}{TENSORS}", f"{self.root}/{name}{MANIFEST}"

    def where(self, key: str) -> str:
        return self.fs.unstrip_protocol(self.paths(key)[0])

    def read_manifest(self, key: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self.paths(key)[1]))
        except FileNotFoundError:
            return None

    def read_tensors(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self.paths(key)[0]))

    def write(self, key: str, manifest: bytes, tensors: bytes | Path) -> None:
        tensors_path, manifest_path = self.paths(key)
        self._put(tensors_path, tensors)
        self._put(manifest_path, manifest)

    def write_manifest(self, key: str, manifest: bytes) -> None:
        self._put(self.paths(key)[1], manifest)

    def remove(self, key: str) -> bool:
        removed = False
        for path in reversed(self.paths(key)):  # the manifest first: no reader then sees it alone
            removed = self._rm_file(path) or removed
        return removed

    def listing(self) -> list[tuple[dict[str, Any], int]]:
        self.fs.invalidate_cache(self.root)
        try:
            files = {
                info["name"].rstrip("/").rsplit("/", 1)[-1]: int(info.get("size") or 0)
                for info in self.fs.ls(self.root, detail=True)
                if info.get("type") == "file"
            }
        except (OSError, ValueError):
            return []
        finally:
            self.fs.invalidate_cache(self.root)  # later reads must see other processes' writes
        found = []
        for name, size in sorted(files.items()):
            if not name.endswith(MANIFEST) or name.startswith(".") or size > MAX_MANIFEST_BYTES:
                continue
            try:
                manifest = own_manifest(bytes(self.fs.cat_file(f"{self.root}/{name}")))
            except OSError:
                continue
            if manifest is not None:
                found.append((manifest, size + files.get(name.removesuffix(MANIFEST) + TENSORS, 0)))
        return found

    def clear(self) -> set[str]:
        keys: set[str] = set()
        for manifest, _ in self.listing():
            keys.add(manifest["key"])
            self.remove(manifest["key"])
        for folder in (TMP_DIR, LOCK_DIR):
            with contextlib.suppress(OSError, ValueError):
                for path in self.fs.ls(f"{self.root}/{folder}", detail=False):
                    if folder == TMP_DIR or self._lease_is_stale(path):
                        self._rm_file(path)
        self.fs.invalidate_cache(self.root)
        return keys

    def lock(self, key: str, timeout: float | None) -> KeyLock:
        self._make_dirs()
        path = f"{self.root}/{LOCK_DIR}/{entry_name(key)}.lease"
        return LeaseLock(self.fs, path, ttl=self.lease_ttl, timeout=timeout)

    # ----------------------------------------------------------------------------- helpers
    def _put(self, path: str, data: bytes | Path) -> None:
        """Write ``path`` (from bytes or a local file) so a reader sees the old file or the whole new one."""
        self._make_dirs()
        if self.object_store:
            self._upload(path, data)
            return
        name = path.rsplit("/", 1)[-1]
        tmp = f"{self.root}/{TMP_DIR}/{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._upload(tmp, data)
        try:
            if isinstance(self.fs, LocalFileSystem):
                os.replace(self.fs._strip_protocol(tmp), self.fs._strip_protocol(path))
            elif self.fs.isdir(path):
                raise IsADirectoryError(path)
            else:
                self.fs.mv(tmp, path)
        except BaseException:
            self._rm_file(tmp)
            raise

    def _upload(self, path: str, data: bytes | Path) -> None:
        if isinstance(data, Path):
            self.fs.put_file(str(data), path)
        else:
            self.fs.pipe_file(path, data)

    def _make_dirs(self) -> None:
        """Folders a non-object store needs before its first write (object stores have none)."""
        if self._dirs_made or self.object_store:
            return
        for folder in (TMP_DIR, LOCK_DIR):
            self.fs.makedirs(f"{self.root}/{folder}", exist_ok=True)
        self._dirs_made = True

    def _rm_file(self, path: str) -> bool:
        """Delete the file at ``path``, never a directory; True if it went. Never raises."""
        try:
            if not self.object_store and self.fs.isdir(path):
                return False
            self.fs.rm_file(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("cannot remove document cache file %s: %s", path, exc)
            return False

    def _lease_is_stale(self, path: str) -> bool:
        """A lease whose holder stopped renewing it over a TTL ago (``clear`` removes those only)."""
        lease = LeaseLock(self.fs, path, ttl=self.lease_ttl)
        with contextlib.suppress(FileNotFoundError, OSError):
            return lease.expired(bytes(self.fs.cat_file(path)))
        return False
