"""``open_store``: the store for a directory or a URL, and the ``Store`` interface re-exported.

The interface (``Store`` and the names of entry files) lives in ``store_base.py``, below the stores that
implement it (``local.py``, ``fsspec_store.py``); this module picks one of them, so it sits above all three
and none of them imports it. Every name importable from here before the split still is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from homer_integrations.cache.local import LocalStore
from homer_integrations.cache.store_base import (
    KEY_NAME,
    MANIFEST,
    SAFE_NAME,
    TENSORS,
    DiskBudgetError,
    EntryTooLarge,
    Store,
    entry_name,
    oversized_is_ours,
)

__all__ = [
    "KEY_NAME",
    "MANIFEST",
    "SAFE_NAME",
    "TENSORS",
    "DiskBudgetError",
    "EntryTooLarge",
    "Store",
    "entry_name",
    "open_store",
    "oversized_is_ours",
]


def open_store(where: str | Path | Store, *, budget_bytes: int | None = None, **storage_options: Any) -> Store:
    """A store for ``where``: a ``Store`` as is, a URL (``scheme://...``) as ``FsspecStore``, else a local directory.

    ``budget_bytes`` applies to local directories (``LocalStore``) only.
    """
    if isinstance(where, Store):
        return where
    text = str(where)
    if "://" in text:
        if budget_bytes is not None:
            raise DiskBudgetError(
                f"a disk budget applies to a local directory, not to {text}; use the storage's own lifecycle rules"
            )
        from homer_integrations.cache.fsspec_store import FsspecStore  # fsspec loads only for a URL

        return FsspecStore(text, **storage_options)
    return LocalStore(Path(text).expanduser(), budget_bytes=budget_bytes)
