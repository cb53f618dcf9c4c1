"""``DocumentKeys``: the document-cache key of every kind of entry one engine makes.

A key is a sha256 over what the entry depends on, its affixes and its document text. Every key
holds the model's identity (sampled weights, tokenizer, dtype) and the algorithm version; a
compressed root adds the HOMER settings, scoring and calibration; a leaf tier only what the
leaves' layers depend on; a ``full`` (uncompressed) entry nothing more. A document text is
hashed once per engine (``TextDigests``), however many questions ask about it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from homer_integrations.homer.document.prompt import markup
from homer_integrations.homer.model.fingerprint import TextDigests


class DocumentKeys:
    """Keys of one engine's entries.

    ``identity``: model, tokenizer, dtype and algorithm version; ``root`` and ``tier``: what a compressed
    root and a leaf tier depend on beyond that (JSON-serialisable dicts).
    """

    def __init__(self, identity: dict[str, Any], root: dict[str, Any], tier: dict[str, Any]) -> None:
        self._identity, self._root, self._tier = identity, root, tier
        self._digests = TextDigests()

    def root(self, prefix: str, document: str, suffix: str) -> str:
        """Key of the compressed root of ``document`` between ``prefix`` and ``suffix``."""
        return self._key(self._root, prefix, document, suffix)

    def full(self, prefix: str, document: str, suffix: str) -> str:
        """Key of a ``full`` (uncompressed) entry: no HOMER setting changes it."""
        return self._key({"settings": {"kind": "full"}}, prefix, document, suffix)

    def tier(self, prefix: str, document: str) -> str:
        """Key of a leaf tier: no scorer, no suffix."""
        return self._key(self._tier, prefix, document, "")

    def _key(self, parts: dict[str, Any], prefix: str, document: str, suffix: str) -> str:
        parts = {
            **parts,
            **self._identity,
            "prefix": markup(prefix).segments,  # markup and content spelling the same text tokenize apart
            "suffix": markup(suffix).segments,
        }
        h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
        h.update(b"\0")
        h.update(self._digests(document))
        return h.hexdigest()
