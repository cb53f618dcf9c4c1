"""The document cache (kept importable here): see ``homer_integrations.cache`` for its parts.

``DocumentCache`` keeps one compression per document in memory and, optionally, in a store: a
local directory (with a byte budget) or any fsspec URL (``s3://bucket/prefix``).
"""

from homer_integrations.cache import (
    DEFAULT_MEMORY_BUDGET,
    FORMAT_VERSION,
    MANIFEST_FORMAT,
    CacheEntry,
    CacheSource,
    CacheStats,
    DocumentCache,
    DocumentCacheWarning,
    Entry,
    document_from_tensors,
    document_nbytes,
    entry_checksum,
    entry_from_tensors,
)

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
    "document_from_tensors",
    "document_nbytes",
    "entry_checksum",
    "entry_from_tensors",
]
