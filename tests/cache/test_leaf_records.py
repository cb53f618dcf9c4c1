"""``LeafRecords``: the store's record of which leaves each leaf tier holds, a hint that only ever loses reuse."""

from __future__ import annotations

import hashlib

import pytest

from homer_integrations.cache.fsspec_store import FsspecStore
from homer_integrations.cache.leaf_records import LeafRecords
from homer_integrations.cache.local import LocalStore


def leaves(tag: str, n: int = 3) -> list[str]:
    return [hashlib.sha256(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return FsspecStore(f"memory://leaf-records-{tmp_path.name}")


def test_records_round_trip_across_objects_and_clear_removes_them(store) -> None:
    assert LeafRecords(store, "engine").read() == []
    LeafRecords(store, "engine").append("tier-a", leaves("a"))
    LeafRecords(store, "engine").append("tier-b", leaves("b"))
    assert LeafRecords(store, "engine").read() == [("tier-a", leaves("a")), ("tier-b", leaves("b"))]
    assert LeafRecords(store, "another engine").read() == []
    assert LeafRecords(store, "engine", secret=b"k" * 32).read() == [], "a keyed cache checks with its secret"
    store.clear()
    assert store.read_index(LeafRecords(store, "engine").name) is None


def test_bad_lines_are_skipped_and_the_oldest_go_past_the_limit(tmp_path) -> None:
    store = LocalStore(tmp_path)
    records = LeafRecords(store, "engine", limit_bytes=1000)
    records.append("tier-a", leaves("a"))
    (path,) = tmp_path.glob("leaves-*.index")
    good = path.read_bytes()
    path.write_bytes(b"\xff\xfe not json\n" + good.replace(b"tier-a", b"tier-z") + good + b'{"tier": "t"')
    assert records.read() == [("tier-a", leaves("a"))], "unparsable, forged and unfinished lines are skipped"
    for tag in "bcdef":
        records.append(f"tier-{tag}", leaves(tag))
    kept = [tier for tier, _ in records.read()]
    assert len(path.read_bytes()) <= 1000 and kept[-1] == "tier-f" and "tier-a" not in kept
