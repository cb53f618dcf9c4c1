"""Orphaned files in a cache directory (issue 82, item 10): leaves no stored tier lists and tensors files with no
manifest were listed by nothing, counted by nothing and removed only by ``cache clear``.

A real content-split store (a tiny random-weight model, two versions of a text that share most leaves); a tier
removed as an eviction removes it leaves its own leaves to no one. ``cache ls`` counts them in one line, ``cache
rm --orphans`` removes exactly them, the budget evicts them before any entry, and a file a live writer may still
claim (its key's lock held, or written since the oldest held lock was taken) stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from homer_integrations.cache import DocumentCache
from homer_integrations.cache.local import LocalStore
from homer_integrations.cli.common import human_bytes
from tests.conftest import REPO, mode_engine
from tests.homer.leaves import test_leaf_reuse
from tests.homer.leaves.test_leaf_reuse import counted, store_engine, tier_of
from tests.homer.leaves.tier_helpers import assert_same_tier
from tests.test_cli import run_cli

HOUR = 3600
versions = test_leaf_reuse.versions  # a fixture: two versions of a text, one paragraph apart


def age(directory: Path, seconds: float, *paths: Path) -> None:
    """Set the times of ``paths`` (default: every file in ``directory``, locks included) ``seconds`` into the past."""
    then = time.time() - seconds
    for path in paths or [p for p in directory.rglob("*") if p.is_file()]:
        os.utime(path, (then, then))


@pytest.fixture
def orphaned(tokenizer, calibration, versions, novel, tmp_path):
    """A store holding v2's content-split tier and the leaves of v1's and of another text's, whose tiers were
    evicted: (the directory, the leaves no tier lists now (the first of them without its manifest), v2's leaves)."""
    v1, v2 = versions
    other = novel[60_000:64_000]
    engine = store_engine(tokenizer, calibration, tmp_path)
    for text in (v1, v2, other):
        engine.cache_document(text)
    one, two, three = (set(tier_of(engine, text).leaf_keys) for text in (v1, v2, other))
    store = engine.document_cache.store
    for text in (v1, other):
        assert store.remove(engine.entry_key(text))  # as an eviction does: the tier goes, its leaves stay
    own = sorted((one | three) - two)
    assert one - two and len(own) >= 4, "the edit changed a few leaves and kept the rest"
    store.paths(own[0])[1].unlink()  # a writer killed between its two renames: a tensors file alone
    age(tmp_path, HOUR)
    return tmp_path, own, two


def files_of(store: LocalStore, keys) -> set[Path]:
    return {p for key in keys for p in store.paths(key) if p.exists()}


def test_ls_counts_the_orphans_and_rm_orphans_removes_exactly_them(
    capsys, tokenizer, calibration, versions, orphaned, monkeypatch
):
    directory, own, two = orphaned
    store = LocalStore(directory)
    gone = files_of(store, own)
    kept = {p for p in directory.iterdir() if p.is_file()} - gone
    freed = sum(p.stat().st_size for p in gone)
    assert len(gone) == 2 * len(own) - 1
    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(directory))
    lines = out.splitlines()
    assert code == 0 and lines[-2].startswith(f"1 document(s) and {len(two)} leaves their tiers share")
    assert lines[-1] == (
        f"{len(own)} orphaned file(s) no document needs, {human_bytes(freed)}: `cache rm --orphans` removes them"
    )
    code, out, _ = run_cli(capsys, "cache", "rm", "--orphans", "--cache-dir", str(directory))
    assert code == 0 and out == f"removed {len(own)} orphaned file(s), {human_bytes(freed)}, from {directory}\n"
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(directory))
    assert "orphaned" not in out
    reader = store_engine(tokenizer, calibration, directory)  # the tier that lists its leaves: whole, read
    computed = counted(monkeypatch)
    assert reader.cache_document(versions[1])[1] == "disk" and computed == []
    assert_same_tier(
        tier_of(reader, versions[1]), tier_of(mode_engine(tokenizer, calibration, split="content"), versions[1])
    )
    code, out, _ = run_cli(capsys, "cache", "rm", "--orphans", "--cache-dir", str(directory), "--json")
    assert code == 0 and '"orphans_removed": 0' in out


def test_rm_orphans_takes_no_documents_and_needs_a_local_directory(capsys, tmp_path) -> None:
    code, _, err = run_cli(capsys, "cache", "rm", "book.txt", "--orphans", "--cache-dir", str(tmp_path))
    assert code == 1 and "--orphans goes with `cache rm` alone" in err
    code, _, err = run_cli(capsys, "cache", "ls", "--orphans", "--cache-dir", str(tmp_path))
    assert code == 1 and "--orphans goes with `cache rm` alone" in err
    code, _, err = run_cli(capsys, "cache", "rm", "--orphans", "--store", "memory://orphans/documents")
    assert code == 1 and "found in a local cache directory" in err


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from homer_integrations.cache.local import LocalStore

    store = LocalStore(Path(sys.argv[1]))
    locks = [store.lock(key, None) for key in sys.argv[2:]]
    for lock in locks:
        lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    """
)


def test_what_a_live_writer_may_still_claim_stays(orphaned) -> None:
    """A process holds the lock of one orphan's key (its writer), and the lock of a tier it has been building for
    half an hour: that orphan stays, and so does a leaf it wrote since (a tier lists its leaves only once written);
    the orphans older than its lock go. Once it lets go, the rest go too."""
    directory, own, two = orphaned
    store = LocalStore(directory)
    held, written = own[1], own[2]
    building = "b" * 64
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), held, building],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        age(directory, HOUR / 2, directory / "locks" / f"{building}.lock")  # taken half an hour ago
        age(directory, HOUR / 4, *store.paths(written))  # written by that build since
        names = {orphan.name for orphan in store.orphans()}
        assert names == set(own) - {held, written}
        removed = {orphan.name for orphan in store.remove_orphans()}
        assert removed == names and files_of(store, [held, written]) and not files_of(store, names)
    finally:
        holder.communicate("", timeout=60)
    assert {orphan.name for orphan in store.remove_orphans()} == {held, written}
    assert not files_of(store, own) and len(files_of(store, two)) == 2 * len(two)


def test_a_fresh_leaf_of_a_build_under_way_in_this_process_is_no_orphan(orphaned) -> None:
    """The budget evicts orphans first, also while this process builds a tier (its lock held here): a leaf that
    build wrote is not listed yet, and must stay."""
    directory, own, _ = orphaned
    store = LocalStore(directory)
    lock = store.lock("c" * 64, None)
    lock.acquire()
    try:
        age(directory, 0, *store.paths(own[1]))  # written now, by the build that holds the lock
        assert own[1] not in {orphan.name for orphan in store.orphans()}
    finally:
        lock.release()


def test_the_budget_evicts_orphans_before_any_entry(orphaned) -> None:
    """Orphans go first, however recently written, and a tensors file with no manifest counts against the budget:
    it was invisible to the budget, and the least recently used documents went before leaves nothing reads."""
    directory, own, two = orphaned
    store = LocalStore(directory)
    age(directory, 2 * HOUR, *[p for p in directory.glob("*") if p.is_file()])
    age(directory, HOUR, *files_of(store, own))  # the orphans were used more recently than every entry
    everything = sum(p.stat().st_size for p in directory.glob("*") if p.is_file())
    orphans = sum(p.stat().st_size for p in files_of(store, own))
    assert store.trim(everything - orphans) == [], "no entry evicted"
    assert not files_of(store, own) and len(files_of(store, two)) == 2 * len(two)
    assert sum(p.stat().st_size for p in directory.glob("*") if p.is_file()) == everything - orphans


def test_a_document_cache_names_and_removes_its_orphans(orphaned) -> None:
    directory, own, _ = orphaned
    cache = DocumentCache(directory)
    assert sorted(orphan.name for orphan in cache.orphans()) == own
    assert len(cache.remove_orphans()) == len(own) and cache.orphans() == []
    assert DocumentCache("memory://orphans/none").orphans() is None
