"""Entry serialisation and verification (``homer_integrations.cache.entry``) on real compressed documents."""

from __future__ import annotations

import json

import pytest

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache.entry import (
    FORMAT_VERSION,
    EntryCodec,
    Unusable,
    entry_checksum,
    own_manifest,
    relabelled,
)
from tests.test_document_cache import assert_same_tensors


def never() -> bytes:
    raise AssertionError("the tensors must not be read once the manifest fails")


def test_round_trip_is_bit_exact_and_the_manifest_describes_the_entry(
    cache_docs: list[CompressedDocument], cache_engine: HomerModel
) -> None:
    doc = cache_docs[0]
    raw, data = EntryCodec.encode(doc.key, doc, "book.txt")
    manifest = json.loads(raw)
    assert manifest["version"] == FORMAT_VERSION and manifest["key"] == doc.key and manifest["label"] == "book.txt"
    assert manifest["sha256"] == entry_checksum(doc.key, data) and manifest["size"] == len(data)
    loaded, back = EntryCodec.decode(doc.key, raw, lambda: data, cache_engine.tiers.cache_spec)
    assert back == manifest
    assert_same_tensors(loaded, doc)


def test_the_checksum_binds_the_key(cache_docs: list[CompressedDocument]) -> None:
    doc, other = cache_docs[:2]
    raw, data = EntryCodec.encode(doc.key, doc, None)
    assert entry_checksum(doc.key, data) != entry_checksum(other.key, data)
    forged = json.dumps({**json.loads(raw), "key": other.key}).encode()
    with pytest.raises(Unusable, match="sha256"):
        EntryCodec.decode(other.key, forged, lambda: data)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda m: {**m, "version": FORMAT_VERSION + 1}, "format version"),
        (lambda m: {**m, "format": "something else"}, "not a homer document cache manifest"),
        (lambda m: {**m, "key": "another"}, "belongs to another document"),
    ],
    ids=["version", "format", "key"],
)
def test_a_bad_manifest_is_refused_before_the_tensors_are_read(
    cache_docs: list[CompressedDocument], edit, reason: str
) -> None:
    doc = cache_docs[0]
    raw, _ = EntryCodec.encode(doc.key, doc, None)
    with pytest.raises(Unusable, match=reason):
        EntryCodec.decode(doc.key, json.dumps(edit(json.loads(raw))).encode(), never)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[: len(d) // 2], "the manifest says"),
        (lambda d: d[:-8] + bytes(8), "sha256"),
    ],
    ids=["truncated", "zeroed"],
)
def test_damaged_tensors_are_refused(cache_docs: list[CompressedDocument], damage, reason: str) -> None:
    doc = cache_docs[1]
    raw, data = EntryCodec.encode(doc.key, doc, None)
    with pytest.raises(Unusable, match=reason):
        EntryCodec.decode(doc.key, raw, lambda: damage(data))


def test_a_missing_tensors_file_is_unusable(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    raw, _ = EntryCodec.encode(doc.key, doc, None)

    def missing() -> bytes:
        raise FileNotFoundError("gone")

    with pytest.raises(Unusable, match="safetensors file is missing"):
        EntryCodec.decode(doc.key, raw, missing)


def test_own_manifest_and_relabelled(cache_docs: list[CompressedDocument]) -> None:
    doc = cache_docs[0]
    raw, _ = EntryCodec.encode(doc.key, doc, "old")
    assert own_manifest(raw)["key"] == doc.key
    assert own_manifest(b'{"name": "app"}') is None and own_manifest(b"not json") is None
    assert own_manifest(b" " * (1 << 21)) is None
    assert json.loads(relabelled(raw, doc.key, "new"))["label"] == "new"
    assert relabelled(raw, "another key", "new") is None


def test_an_entry_written_into_a_file_is_the_bytes_entry(
    cache_docs: list[CompressedDocument], cache_engine: HomerModel, tmp_path
) -> None:
    doc = cache_docs[0]
    raw, data = EntryCodec.encode(doc.key, doc, "book.txt")
    path = tmp_path / "staged.safetensors"
    raw_file, written = EntryCodec.encode(doc.key, doc, "book.txt", into=path)
    assert written == path and path.stat().st_size == len(data)  # the same tensors (headers may order keys apart)
    manifest, from_file = json.loads(raw), json.loads(raw_file)
    assert from_file["sha256"] == entry_checksum(doc.key, path)
    for m in (manifest, from_file):
        del m["created"], m["sha256"]
    assert from_file == manifest
    loaded, _ = EntryCodec.decode(doc.key, raw_file, path.read_bytes, cache_engine.tiers.cache_spec)
    assert_same_tensors(loaded, doc)
