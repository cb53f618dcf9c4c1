"""``Lookup``: a key's way through memory, the store and ``compute``, on real compressed documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from homer_integrations import CompressedDocument
from homer_integrations.cache import MemoryLRU, StoredEntries, open_store
from homer_integrations.cache.lookup import Counters, Lookup
from tests.test_document_cache import Counter


def test_a_key_is_computed_once_then_served_from_memory_and_counted(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    counts = Counters()
    lookup = Lookup(MemoryLRU(10**9), None, counts)
    counter = Counter(doc)
    assert lookup.get_or_compute(doc.key, counter, None, None, None) == (doc, "computed")
    assert lookup.get_or_compute(doc.key, counter, "book.txt", None, None) == (doc, "memory")
    assert counter.calls == 1 and lookup.memory.get(doc.key).label == "book.txt"  # a labelled hit relabels
    assert counts.snapshot() == {"hits_memory": 1, "hits_disk": 0, "misses": 1, "computations": 1, "discarded": 0}
    assert lookup.get(doc.key, None) is doc and lookup.get("missing", None) is None


def test_a_computed_document_is_kept_under_the_key_asked_for(cache_docs: list[CompressedDocument]) -> None:
    lookup = Lookup(MemoryLRU(10**9), None, Counters())
    doc, source = lookup.get_or_compute("another-key", Counter(cache_docs[0]), None, None, None)
    assert source == "computed" and doc.key == "another-key"
    with pytest.raises(TypeError, match="not a CompressedDocument or LeafTier"):
        lookup.get_or_compute("bad", lambda: "text", None, None, None)  # type: ignore[arg-type,return-value]


def test_a_miss_in_memory_is_read_from_the_store(tmp_path: Path, cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    store = open_store(tmp_path)
    counts = Counters()
    Lookup(MemoryLRU(10**9), StoredEntries(store, None, counts.add, None), counts).get_or_compute(
        doc.key, Counter(doc), "a.txt", None, None
    )
    fresh = Lookup(MemoryLRU(10**9), StoredEntries(store, None, counts.add, None), counts)
    loaded, source = fresh.get_or_compute(doc.key, Counter(doc, pytest.fail), None, None, None)
    assert source == "disk" and loaded.key == doc.key and counts.snapshot()["hits_disk"] == 1
    assert fresh.relabel(doc.key, "b.txt") and not fresh.relabel("missing", "c.txt")
