"""``LeafRecords``: which leaves the leaf tiers of one engine hold, kept in the store beside them.

A leaf tier's leaves are named by content keys (``homer.leaf_reuse``); an engine remembers them in
memory for the tiers it built or read. This record carries them across processes: one index file per
engine identity (``leaves-<32 hex>.index``, ``Store.read_index``), one JSON line per tier built,
``{"tier": key, "leaves": [content key, ...], "check": ...}``, rewritten whole under the file's lock
when a tier is added (the oldest lines go once it passes ``limit_bytes``).

It is a hint, never trusted for more than finding a tier: ``check`` is a sha256 over the line's tier
key and leaves (in a keyed cache an HMAC with its secret, as entries carry), and a line that fails it,
or does not parse, is skipped. A missing, corrupt or unwritable file only loses reuse; a tier the
line names that the store no longer holds (evicted, removed) is simply not found.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re

from homer_integrations.cache.flight import LockTimeout
from homer_integrations.cache.secret import entry_mac
from homer_integrations.cache.store_base import Store

logger = logging.getLogger(__name__)

HEX64 = re.compile(r"[0-9a-f]{64}")


class LeafRecords:
    """The content keys of the leaf tiers of engine ``identity`` (any string naming it: a tier key of no
    text) stored in ``store``; ``secret``: a keyed cache's."""

    def __init__(self, store: Store, identity: str, secret: bytes | None = None, limit_bytes: int = 4 << 20) -> None:
        self.store, self.secret, self.limit_bytes = store, secret, limit_bytes
        self.name = "leaves-" + hashlib.sha256(identity.encode()).hexdigest()[:32]

    def read(self) -> list[tuple[str, list[str]]]:
        """(tier key, content key of each of its leaves) of every line that passes its check. Never raises."""
        try:
            raw = self.store.read_index(self.name)
        except (OSError, ValueError) as exc:
            logger.info("cannot read the leaf index %s: %s", self.name, exc)
            return []
        found = []
        for line in (raw or b"").splitlines():
            try:
                record = json.loads(line)
                tier, leaves = record["tier"], record["leaves"]
            except (ValueError, UnicodeDecodeError, TypeError, KeyError):
                continue
            if not (isinstance(tier, str) and isinstance(leaves, list) and all(isinstance(k, str) for k in leaves)):
                continue
            if all(HEX64.fullmatch(k) for k in leaves) and record.get("check") == self._check(tier, leaves):
                found.append((tier, leaves))
        return found

    def append(self, tier: str, leaves: list[str]) -> None:
        """Record that the tier stored under ``tier`` holds leaves with content keys ``leaves`` (best effort)."""
        line = json.dumps({"tier": tier, "leaves": leaves, "check": self._check(tier, leaves)}).encode() + b"\n"
        try:
            lock = self.store.lock(self.name, 10.0)
            lock.acquire()
        except (OSError, LockTimeout) as exc:
            logger.info("leaf index %s not updated: %s", self.name, exc)
            return
        try:
            try:
                lines = (self.store.read_index(self.name) or b"").splitlines(keepends=True)
            except (OSError, ValueError):
                lines = []  # unreadable: started again
            lines = [x for x in lines if x.endswith(b"\n")] + [line]
            while len(lines) > 1 and sum(map(len, lines)) > self.limit_bytes:
                lines = lines[len(lines) // 2 :]  # the newest half stays
            self.store.write_index(self.name, b"".join(lines))
        except (OSError, ValueError) as exc:
            logger.info("leaf index %s not updated: %s", self.name, exc)
        finally:
            with contextlib.suppress(OSError):
                lock.release()

    def _check(self, tier: str, leaves: list[str]) -> str:
        digest = hashlib.sha256("\0".join([tier, *leaves]).encode("utf-8", "surrogatepass")).hexdigest()
        return digest if self.secret is None else entry_mac(self.secret, tier, digest)
