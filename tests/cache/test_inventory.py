"""``Inventory``: what memory and a store hold, listed, sized and removed, on real compressed documents."""

from __future__ import annotations

from pathlib import Path

from homer_integrations import CompressedDocument
from homer_integrations.cache import DocumentCache, MemoryLRU
from homer_integrations.cache.inventory import Inventory
from tests.test_document_cache import Counter


def test_an_entry_in_memory_and_in_the_store_is_listed_once(
    tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    a, b = cache_docs[:2]
    writer = DocumentCache(tmp_path)
    writer.get_or_compute(a.key, Counter(a))  # a is in the store
    memory = MemoryLRU(10**9)
    memory.put(a.key, a, "a.txt")
    memory.put(b.key, b, None)
    inventory = Inventory(memory, writer.store)
    entries = {e.key: e for e in inventory.entries()}
    assert set(entries) == {a.key, b.key}
    assert entries[a.key].in_memory and entries[a.key].on_disk and entries[a.key].label == "a.txt"
    assert entries[b.key].in_memory and not entries[b.key].on_disk
    assert a.key in inventory and "missing" not in inventory
    sizes = inventory.sizes()
    assert (sizes["entries"], sizes["disk_entries"]) == (2, 1) and sizes["disk_bytes"] > 0
    assert inventory.discard(a.key) and a.key not in inventory and not inventory.discard(a.key)
    assert inventory.clear(memory=True, disk=True) == 1 and inventory.entries() == []


def test_memory_only_has_no_store_to_trim_or_clear(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    memory = MemoryLRU(10**9)
    memory.put(doc.key, doc, None)
    inventory = Inventory(memory, None)
    assert inventory.trim(0) == 0 and inventory.clear(memory=False, disk=True) == 0 and doc.key in inventory
    assert inventory.sizes()["disk_entries"] == 0
