"""A disk that fills while an entry or a leaf tier is written (issue 63): one clear warning that says the
disk is full, the answer still given (the entry kept in memory), no temporary file left behind, and every
other entry still served.

The full disk is ``OSError(ENOSPC)`` raised where the kernel would raise it, inside the cache's own write
path: ``os.posix_fallocate`` (a leaf tier's staged file, ``staged.py``), ``os.fsync`` (each staged file
before it is renamed in, ``local.py``), safetensors' serialisation (``EntryCodec``), fsspec's upload.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.cache import entry as entry_module
from homer_integrations.cache.stored import DocumentCacheWarning
from tests.test_document_cache import assert_same_tensors

QUESTION = "Who wrote the letter?"
FULL = r"could not write the document cache entry .*: the disk is full \(.*No space left on device.*\); "


def disk_full(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_after(calls: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` for the first ``calls`` calls, then a full disk."""
    seen = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] > calls:
            disk_full()
        return real(*args, **kwargs)

    return call


def leftovers(directory: Path) -> list[str]:
    """Temporary files anywhere under ``directory`` (a local store's ``.*.tmp``, fsspec's ``.tmp/``)."""
    found = [p for p in directory.rglob("*") if p.is_file() and (p.name.endswith(".tmp") or ".tmp" in p.parts)]
    return sorted(str(p.relative_to(directory)) for p in found)


def stored_keys(directory: Path) -> set[str]:
    return {p.stem for p in directory.glob("*.json")}


@pytest.fixture
def stored(tmp_path: Path, cache_engine: HomerModel, cache_texts: list[str]) -> tuple[Path, CompressedDocument]:
    """A cache directory that holds one entry (``cache_texts[0]``'s root), and that root."""
    directory = tmp_path / "cache"
    written = cache_engine.with_store(DocumentCache(directory, memory_budget_bytes=0)).compress(cache_texts[0])
    assert len(stored_keys(directory)) == 1
    return directory, written


def same_tensors(a: CompressedDocument, b: CompressedDocument) -> None:
    """The same cache (every tensor bit-exact); the timings in the stats may differ."""
    ta, tb = a.to_tensors()[0], b.to_tensors()[0]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[name], tb[name]) for name in ta)


def still_served(directory: Path, engine: HomerModel, text: str, doc: CompressedDocument) -> None:
    """A fresh cache over ``directory`` (a restarted program) serves ``text``'s entry from disk."""
    fresh = engine.with_store(DocumentCache(directory))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_tensors(fresh.compress(text), doc)
    assert fresh.stats().hits_disk == 1 and fresh.stats().computations == 0


@pytest.mark.parametrize(
    ("where", "patch"),
    [
        ("the tensors' serialisation", "save_file"),
        ("the tensors' fsync", "fsync:0"),
        ("the manifest's fsync", "fsync:1"),
    ],
)
def test_a_root_whose_write_fills_the_disk_is_kept_in_memory_and_nothing_else_changes(
    stored: tuple[Path, CompressedDocument],
    cache_engine: HomerModel,
    cache_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    patch: str,
) -> None:
    directory, first = stored
    before = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}
    if patch == "save_file":
        real_save = entry_module.save_safetensors_file

        def half_then_full(tensors: Any, path: Path, metadata: Any = None) -> None:
            real_save(tensors, path, metadata)
            with open(path, "r+b") as f:  # what a full disk leaves: the first part of the file
                f.truncate(os.path.getsize(path) // 2)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(entry_module, "save_safetensors_file", half_then_full)
    else:
        monkeypatch.setattr(os, "fsync", full_after(int(patch[-1]), os.fsync))
    engine = cache_engine.with_store(DocumentCache(directory))
    with pytest.warns(DocumentCacheWarning, match=FULL + "keeping it in memory only"):
        second = engine.compress(cache_texts[1])
    monkeypatch.undo()
    same_tensors(second, cache_engine.compress(cache_texts[1]))  # the answer is given from memory
    assert engine.stats().computations == 1 and engine.compress(cache_texts[1]) is second
    assert leftovers(directory) == [], where
    assert {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()} == before, "nothing else changed"
    still_served(directory, cache_engine, cache_texts[0], first)


def test_a_budgeted_store_evicts_nothing_for_an_entry_the_full_disk_refuses(
    stored: tuple[Path, CompressedDocument],
    cache_engine: HomerModel,
    cache_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a budget that holds one entry, writing a second would evict the first: the disk fills while the
    second is staged, before anything is evicted, so the first stays."""
    directory, first = stored
    budget = sum(p.stat().st_size for p in directory.iterdir() if p.is_file()) + 1000
    monkeypatch.setattr(os, "fsync", full_after(1, os.fsync))  # the manifest's fsync
    engine = cache_engine.with_store(DocumentCache(directory, disk_budget_bytes=budget))
    with pytest.warns(DocumentCacheWarning, match=FULL):
        engine.compress(cache_texts[1])
    monkeypatch.undo()
    assert leftovers(directory) == [] and len(stored_keys(directory)) == 1
    still_served(directory, cache_engine, cache_texts[0], first)


def test_a_leaf_tier_whose_file_cannot_be_reserved_is_built_in_memory_then_kept_there(
    stored: tuple[Path, CompressedDocument],
    cache_engine: HomerModel,
    cache_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tier's staged file is reserved whole (``posix_fallocate``) before the build writes into it: a full
    disk says so there (no SIGBUS later), the tier is built in memory, and its write fails the same way."""
    directory, first = stored
    monkeypatch.setattr(os, "posix_fallocate", disk_full, raising=False)
    monkeypatch.setattr(os, "fsync", disk_full)
    engine = cache_engine.with_store(DocumentCache(directory))
    with pytest.warns(DocumentCacheWarning, match=FULL):
        aware = engine.compress(cache_texts[1], question=QUESTION, mode="query_aware")
    monkeypatch.undo()
    assert "building the leaf tier" in caplog.text and "in memory" in caplog.text
    assert aware.question == QUESTION and aware.num_tokens > 0
    assert leftovers(directory) == [] and len(stored_keys(directory)) == 1
    still_served(directory, cache_engine, cache_texts[0], first)


def test_a_leaf_tier_built_in_its_file_whose_manifest_fills_the_disk_is_removed_and_still_answers(
    stored: tuple[Path, CompressedDocument],
    cache_engine: HomerModel,
    cache_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tier was built straight into its reserved file; the disk fills as its manifest is staged. The
    file goes (the tier stays readable through its mapping) and the question is answered."""
    directory, first = stored
    monkeypatch.setattr(os, "fsync", full_after(1, os.fsync))  # the tier file's fsync passes, the manifest's fails
    engine = cache_engine.with_store(DocumentCache(directory))
    with pytest.warns(DocumentCacheWarning, match=FULL):
        answer = engine.answer(cache_texts[1], QUESTION, mode="query_aware", max_new_tokens=3)
    monkeypatch.undo()
    assert answer == cache_engine.answer(cache_texts[1], QUESTION, mode="query_aware", max_new_tokens=3)
    assert leftovers(directory) == [] and len(stored_keys(directory)) == 1
    still_served(directory, cache_engine, cache_texts[0], first)


def test_a_label_rewrite_on_a_full_disk_keeps_the_old_manifest(
    stored: tuple[Path, CompressedDocument],
    cache_engine: HomerModel,
    cache_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory, first = stored
    (manifest,) = directory.glob("*.json")
    before = manifest.read_bytes()
    cache = DocumentCache(directory)
    monkeypatch.setattr(os, "fsync", disk_full)
    assert cache.set_label(manifest.stem, "book.txt") is False
    monkeypatch.undo()
    assert manifest.read_bytes() == before and leftovers(directory) == []
    still_served(directory, cache_engine, cache_texts[0], first)


def test_an_fsspec_upload_that_fills_the_disk_leaves_no_temporary_file(
    tmp_path: Path, cache_engine: HomerModel, cache_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file://``: each file is uploaded under ``.tmp/`` and renamed in; a full disk halfway through the
    upload removes the half-written file."""
    from fsspec.implementations.local import LocalFileSystem

    root = tmp_path / "store"
    engine = cache_engine.with_store(DocumentCache(root.as_uri()))
    first = engine.compress(cache_texts[0])
    real_put = LocalFileSystem.put_file

    def half_then_full(self: Any, lpath: str, rpath: str, **kwargs: Any) -> None:
        real_put(self, lpath, rpath, **kwargs)
        with open(self._strip_protocol(rpath), "r+b") as f:
            f.truncate(os.path.getsize(lpath) // 2)
        disk_full()

    monkeypatch.setattr(LocalFileSystem, "put_file", half_then_full)
    with pytest.warns(DocumentCacheWarning, match=FULL):
        engine.compress(cache_texts[1])
    monkeypatch.undo()
    assert leftovers(root) == [] and len(stored_keys(root)) == 1
    fresh = cache_engine.with_store(DocumentCache(root.as_uri()))
    same_tensors(fresh.compress(cache_texts[0]), first)
    assert fresh.stats().hits_disk == 1


def test_a_content_split_tier_whose_leaves_fill_the_disk_is_kept_in_memory_and_its_stored_leaves_serve_later(
    tokenizer, calibration, novel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each leaf is an entry of its own, written as the build finishes it: the disk fills at the fourth leaf
    (two fsyncs a leaf); that write warns once, the rest of the tier is kept in memory and its whole write
    fails the same way. The leaves stored before serve the next build once the disk has room."""
    from tests.homer.leaves.test_leaf_reuse import counted, store_engine, tier_of

    text, directory = novel[20_000:24_000], tmp_path / "cache"
    monkeypatch.setattr(os, "fsync", full_after(6, os.fsync))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = store_engine(tokenizer, calibration, directory).answer(text, QUESTION, max_new_tokens=3)
    monkeypatch.undo()
    full = [w for w in caught if issubclass(w.category, DocumentCacheWarning)]
    assert len(full) == 1 and "the disk is full" in str(full[0].message), full  # the leaf's and tier's writes: once
    assert leftovers(directory) == []
    reader = store_engine(tokenizer, calibration, directory)
    computed = counted(monkeypatch)
    assert reader.answer(text, QUESTION, max_new_tokens=3) == answer
    assert len(computed) == tier_of(reader, text).plan.num_leaves - 3, "the three leaves stored before are read"
