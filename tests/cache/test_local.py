"""``LocalStore``: the byte budget with least-recently-used eviction, on real files and real processes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from safetensors.torch import save_file

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache, DocumentCacheWarning
from homer_integrations.cache.entry import EntryCodec
from homer_integrations.cache.local import LocalStore
from tests.conftest import REPO
from tests.test_document_cache import Counter, make_engine


def entry_bytes(doc: CompressedDocument) -> int:
    manifest, tensors = EntryCodec.encode(doc.key, doc, None)
    return len(manifest) + len(tensors)


def stored_bytes(directory: Path) -> int:
    """Bytes of entry files in ``directory`` now (temporary files excluded), as ``du`` would count them."""
    total = 0
    for path in directory.iterdir():
        if path.name.startswith(".") or path.suffix not in (".json", ".safetensors"):
            continue
        with contextlib.suppress(FileNotFoundError):  # evicted since the listing
            total += path.stat().st_size
    return total


def test_the_budget_evicts_the_least_recently_used(tmp_path: Path, cache_docs: list[CompressedDocument]) -> None:
    a, b, c, d = cache_docs
    budget = int(max(map(entry_bytes, cache_docs)) * 2.5)
    cache = DocumentCache(tmp_path, disk_budget_bytes=budget, memory_budget_bytes=0)
    for doc in (a, b):
        cache.get_or_compute(doc.key, Counter(doc))
    time.sleep(0.02)
    assert cache.get_or_compute(a.key, Counter(a, before=pytest.fail))[1] == "disk"  # a is now the most recent
    cache.get_or_compute(c.key, Counter(c))  # b goes
    assert {e.key for e in cache.entries()} == {a.key, c.key}
    assert stored_bytes(tmp_path) == cache.stats().disk_bytes <= budget
    cache.get_or_compute(d.key, Counter(d))  # a goes: c was written after a was read
    assert {e.key for e in cache.entries()} == {c.key, d.key} and stored_bytes(tmp_path) <= budget
    assert cache.get_or_compute(b.key, Counter(b))[1] == "computed"


def test_an_entry_over_the_whole_budget_is_kept_in_memory_only(
    tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    doc = cache_docs[0]
    # half the entry: the manifest's timestamp makes its size vary by a few bytes between encodings
    cache = DocumentCache(tmp_path, disk_budget_bytes=entry_bytes(doc) // 2)
    with pytest.warns(DocumentCacheWarning, match="exceed the disk budget"):
        assert cache.get_or_compute(doc.key, Counter(doc)) == (doc, "computed")
    assert stored_bytes(tmp_path) == 0 and cache.get_or_compute(doc.key, Counter(doc))[1] == "memory"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "the staged tensors file went"
    with pytest.raises(ValueError):
        DocumentCache(tmp_path, disk_budget_bytes=-1)


def test_trim_evicts_down_to_a_smaller_budget(tmp_path: Path, cache_docs: list[CompressedDocument]) -> None:
    cache = DocumentCache(tmp_path)
    for doc in cache_docs:
        cache.get_or_compute(doc.key, Counter(doc))
        time.sleep(0.01)
    one = max(map(entry_bytes, cache_docs))
    assert cache.trim(2 * one + one // 2) == 2  # room for two entries, whatever their timestamps spell
    assert {e.key for e in DocumentCache(tmp_path).entries()} == {d.key for d in cache_docs[2:]}
    assert DocumentCache(tmp_path).trim() == 0  # no budget: nothing to do
    assert LocalStore(tmp_path / "missing", budget_bytes=0).trim() == []


_WRITER = """
import sys
from safetensors import safe_open
from safetensors.torch import load_file
from homer_integrations.cache import DocumentCache, document_from_tensors

directory, budget, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cache = DocumentCache(directory, disk_budget_bytes=budget, memory_budget_bytes=0)
for source in sys.argv[4:]:
    with safe_open(source, "pt") as f:
        meta = f.metadata()
    doc = document_from_tensors(load_file(source), meta)
    for i in range(3):
        key = f"{name}-{i}-{doc.key[:16]}"
        cache.get_or_compute(key, lambda: doc)
"""


def test_writers_in_several_processes_never_exceed_the_budget(
    tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    sources = []
    for i, doc in enumerate(cache_docs):
        tensors, meta = doc.to_tensors()
        save_file(tensors, str(tmp_path / f"{i}.safetensors"), meta)
        sources.append(str(tmp_path / f"{i}.safetensors"))
    store = tmp_path / "store"
    one = max(map(entry_bytes, cache_docs))
    budget = int(one * 3.5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store), str(budget), f"p{n}", *sources],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    most = 0
    while any(p.poll() is None for p in procs):
        if store.is_dir():
            most = max(most, stored_bytes(store))
        time.sleep(0.002)
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert most > 0
    assert most <= budget + one  # the target: over by at most one entry
    assert most <= budget  # what this store does: it evicts before it commits
    final = LocalStore(store).listing()
    assert len(final) >= 3 and sum(size for _, size in final) <= budget


def test_the_engine_takes_a_disk_budget(
    tokenizer, cache_calib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_texts: list[str]
) -> None:
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path))
    engine: HomerModel = make_engine(tokenizer, cache_calib, disk_budget=10**9)
    assert engine.document_cache.directory == tmp_path / "documents"
    assert engine.document_cache.info()["disk_budget_bytes"] == 10**9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.answer(cache_texts[0], "Who?", max_new_tokens=2)
    assert engine.document_cache.stats().disk_entries == 1
    with pytest.raises(ValueError, match="not both"):
        make_engine(tokenizer, cache_calib, disk_budget=1, document_cache=DocumentCache())


def test_a_dead_writers_temporary_file_is_reaped_and_a_live_ones_kept(tmp_path: Path) -> None:
    """``kill -9`` during a write left its temporary file forever, unlisted and uncounted (issue 82, item 5)."""
    import os

    from homer_integrations.cache.local import TEMP_NAME, LocalStore

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    store = LocalStore(tmp_path)
    dead = tmp_path / f".{'a' * 64}.safetensors.{dead_pid}.0123abcd.tmp"
    live = tmp_path / f".{'b' * 64}.safetensors.{os.getpid()}.0123abcd.tmp"
    fresh = tmp_path / f".{'c' * 64}.safetensors.{dead_pid}.4567abcd.tmp"
    for path in (dead, live, fresh):
        path.write_bytes(b"x" * 1000)
        assert TEMP_NAME.fullmatch(path.name)
    old = time.time() - 3600
    for path in (dead, live):
        os.utime(path, (old, old))
    assert store.trim() == [] and store.reap_dead_writers() == 0, "trim reaped it already"
    assert not dead.exists(), "its writer is gone and it has not changed for an hour"
    assert live.exists(), "a running writer's file stays, however old"
    assert fresh.exists(), "a file still changing may belong to a writer on another machine"


def test_an_entry_over_the_budget_is_refused_before_anything_is_staged(
    tmp_path: Path, cache_docs: list[CompressedDocument], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was staged whole, then refused: the directory peaked at twice the budget (issue 82, item 4)."""
    from homer_integrations.cache.local import LocalStore
    from homer_integrations.cache.staged import StagedTiers

    def never(*args: object) -> None:
        raise AssertionError("staged although its size was known to exceed the budget")

    monkeypatch.setattr(LocalStore, "staging_file", never)
    doc = cache_docs[0]
    cache = DocumentCache(tmp_path, disk_budget_bytes=entry_bytes(doc) // 2)
    with pytest.warns(DocumentCacheWarning, match="exceed the disk budget"):
        assert cache.get_or_compute(doc.key, Counter(doc)) == (doc, "computed")
    assert list(tmp_path.glob("*.safetensors")) == []
    allocate = StagedTiers(LocalStore(tmp_path, budget_bytes=1000)).allocator("k")
    assert allocate({"k.0": ((1, 2, 300, 8), doc.keys[0].dtype)}) is None, "a tier over the budget builds in memory"
