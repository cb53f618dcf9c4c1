"""``FsspecStore``: entries under any URL fsspec knows (``s3://bucket/prefix``, ``gs://``, ``file://``, ``memory://``).

Layout under the URL: ``<name>.safetensors`` and ``<name>.json`` per key (``clear`` also removes the
``<name>.index`` files earlier versions kept), ``locks/<name>.lease`` (``LeaseLock``, see ``flight.py``) and ``.tmp/``
(files being written).

Atomic writes: on object stores (S3, GCS, Azure, memory) one PUT is atomic by the service (an
object appears whole or not at all), so each file is put under its final name. Elsewhere
(``file://``, SFTP, ...) a file is written under ``.tmp/`` and renamed into place. Tensors go
first, then the manifest that vouches for them. No byte budget here: object stores have their own
lifecycle rules; ``LocalStore`` has one.

Credentials and endpoints come from ``storage_options`` or the environment, as fsspec/s3fs read
them (for example ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``). Whatever a backend raises (botocore's
``NoCredentialsError`` is no ``OSError``) reaches the cache as a ``StoreError``, an ``OSError``, as the
``Store`` interface promises. Manifests are read up to ``MAX_MANIFEST_BYTES``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from homer_integrations.cache.entry import MAX_MANIFEST_BYTES, own_manifest, unusable_manifest
from homer_integrations.cache.files import OverLimit, read_regular
from homer_integrations.cache.flight import KeyLock, LeaseLock, LockTimeout
from homer_integrations.cache.store_base import (
    HEAD_BYTES,
    INDEX,
    INDEX_NAME,
    MANIFEST,
    TENSORS,
    Store,
    entry_name,
    oversized_is_ours,
)

logger = logging.getLogger(__name__)

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
"""Protocols whose single PUT is atomic: files are written under their final names."""
TMP_DIR = ".tmp"
LOCK_DIR = "locks"


class StoreError(OSError):
    """What a storage backend raised that is no ``OSError`` (no credentials, say), as an ``OSError``."""


def _storage_error(exc: Exception) -> OSError:
    return exc if isinstance(exc, OSError) else StoreError(f"{type(exc).__name__}: {exc}")


class _Checked:
    """A filesystem whose methods raise ``OSError`` (``StoreError``) for whatever the backend raises."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fs, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except Exception as exc:
                raise _storage_error(exc) from exc

        return call


class _CheckedLock:
    """A ``KeyLock`` whose ``acquire``/``release`` raise ``OSError`` for whatever the backend raises."""

    def __init__(self, lock: KeyLock) -> None:
        self._lock = lock

    def acquire(self) -> None:
        self._call(self._lock.acquire)

    def release(self) -> None:
        self._call(self._lock.release)

    @staticmethod
    def _call(method: Callable[[], None]) -> None:
        try:
            method()
        except LockTimeout:
            raise
        except Exception as exc:
            raise _storage_error(exc) from exc


class FsspecStore(Store):
    """Entries under ``url``. ``lease_ttl``: seconds a dead process's lease blocks a key (``LeaseLock``);
    ``storage_options`` go to fsspec (e.g. ``endpoint_url=...`` for s3fs: ``client_kwargs``).

    ``fs`` is the fsspec filesystem itself (for other code sharing the store); the store's own calls
    go through a wrapper that turns every backend error into an ``OSError``. A URL fsspec does not
    know raises ``ValueError``; a missing backend package ``ImportError``."""

    def __init__(self, url: str, *, lease_ttl: float = 30.0, **storage_options: Any) -> None:
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ValueError, ImportError):
            raise
        except Exception as exc:  # a backend that connects at once (sftp, ftp) and fails
            raise _storage_error(exc) from exc
        self._io = _Checked(self.fs)
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
            return self._read(self.paths(key)[1], MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            return None

    def manifest_head(self, key: str) -> bytes:
        return self._read(self.paths(key)[1], HEAD_BYTES, head=True)

    def read_tensors(self, key: str) -> bytes:
        return self._read(self.paths(key)[0])

    def check(self) -> None:
        """One cheap authenticated look at the root (``info``: a HEAD and at most a one-key listing on
        S3, whatever the store holds); nothing stored there yet is fine."""
        try:
            self._io.info(self.root)
        except FileNotFoundError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self._io.invalidate_cache(self.root)

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
        try:
            self._io.invalidate_cache(self.root)
            files = {
                info["name"].rstrip("/").rsplit("/", 1)[-1]: int(info.get("size") or 0)
                for info in self._io.ls(self.root, detail=True)
                if info.get("type") == "file"
            }
        except (OSError, ValueError, TypeError, KeyError):
            return []
        finally:
            with contextlib.suppress(OSError):
                self._io.invalidate_cache(self.root)  # later reads must see other processes' writes
        found = []
        for name, size in sorted(files.items()):
            if not name.endswith(MANIFEST) or name.startswith("."):
                continue
            path = f"{self.root}/{name}"
            try:
                manifest = own_manifest(self._read(path, MAX_MANIFEST_BYTES))
            except OverLimit as exc:  # the cache's (listed as unusable, so clear removes it) or not
                stem = name.removesuffix(MANIFEST)
                why = f"the manifest has {exc.size:,} bytes, over the {exc.limit:,}-byte limit"
                try:
                    ours = oversized_is_ours(stem, self._read(path, HEAD_BYTES, head=True))
                except OSError:
                    continue
                manifest = unusable_manifest(stem, why) if ours else None
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
        with contextlib.suppress(OSError, ValueError):
            for path in self._io.ls(self.root, detail=False):
                name = path.rstrip("/").rsplit("/", 1)[-1]
                if name.endswith(INDEX) and INDEX_NAME.fullmatch(name.removesuffix(INDEX)):
                    self._rm_file(path)
        for folder in (TMP_DIR, LOCK_DIR):
            inside = f"{self.root}/{folder}/"
            with contextlib.suppress(OSError, ValueError):
                for path in self._io.ls(inside.rstrip("/"), detail=False):
                    if not path.startswith(inside):  # a file named like the folder is not the cache's
                        continue
                    if folder == TMP_DIR or self._lease_is_stale(path):
                        self._rm_file(path)
        with contextlib.suppress(OSError):
            self._io.invalidate_cache(self.root)
        return keys

    def lock(self, key: str, timeout: float | None) -> KeyLock:
        self._make_dirs()
        path = f"{self.root}/{LOCK_DIR}/{entry_name(key)}.lease"
        return _CheckedLock(LeaseLock(self.fs, path, ttl=self.lease_ttl, timeout=timeout))

    # ----------------------------------------------------------------------------- helpers
    def _read(self, path: str, limit: int | None = None, *, head: bool = False) -> bytes:
        """The file at ``path``: over ``limit`` bytes raises ``OverLimit`` (or, with ``head``, gives its
        first ``limit``). On a local disk only a regular file is read (``files.read_regular``)."""
        if isinstance(self.fs, LocalFileSystem):
            return read_regular(Path(self.fs._strip_protocol(path)), limit, head=head)
        if limit is None:
            return bytes(self._io.cat_file(path))
        data = bytes(self._io.cat_file(path, start=0, end=limit if head else limit + 1))
        if len(data) > limit and not head:
            raise OverLimit(Path(path), len(data), limit)
        return data

    def _put(self, path: str, data: bytes | Path) -> None:
        """Write ``path`` (from bytes or a local file) so a reader sees the old file or the whole new one."""
        self._make_dirs()
        if self.object_store:
            self._upload(path, data)
            return
        name = path.rsplit("/", 1)[-1]
        tmp = f"{self.root}/{TMP_DIR}/{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            self._upload(tmp, data)  # a full disk halfway through leaves part of it: removed below
            if isinstance(self.fs, LocalFileSystem):
                os.replace(self.fs._strip_protocol(tmp), self.fs._strip_protocol(path))
            elif self._io.isdir(path):
                raise IsADirectoryError(path)
            else:
                self._io.mv(tmp, path)
        except BaseException:
            self._rm_file(tmp)
            raise

    def _upload(self, path: str, data: bytes | Path) -> None:
        if isinstance(data, Path):
            self._io.put_file(str(data), path)
        else:
            self._io.pipe_file(path, data)

    def _make_dirs(self) -> None:
        """Folders a non-object store needs before its first write (object stores have none)."""
        if self._dirs_made or self.object_store:
            return
        for folder in (TMP_DIR, LOCK_DIR):
            self._io.makedirs(f"{self.root}/{folder}", exist_ok=True)
        self._dirs_made = True

    def _rm_file(self, path: str) -> bool:
        """Delete the file at ``path``, never a directory; True if it went. Never raises."""
        try:
            if not self.object_store and self._io.isdir(path):
                return False
            self._io.rm_file(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("cannot remove document cache file %s: %s", path, exc)
            return False

    def _lease_is_stale(self, path: str) -> bool:
        """A lease whose holder stopped renewing it over a TTL ago (``clear`` removes those only)."""
        lease = LeaseLock(self.fs, path, ttl=self.lease_ttl)
        with contextlib.suppress(OSError):
            return lease.expired(self._read(path, HEAD_BYTES, head=True))
        return False
