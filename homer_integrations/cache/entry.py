"""One cache entry's serial form: a JSON manifest and a safetensors file, and their verification.

The manifest holds a format version, the key, the tensors file's size and a sha256 over the key
and the file (``entry_checksum``: an entry copied under another key fails it), plus what ``cache
ls`` shows. A keyed cache adds ``hmac``, a keyed checksum over the key and that sha256
(``secret.entry_mac``): whoever can write the store can recompute a sha256, not the keyed one.
``EntryCodec.decode`` trusts nothing it reads: any unusable entry raises ``Unusable`` with the
reason. Nothing is ever pickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from safetensors.torch import save_file as save_safetensors_file

from homer_integrations.cache.mapped import MAPPED, FileStamp
from homer_integrations.cache.secret import entry_mac
from homer_integrations.homer.kv.compressed import SERIAL_FORMAT as ROOT_FORMAT
from homer_integrations.homer.kv.compressed import (
    CacheSpec,
    CompressedDocument,
    check_consistent,
    check_layout,
    validate,
)
from homer_integrations.homer.leaves.leaf_entry import SERIAL_FORMAT as LEAF_PIECE_FORMAT
from homer_integrations.homer.leaves.leaf_entry import LeafEntry
from homer_integrations.homer.leaves.leaf_tier import LeafPiece, LeafTier
from homer_integrations.homer.leaves.tier_file import SERIAL_FORMAT as LEAF_TIER_FORMAT
from homer_integrations.homer.leaves.tier_file import head_tensors, tier_from_tensors, whole_tensors

CacheSource = Literal["memory", "disk", "computed"]
Entry = CompressedDocument | LeafTier | LeafEntry
"""What the cache holds: a document's compressed root cache, its leaf tier (``homer.leaves.leaf_tier``), or one leaf
of tiers stored by their leaves (``homer.leaves.leaf_entry``)."""
E = TypeVar("E", CompressedDocument, LeafTier, LeafEntry)
KINDS = {CompressedDocument: "root", LeafTier: "leaf_tier", LeafEntry: "leaf"}
PieceReader = Callable[[str], LeafEntry]
"""A leaf's entry by its content key (read from the store), for a tier stored by its leaves."""

MANIFEST_FORMAT = "homer-document-cache-entry"
FORMAT_VERSION = 2
"""Version of the stored entry (manifest + safetensors layout); other versions are discarded.
2: the manifest's sha256 covers the key as well as the tensors file (``entry_checksum``)."""
MAX_MANIFEST_BYTES = 1 << 20


class Unusable(Exception):
    """A stored entry exists but cannot be trusted; the message says why."""


@dataclass(frozen=True)
class CacheEntry:
    """One cached entry as ``cache ls`` shows it. ``created`` is a Unix time; ``kind`` is ``root``
    (a compressed cache) or ``leaf_tier`` (what a question replays from)."""

    key: str
    nbytes: int
    tokens: int
    document_tokens: int
    created: float
    label: str | None
    in_memory: bool
    on_disk: bool
    disk_bytes: int = 0
    kind: str = "root"
    error: str | None = None
    """Why a stored entry is unusable (a manifest over ``MAX_MANIFEST_BYTES``); None for a good one.
    Such an entry is listed so that it can be seen and cleared; it is never served."""


def document_nbytes(doc: Entry) -> int:
    """Bytes an entry's tensors occupy (K/V, positions, origins, logits; a leaf tier's all)."""
    if isinstance(doc, LeafTier | LeafEntry):
        return doc.nbytes
    extra = [doc.position_ids, doc.origin]
    if doc.next_token_logits is not None:
        extra.append(doc.next_token_logits)
    return doc.nbytes + sum(t.numel() * t.element_size() for t in extra)


def resident_nbytes(doc: Entry) -> int:
    """Bytes of ``doc`` held in process memory: a memory-mapped leaf tier's pages belong to the OS
    page cache (read in as a question touches them, dropped under memory pressure), so 0."""
    return 0 if isinstance(doc, LeafTier | LeafEntry) and doc.mapped else document_nbytes(doc)


def entry_checksum(key: str, data: bytes | Path) -> str:
    """The manifest's sha256: over ``key``, a NUL byte and the safetensors bytes (or file, read in
    blocks), binding the file to its key."""
    h = hashlib.sha256(key.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    if isinstance(data, Path):
        with data.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    else:
        h.update(data)
    return h.hexdigest()


def own_manifest(raw: bytes) -> dict[str, Any] | None:
    """``raw`` parsed if it is a homer cache manifest (any version, a string key), else None."""
    if len(raw) > MAX_MANIFEST_BYTES:
        return None
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    return manifest if isinstance(manifest.get("key"), str) else None


def unusable_manifest(key: str, error: str, created: float | None = None) -> dict[str, Any]:
    """What a store lists for an entry of the cache's that it cannot read (``CacheEntry.error``)."""
    return {"key": key, "error": error, "created": time.time() if created is None else created}


def listed_entry(manifest: dict[str, Any], disk_bytes: int) -> CacheEntry:
    """The ``CacheEntry`` a stored manifest (or ``unusable_manifest``) describes; raises
    ``ValueError``/``KeyError``/``TypeError``."""
    if manifest.get("format") != MANIFEST_FORMAT:
        return CacheEntry(
            key=str(manifest["key"]),
            nbytes=0,
            tokens=0,
            document_tokens=0,
            created=float(manifest["created"]),
            label=None,
            in_memory=False,
            on_disk=True,
            disk_bytes=disk_bytes,
            kind="unusable",
            error=str(manifest["error"]),
        )
    return CacheEntry(
        key=manifest["key"],
        nbytes=int(manifest["nbytes"]),
        tokens=int(manifest["tokens"]),
        document_tokens=int(manifest["document_tokens"]),
        created=float(manifest["created"]),
        label=manifest.get("label"),
        in_memory=False,
        on_disk=True,
        disk_bytes=disk_bytes,
        kind=str(manifest.get("kind", "root")),
    )


def relabelled(raw: bytes, key: str, label: str | None) -> bytes | None:
    """The manifest ``raw`` with its label set to ``label``; None when it is not ``key``'s manifest."""
    manifest = own_manifest(raw)
    if manifest is None or manifest["key"] != key:
        return None
    return json.dumps({**manifest, "label": label}, indent=1).encode()


class EntryCodec:
    """Turns an entry into (manifest, tensors) bytes and back, verifying everything it reads."""

    @staticmethod
    def encode(
        key: str,
        doc: Entry,
        label: str | None,
        into: Path | None = None,
        *,
        written: bool = False,
        secret: bytes | None = None,
        by_leaves: bool = False,
    ) -> tuple[bytes, bytes | Path]:
        """(manifest, safetensors) of ``doc`` stored under ``key``: the safetensors as bytes, or written
        tensor by tensor into the file ``into`` (no second in-memory copy of a large leaf tier);
        ``written``: ``into`` already holds them (a tier built in its staged file); ``secret``: a keyed
        cache's, whose ``hmac`` the manifest then carries; ``by_leaves``: a leaf tier stored as its prefix and
        its leaves' content keys (``tier_file.head_tensors``), its pieces written as entries of their own."""
        data: bytes | Path
        if into is not None and written:
            data = into
        else:
            if isinstance(doc, LeafTier):
                tensors, metadata = head_tensors(doc) if by_leaves else whole_tensors(doc)
            else:
                tensors, metadata = doc.to_tensors()
            cpu = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
            if into is None:
                data = save_safetensors(cpu, metadata)
            else:
                save_safetensors_file(cpu, into, metadata)
                data = into
        checksum = entry_checksum(key, data)
        first = doc.keys[0] if isinstance(doc, CompressedDocument) else doc  # a tensor's, or the tier's own
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": FORMAT_VERSION,
            "key": key,
            "sha256": checksum,
            "size": data.stat().st_size if isinstance(data, Path) else len(data),
            "created": time.time(),
            "label": label,
            "tokens": doc.num_tokens,
            "document_tokens": doc.document_tokens,
            "kind": KINDS[type(doc)],
            "nbytes": document_nbytes(doc),
            "dtype": str(first.dtype).removeprefix("torch."),
            "device": str(first.device),
            "compress_seconds": doc.stats.seconds if isinstance(doc, CompressedDocument) else doc.seconds,
        }
        if by_leaves and isinstance(doc, LeafTier):
            manifest["leaves"] = list(doc.leaf_keys or ())  # what removing the tier may take along (``Inventory``)
        if secret is not None:
            manifest["hmac"] = entry_mac(secret, key, checksum)
        return json.dumps(manifest, indent=1).encode(), data

    @staticmethod
    def decode(
        key: str,
        raw_manifest: bytes,
        read_tensors: Callable[[], bytes],
        spec: CacheSpec | None = None,
        tensors_file: Path | None = None,
        secret: bytes | None = None,
        piece: PieceReader | None = None,
    ) -> tuple[Entry, dict[str, Any]]:
        """The verified entry and its manifest; raises ``Unusable`` if anything is off.

        ``secret``: a keyed cache's; the manifest's ``hmac`` must then match (checked before the tensors
        are read), so an entry written without it, or forged by someone who can write the store, is unusable.

        ``read_tensors`` is called only once the manifest passed (it may raise ``FileNotFoundError``
        or ``OSError``). With ``spec`` the entry must also fit the model (``validate``); without one
        the model-independent checks apply (``check_consistent``). ``tensors_file``: the same bytes
        as a local file; a leaf tier is then memory-mapped from it (``LeafTier.mapped``) instead of
        read into memory, so a tier larger than the memory budget never has to be held whole (a leaf entry
        too). ``piece``: reads the leaves of a tier stored by its leaves (it may raise ``Unusable``).
        """
        try:
            manifest = json.loads(raw_manifest)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Unusable(f"the manifest is not JSON ({exc})") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise Unusable("the manifest is not a homer document cache manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise Unusable(f"format version {manifest.get('version')!r}, this version reads {FORMAT_VERSION}")
        if manifest.get("key") != key:
            raise Unusable("the manifest belongs to another document")
        size = manifest.get("size")
        if type(size) is not int:
            raise Unusable(f"the manifest's size {size!r} ({type(size).__name__}) is not a whole number of bytes")
        if secret is not None:
            mac, checksum = manifest.get("hmac"), manifest.get("sha256")
            if not (isinstance(mac, str) and isinstance(checksum, str)):
                raise Unusable("the entry carries no keyed checksum: it was written without this cache's secret")
            if not hmac.compare_digest(mac, entry_mac(secret, key, checksum)):
                raise Unusable(
                    "the entry's keyed checksum does not match this cache's secret (forged, or another secret)"
                )
        mapped = tensors_file is not None and manifest.get("kind") in (KINDS[LeafTier], KINDS[LeafEntry])
        stamp: FileStamp | None = None
        try:
            if mapped:  # what is checked below is what gets mapped: ``mapped_entry`` compares the file with it
                stamp = FileStamp.of(tensors_file)  # type: ignore[arg-type]
            data: bytes | Path = tensors_file if mapped else read_tensors()  # type: ignore[assignment]
            found = data.stat().st_size if isinstance(data, Path) else len(data)
            if found != size:
                raise Unusable(f"the safetensors file has {found} bytes, the manifest says {size}")
            if entry_checksum(key, data) != manifest.get("sha256"):
                raise Unusable("the safetensors file fails its sha256 checksum (for this key)")
        except FileNotFoundError as exc:
            raise Unusable("the safetensors file is missing") from exc
        except OSError as exc:
            raise Unusable(f"cannot read the safetensors file: {exc}") from exc
        try:
            doc = (
                mapped_entry(data, piece, stamp)
                if isinstance(data, Path)
                else entry_from_tensors(load_safetensors(data), safetensors_metadata(data), piece)
            )
        except (SafetensorError, ValueError, KeyError, TypeError, RuntimeError, OSError) as exc:
            raise Unusable(f"the safetensors file does not hold a compressed document ({exc})") from exc
        if doc.key != key:
            raise Unusable("the safetensors file holds another document")
        try:
            if isinstance(doc, LeafTier | LeafEntry):
                doc.check() if spec is None else doc.validate(spec)
            elif spec is None:
                check_consistent(doc)
            else:
                validate(doc, spec)
        except ValueError as exc:
            raise Unusable(f"the stored document fails validation: {exc}") from exc
        return doc, manifest


def to_device(doc: E, stored: str | None, device: torch.device | None) -> E:
    """``doc`` on ``device``; None: the device it was computed on (``stored``) when it exists here, else the CPU."""
    if device is None and stored:
        with contextlib.suppress(RuntimeError, AssertionError, ValueError):
            candidate = torch.device(stored)
            cuda_ok = torch.cuda.is_available() and (candidate.index or 0) < torch.cuda.device_count()
            if candidate.type == "cpu" or (candidate.type == "cuda" and cuda_ok):
                device = candidate
    if device is None or device.type == "cpu":
        return doc
    return doc.to(device)


def own_tensors(head: bytes) -> bool:
    """Whether ``head``, the start of a safetensors file (its whole header), names one of the cache's formats:
    a tensors file the cache wrote, whatever its name."""
    try:
        return safetensors_metadata(head).get("format") in (ROOT_FORMAT, LEAF_TIER_FORMAT, LEAF_PIECE_FORMAT)
    except (ValueError, UnicodeDecodeError, AttributeError):
        return False


def safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length, JSON header)."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise ValueError("safetensors header runs past the end of the file")
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise ValueError("no metadata in the safetensors header")
    return {str(k): str(v) for k, v in metadata.items()}


def mapped_tier(path: Path, piece: PieceReader | None = None) -> LeafTier:
    """The leaf tier in ``path`` with its tensors memory-mapped (safetensors maps the file; nothing is
    copied until a question slices a leaf). The mapping outlives the file's replacement or removal, not a
    change in place (``mapped``: the file's stamp is noted, and checked before the tier is used again)."""
    tier = mapped_entry(path, piece)
    if not isinstance(tier, LeafTier):
        raise ValueError(f"{path.name} holds a {type(tier).__name__}, not a leaf tier")
    return tier


def mapped_entry(path: Path, piece: PieceReader | None = None, stamp: FileStamp | None = None) -> LeafTier | LeafEntry:
    """The leaf tier or leaf entry in ``path``, memory-mapped (see ``mapped_tier``). ``stamp``: the file as it
    was verified (default: as it is now); ``OSError`` if it is not that file still once mapped."""
    stamp = FileStamp.of(path) if stamp is None else stamp
    with safe_open(str(path), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
        meta = f.metadata() or {}
    why = stamp.why_changed()
    if why is not None:
        raise OSError(f"changed while it was mapped: {why}")
    MAPPED.note(stamp)
    if meta.get("format") == LEAF_PIECE_FORMAT:
        return replace(LeafEntry.from_tensors(tensors, meta), mapped=True)
    read: list[LeafEntry] = []
    tier = tier_from_tensors(tensors, meta, None if piece is None else _pieces_of(piece, read))
    return replace(tier, mapped=all(entry.mapped for entry in read))


def _pieces_of(piece: PieceReader, read: list[LeafEntry]) -> Callable[[str], LeafPiece]:
    """``piece`` as ``tier_from_tensors`` takes it, each entry it reads appended to ``read``."""

    def one(key: str) -> LeafPiece:
        read.append(piece(key))
        return read[-1].piece

    return one


def entry_from_tensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, str], piece: PieceReader | None = None
) -> Entry:
    """A leaf tier, a leaf entry or a compressed document, by the format its metadata names."""
    if meta.get("format") == LEAF_TIER_FORMAT:
        return tier_from_tensors(tensors, meta, None if piece is None else _pieces_of(piece, []))
    if meta.get("format") == LEAF_PIECE_FORMAT:
        return LeafEntry.from_tensors(tensors, meta)
    return document_from_tensors(tensors, meta)


def document_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> CompressedDocument:
    """``CompressedDocument.from_tensors``, then the stricter checks a stored file gets.

    On top of what ``from_tensors`` checks (format, version, fields, one cache length): at least
    one layer, no stray tensors, the K/V layout (``check_layout``: dense ``[1, Hkv, K, d]`` with K
    positions and origins, or head-wise rows per layer), logits 1-D, the question text or None.
    Raises ``ValueError`` on anything foreign, old or inconsistent.
    """
    try:
        doc = CompressedDocument.from_tensors(tensors, meta)
    except IndexError as exc:  # a key/value tensor with fewer than two dimensions
        raise ValueError(f"key/value tensors are not all [heads, tokens, head_dim]: {exc}") from exc
    layers = len(doc.keys)
    expected = {f"k.{i}" for i in range(layers)} | {f"v.{i}" for i in range(layers)} | {"position_ids", "origin"}
    if doc.next_token_logits is not None:
        expected.add("next_token_logits")
    if doc.head_lengths is not None:
        expected.add("head_lengths")
    if layers < 1 or set(tensors) != expected:
        raise ValueError(f"unexpected tensors {sorted(set(tensors) ^ expected)[:4]} for {layers} layers")
    check_layout(doc)
    if doc.next_token_logits is not None and doc.next_token_logits.dim() != 1:
        raise ValueError("next-token logits are not one vector")
    if doc.question is not None and not isinstance(doc.question, str):
        raise ValueError("the stored question is not text")
    return doc
