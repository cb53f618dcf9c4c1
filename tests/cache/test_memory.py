"""``MemoryLRU`` on real compressed documents."""

from __future__ import annotations

import pytest

from homer_integrations import CompressedDocument
from homer_integrations.cache.entry import document_nbytes
from homer_integrations.cache.memory import MemoryLRU


def test_least_recently_used_goes_first_within_the_budget(cache_docs: list[CompressedDocument]) -> None:
    a, b, c, _ = cache_docs
    size = max(document_nbytes(d) for d in cache_docs)
    lru = MemoryLRU(int(size * 2.5))
    assert lru.put(a.key, a, "a") and lru.put(b.key, b, None)
    assert lru.get(a.key).doc is a  # a is now the most recent
    assert lru.put(c.key, c, None)  # b goes
    assert lru.keys() == [a.key, c.key] and lru.evictions == 1
    assert lru.nbytes == document_nbytes(a) + document_nbytes(c) <= lru.budget_bytes
    assert lru.get(b.key) is None


def test_an_entry_over_the_budget_is_not_kept(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    lru = MemoryLRU(document_nbytes(doc) - 1)
    assert not lru.put(doc.key, doc, None)
    assert len(lru) == 0 and lru.nbytes == 0
    with pytest.raises(ValueError):
        MemoryLRU(-1)


def test_unverified_slots_are_dropped_when_a_verified_one_is_asked_for(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    lru = MemoryLRU(10**9)
    lru.put(doc.key, doc, "label", unverified=True)
    assert lru.get(doc.key) is not None
    assert lru.get(doc.key, verified=True) is None and doc.key not in lru and lru.nbytes == 0


def test_labels_survive_a_put_without_one_and_clear_empties(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    lru = MemoryLRU(10**9)
    lru.put(doc.key, doc, "book.txt")
    created = lru.get(doc.key).created
    lru.put(doc.key, doc, None)
    slot = lru.get(doc.key)
    assert slot.label == "book.txt" and slot.created == created
    assert lru.relabel(doc.key, "other.txt") and lru.get(doc.key).label == "other.txt"
    assert not lru.relabel("missing", "x")
    assert lru.clear() == [doc.key] and lru.nbytes == 0 and lru.pop(doc.key) is None
