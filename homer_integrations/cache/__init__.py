"""The document cache, in small parts.

- ``entry``: an entry's serial form (manifest JSON + safetensors, key-bound sha256, format version)
  and its verification;
- ``secret``: a keyed cache's secret file and its keyed checksum (HMAC-SHA256) of an entry;
- ``memory``: ``MemoryLRU``, entries in memory within a byte budget;
- ``mapped``: the files memory-mapped entries come from, as they were when mapped, and whether they changed since;
- ``store_base``: the ``Store`` interface (below the stores that implement it);
- ``store``: ``open_store``, a directory or URL's store (above them), and the interface re-exported;
- ``local``: ``LocalStore``, a directory with a byte budget and least-recently-used eviction;
- ``fsspec_store``: ``FsspecStore``, any fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``);
- ``flight``: one computation per key across threads and processes (file locks, leases);
- ``stored``: ``StoredEntries``, a cache's entries in its store (verified reads, the locked miss,
  writes, a leaf tier built into its own file, labels);
- ``lookup``: ``Lookup``, a key's way through memory, the store and compute (one computation per key,
  the counters, the not-kept warning);
- ``inventory``: ``Inventory``, what memory and the store hold (listing, sizes, removal, trimming);
- ``document_cache``: ``DocumentCache``, the façade that composes them.
"""

from homer_integrations.cache.document_cache import DEFAULT_MEMORY_BUDGET, CacheStats, DocumentCache
from homer_integrations.cache.entry import (
    FORMAT_VERSION,
    MANIFEST_FORMAT,
    CacheEntry,
    CacheSource,
    Entry,
    EntryCodec,
    Unusable,
    document_from_tensors,
    document_nbytes,
    entry_checksum,
    entry_from_tensors,
)
from homer_integrations.cache.flight import LeaseLock, LockTimeout, SingleFlight
from homer_integrations.cache.local import LocalStore
from homer_integrations.cache.memory import MemoryLRU
from homer_integrations.cache.store import EntryTooLarge, Store, open_store
from homer_integrations.cache.stored import DocumentCacheWarning, StoredEntries

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "FORMAT_VERSION",
    "MANIFEST_FORMAT",
    "CacheEntry",
    "CacheSource",
    "CacheStats",
    "DocumentCache",
    "DocumentCacheWarning",
    "Entry",
    "EntryCodec",
    "EntryTooLarge",
    "LeaseLock",
    "LocalStore",
    "LockTimeout",
    "MemoryLRU",
    "SingleFlight",
    "Store",
    "StoredEntries",
    "Unusable",
    "document_from_tensors",
    "document_nbytes",
    "entry_checksum",
    "entry_from_tensors",
    "open_store",
]
