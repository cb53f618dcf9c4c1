"""Records of stored documents beside a store's entries: a rerun skips them without a model."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from homer_integrations.cache.entry import own_manifest
from homer_integrations.cache.flight import replace_file
from homer_integrations.cache.store import Store

logger = logging.getLogger(__name__)
LEDGER_DIR = "corpus"


class CorpusLedger:
    """Records of stored documents under ``corpus/`` beside a store's entries, one small JSON each.

    A record names the entry key of one (job, document text); it counts only while that entry's
    manifest is in the store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fs, root = _filesystem(store)
        self.folder = f"{root}/{LEDGER_DIR}"
        self._made = False

    @staticmethod
    def record_name(job: str, text: str) -> str:
        h = hashlib.sha256(job.encode())
        h.update(b"\0")
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def stored(self, records: Iterable[str]) -> set[str]:
        """Those of ``records`` whose entry is in the store now."""
        wanted = set(records)
        with contextlib.suppress(AttributeError):
            self.fs.invalidate_cache(self.folder)
        try:
            present = {p.rstrip("/").rsplit("/", 1)[-1].removesuffix(".json") for p in self.fs.ls(self.folder)}
        except (FileNotFoundError, OSError):
            return set()
        return {r for r in wanted & present if self._entry_present(r)}

    def _entry_present(self, record: str) -> bool:
        try:
            key = json.loads(self.fs.cat_file(f"{self.folder}/{record}.json"))["key"]
            raw = self.store.read_manifest(key)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return raw is not None and own_manifest(raw) is not None

    def write(self, record: str, key: str, label: str) -> None:
        """Record that ``key`` holds the document of ``record`` (best effort: a lost record costs a reload)."""
        data = json.dumps({"key": key, "label": label, "written": time.time()}).encode()
        try:
            if not self._made:
                self.fs.makedirs(self.folder, exist_ok=True)
                self._made = True
            replace_file(self.fs, f"{self.folder}/{record}.json", data)
        except OSError as exc:
            logger.warning("cannot write the corpus record of %s: %s", label, exc)


def _filesystem(store: Store) -> tuple[Any, str]:
    """(fsspec filesystem, root path) of a store's entries."""
    from fsspec.implementations.local import LocalFileSystem

    from homer_integrations.cache.fsspec_store import FsspecStore
    from homer_integrations.cache.local import LocalStore

    if isinstance(store, FsspecStore):
        return store.fs, store.root
    if isinstance(store, LocalStore):
        return LocalFileSystem(), str(store.directory)
    raise TypeError(f"corpus compression needs a LocalStore or FsspecStore, not {type(store).__name__}")
