"""Hostile files in a cache directory (issue 63): FIFOs and links to devices at an entry's names, a
linked lock directory, an oversized manifest, a ``file://`` store whose ``.tmp`` is a file.

Real files on a real disk (``mkfifo``, symbolic links to ``/dev/zero``). The cache reads only regular
files it wrote: it must never block on a FIFO, never read without bound, never create a file outside
its directory; a lookup answers (computing again) with one ``DocumentCacheWarning``. The process's
address space is capped while a device is planted, so a regression fails with ``MemoryError``
instead of eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from homer_integrations import CompressedDocument
from homer_integrations.cache import DocumentCache, DocumentCacheWarning
from homer_integrations.cache.entry import MAX_MANIFEST_BYTES
from homer_integrations.cache.local import LocalStore
from homer_integrations.cli import main
from tests.test_document_cache import Counter

KINDS = ["fifo", "zero", "urandom", "outside"]
"""What is planted at an entry's name: a FIFO, links to two devices, a link to a regular file outside the directory."""


@pytest.fixture
def doc(cache_docs: list[CompressedDocument]) -> CompressedDocument:
    return cache_docs[0]


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def capped_memory() -> Iterator[None]:
    """At most 1 GiB more address space than the process has now, for the duration of the test."""
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + (1 << 30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def plant(path: Path, kind: str, outside: Path) -> None:
    """``kind`` at ``path``; ``outside`` is a regular file elsewhere (a copy of what belongs at ``path``)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "outside":
        path.symlink_to(outside)
    else:
        path.symlink_to(f"/dev/{kind}")


def stored(directory: Path, doc: CompressedDocument) -> tuple[Path, Path]:
    """``doc`` written by the cache itself into ``directory``: (safetensors, manifest)."""
    DocumentCache(directory).get_or_compute(doc.key, Counter(doc))
    tensors, manifest = LocalStore(directory).paths(doc.key)
    assert tensors.is_file() and manifest.is_file()
    return tensors, manifest


# ----------------------------------------------------------------------------- FIFOs and devices (defects 3, 4)
@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["manifest", "tensors"])
def test_a_special_file_at_an_entrys_name_is_never_read(
    directory: Path, tmp_path: Path, doc: CompressedDocument, capped_memory: None, which: str, kind: str
) -> None:
    tensors, manifest = stored(directory, doc)
    target = manifest if which == "manifest" else tensors
    outside = tmp_path / f"copy{target.suffix}"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    plant(target, kind, outside)

    compute = Counter(doc)
    with pytest.warns(DocumentCacheWarning, match="not a regular file") as caught:
        assert DocumentCache(directory).get_or_compute(doc.key, compute)[1] == "computed"
    assert compute.calls == 1 and len(caught) == 1
    assert not target.is_symlink() and target.is_file(), "the entry is written again as a regular file"
    assert outside.read_bytes() and not any(p.is_symlink() for p in directory.iterdir())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DocumentCache(directory).get_or_compute(doc.key, Counter(doc))[1] == "disk"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
def test_listing_and_clearing_never_read_a_special_file(
    directory: Path, tmp_path: Path, doc: CompressedDocument, capped_memory: None, kind: str
) -> None:
    tensors, manifest = stored(directory, doc)
    outside = tmp_path / "copy.json"
    outside.write_bytes(manifest.read_bytes())
    named = directory / f"{'b' * 64}.json"  # another key's manifest name
    plant(named, kind, outside)
    cache = DocumentCache(directory)
    assert [e.key for e in cache.entries()] == [doc.key]
    assert cache.stats().disk_entries == 1
    assert cache.clear() == 1
    assert not tensors.exists() and not manifest.exists()
    assert named.is_symlink() or named.exists(), "what the cache did not write stays"
    assert outside.read_bytes()


# ----------------------------------------------------------------------------- the lock directory (defect 5)
def test_a_linked_lock_directory_never_makes_files_elsewhere(
    directory: Path, tmp_path: Path, doc: CompressedDocument
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (directory / "locks").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(DocumentCacheWarning, match="locks.*not a directory of the cache's own"):
        assert DocumentCache(directory).get_or_compute(doc.key, Counter(doc)) == (doc, "computed")
    budgeted = LocalStore(directory, budget_bytes=1 << 30)
    with pytest.raises(OSError, match="not a directory of the cache's own"):
        budgeted.trim(0)
    with pytest.warns(DocumentCacheWarning):
        DocumentCache(budgeted).get_or_compute(doc.key, Counter(doc))
    DocumentCache(directory).clear()
    assert list(elsewhere.iterdir()) == [], "no lock file was made outside the cache directory"


def test_a_linked_lock_file_is_never_opened(directory: Path, tmp_path: Path, doc: CompressedDocument) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    locks = directory / "locks"
    locks.mkdir()
    (locks / f"{doc.key}.lock").symlink_to(victim)
    with pytest.warns(DocumentCacheWarning, match="not a regular file"):
        assert DocumentCache(directory).get_or_compute(doc.key, Counter(doc))[1] == "computed"
    DocumentCache(directory).clear()
    assert victim.read_text() == "keep me"


# ----------------------------------------------------------------------------- an oversized manifest (defect 6)
def pad_manifest(manifest: Path, where: str) -> int:
    """Grow ``manifest`` past the limit with its key and checksum intact; its new size."""
    raw = manifest.read_bytes()
    if where == "end":
        padded = raw + b" " * (MAX_MANIFEST_BYTES + 4096)
    else:  # a field ahead of the format: only the name says whose file it is
        padded = json.dumps({"padding": "x" * (MAX_MANIFEST_BYTES + 4096), **json.loads(raw)}).encode()
    manifest.write_bytes(padded)
    return len(padded)


@pytest.mark.parametrize("where", ["end", "start"])
def test_an_oversized_manifest_is_never_served_and_is_listed_and_cleared(
    directory: Path, doc: CompressedDocument, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    tensors, manifest = stored(directory, doc)
    pad_manifest(manifest, where)
    compute = Counter(doc)
    with pytest.warns(DocumentCacheWarning, match="over the 1,048,576-byte limit"):
        assert DocumentCache(directory).get_or_compute(doc.key, compute) == (doc, "computed")
    assert compute.calls == 1 and manifest.stat().st_size < MAX_MANIFEST_BYTES, "recomputed and stored afresh"

    size = pad_manifest(manifest, where) + tensors.stat().st_size
    foreign = directory / "data.json"  # a large JSON file of someone else's
    foreign.write_text(json.dumps(list(range(300_000))))
    assert foreign.stat().st_size > MAX_MANIFEST_BYTES
    argv = ["--cache-dir", str(directory)]
    assert main(["cache", "ls", "--json", *argv]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert main(["cache", "ls", *argv]) == 0
    table = capsys.readouterr().out
    assert main(["cache", "clear", *argv]) == 0
    cleared = capsys.readouterr().out
    assert [(e["key"], e["disk_bytes"]) for e in listed] == [(doc.key, size)]
    assert "over the 1,048,576-byte limit" in listed[0]["error"]
    assert doc.key[:12] in table and "unusable" in table and "over the 1,048,576-byte limit" in table
    assert cleared.startswith("removed 1 cached document(s)")
    assert not manifest.exists() and not tensors.exists() and foreign.exists()


@pytest.mark.parametrize("where", ["end", "start"])
def test_cache_rm_removes_an_oversized_manifest_it_lists(
    directory: Path, doc: CompressedDocument, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """``cache ls`` lists a manifest too large to read as unusable; ``cache rm`` by its key removed nothing
    (issue 82, item 10): the removal read the manifest whole to learn whose it was."""
    tensors, manifest = stored(directory, doc)
    pad_manifest(manifest, where)
    foreign = directory / "data.json"  # someone else's large JSON file stays
    foreign.write_text(json.dumps(list(range(300_000))))
    argv = ["--cache-dir", str(directory)]
    assert main(["cache", "rm", doc.key[:12], *argv]) == 0
    assert capsys.readouterr().out.startswith("removed 1 cached document(s)")
    assert not manifest.exists() and not tensors.exists() and foreign.exists()
    assert not LocalStore(directory).discard("data"), "a foreign oversized file is not the cache's to remove"


def test_a_url_store_discards_an_oversized_manifest_of_its_own(tmp_path: Path, doc: CompressedDocument) -> None:
    root = tmp_path / "store"
    cache = DocumentCache(root.as_uri())
    cache.get_or_compute(doc.key, Counter(doc))
    manifest = next(root.glob("*.json"))
    pad_manifest(manifest, "start")
    assert cache.discard(doc.key) and not list(root.glob("*.json")) and not list(root.glob("*.safetensors"))


# ----------------------------------------------------------------------------- file:// store (defect 9)
def test_a_file_where_a_file_store_keeps_its_temporary_folder(tmp_path: Path, doc: CompressedDocument) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / ".tmp").write_text("mine")
    cache = DocumentCache(root.as_uri())
    with pytest.warns(DocumentCacheWarning, match="memory only"):
        assert cache.get_or_compute(doc.key, Counter(doc)) == (doc, "computed")
    cache.clear()
    assert (root / ".tmp").read_text() == "mine"
