"""A keyed cache (issue 63: 16): entries signed with a secret (HMAC-SHA256), so another document's
tensors under a key, with the manifest's key and sha256 rewritten by whoever can write the store, are
told apart and recomputed. The secret file is made on first use (mode 600) and trusted only while private.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache, DocumentCacheWarning
from homer_integrations.cache.entry import entry_checksum
from homer_integrations.cache.secret import CacheSecretError, load_secret
from homer_integrations.cli import main

POSIX = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")


def same_tensors(a: CompressedDocument, b: CompressedDocument) -> bool:
    ta, tb = a.to_tensors()[0], b.to_tensors()[0]
    return ta.keys() == tb.keys() and all(torch.equal(ta[n], tb[n]) for n in ta)


def forge(directory: Path, victim: str, source: str) -> None:
    """What anyone who can write the store can do: ``source``'s tensors under ``victim``'s name, the
    manifest's key and sha256 rewritten to match (the tensors' own metadata names ``source`` only as a
    key inside the file, so that is rewritten too, as a forger would)."""
    from safetensors.torch import load, save

    from homer_integrations.cache.entry import safetensors_metadata

    data = (directory / f"{source}.safetensors").read_bytes()
    tensors, metadata = load(data), safetensors_metadata(data)
    forged = save(tensors, {**metadata, "key": victim})
    (directory / f"{victim}.safetensors").write_bytes(forged)
    manifest_path = directory / f"{victim}.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.update(sha256=entry_checksum(victim, forged), size=len(forged))
    manifest_path.write_text(json.dumps(manifest))


@pytest.fixture
def secret_path(tmp_path: Path) -> Path:
    return tmp_path / "private" / "cache.key"


@pytest.fixture
def forged_store(
    tmp_path: Path, secret_path: Path, cache_engine: HomerModel, cache_texts: list[str]
) -> tuple[Path, list[CompressedDocument]]:
    """A store where a keyed cache wrote two roots, then the first was replaced by the second's tensors."""
    directory = tmp_path / "shared"
    writer = cache_engine.with_store(DocumentCache(directory, keyed=secret_path))
    docs = [writer.compress(t) for t in cache_texts[:2]]
    forge(directory, docs[0].key, docs[1].key)
    return directory, docs


def test_a_forged_entry_is_served_without_a_secret_and_recomputed_with_one(
    forged_store: tuple[Path, list[CompressedDocument]],
    secret_path: Path,
    cache_engine: HomerModel,
    cache_texts: list[str],
) -> None:
    directory, (victim, source) = forged_store
    # unkeyed (the default, unchanged): the forgery passes every check a reader without a secret can make
    unkeyed = cache_engine.with_store(DocumentCache(directory, memory_budget_bytes=0))
    assert same_tensors(unkeyed.compress(cache_texts[0]), source), "what item 16 reported"
    # keyed with the writer's secret: the forgery is told apart, removed and recomputed
    keyed = cache_engine.with_store(DocumentCache(directory, keyed=secret_path))
    with pytest.warns(DocumentCacheWarning, match="keyed checksum does not match this cache's secret"):
        assert same_tensors(keyed.compress(cache_texts[0]), victim)
    assert keyed.stats().discarded == 1 and keyed.stats().computations == 1
    assert same_tensors(keyed.compress(cache_texts[1]), source)  # the untouched entry is served from disk
    assert keyed.stats().hits_disk == 1
    again = cache_engine.with_store(DocumentCache(directory, keyed=secret_path))
    assert same_tensors(again.compress(cache_texts[0]), victim) and again.stats().hits_disk == 1


def test_a_forger_with_another_secret_or_none_is_refused(
    tmp_path: Path, secret_path: Path, cache_engine: HomerModel, cache_texts: list[str]
) -> None:
    directory = tmp_path / "shared"
    cache_engine.with_store(DocumentCache(directory, keyed=tmp_path / "other" / "cache.key")).compress(cache_texts[0])
    cache_engine.with_store(DocumentCache(directory)).compress(cache_texts[1])  # an unkeyed writer
    keyed = cache_engine.with_store(DocumentCache(directory, keyed=secret_path))
    with pytest.warns(DocumentCacheWarning, match="does not match this cache's secret"):
        keyed.compress(cache_texts[0])
    with pytest.warns(DocumentCacheWarning, match="carries no keyed checksum: it was written without"):
        keyed.compress(cache_texts[1])
    assert keyed.stats().computations == 2
    # what a keyed cache writes, a cache without a secret still reads (its sha256 is there as before)
    unkeyed = cache_engine.with_store(DocumentCache(directory))
    unkeyed.compress(cache_texts[0])
    assert unkeyed.stats().hits_disk == 1 and unkeyed.stats().discarded == 0


@POSIX
def test_the_secret_is_made_once_private_and_reused(secret_path: Path) -> None:
    first = load_secret(secret_path)
    assert len(first) == 32 and stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret_path.parent.stat().st_mode) == 0o700
    assert load_secret(secret_path) == first
    assert [p.name for p in secret_path.parent.iterdir()] == ["cache.key"], "no temporary file left"


@POSIX
@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda p: p.chmod(0o644), r"has mode 644: others may read or write it \(chmod 600 it\)"),
        (lambda p: (p.unlink(), p.symlink_to(p.with_name("elsewhere"))), "is a symbolic link, not a regular file"),
        (lambda p: p.parent.chmod(0o777), "which others may write .*: they could replace it"),
        (lambda p: p.write_text("not hex"), "does not hold at least 16 bytes as hex"),
    ],
)
def test_a_secret_that_cannot_be_trusted_is_refused(secret_path: Path, spoil, says: str) -> None:
    load_secret(secret_path)
    secret_path.with_name("elsewhere").write_text("00" * 32)
    spoil(secret_path)
    with pytest.raises(CacheSecretError, match=says):
        DocumentCache(secret_path.parent.parent / "store", keyed=secret_path)


def test_keyed_needs_a_store() -> None:
    with pytest.raises(ValueError, match="keyed= signs the entries of a store"):
        DocumentCache(keyed=True)


@POSIX
def test_the_cli_takes_keyed_and_says_why_a_secret_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path / "root"))
    assert main(["cache", "info", "--cache-dir", str(tmp_path / "c"), "--keyed"]) == 0
    secret = tmp_path / "root" / "cache.key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    secret.chmod(0o640)
    capsys.readouterr()
    assert main(["cache", "info", "--cache-dir", str(tmp_path / "c"), "--keyed"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("homer-qa: error: --keyed: the cache secret ") and "has mode 640" in line
