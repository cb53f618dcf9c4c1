"""``FsspecStore`` on real fsspec filesystems: memory://, file:// and S3 (moto's server on 127.0.0.1 via s3fs)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import fsspec
import pytest
from safetensors.torch import save_file

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache, DocumentCacheWarning
from homer_integrations.cache.fsspec_store import FsspecStore
from tests.conftest import REPO
from tests.test_document_cache import _CHILD, Counter, assert_same_tensors, make_engine, wait_for

QUESTION = "Who wrote the letter?"


def files(url: str) -> dict[str, bytes]:
    """Every file under ``url`` (recursively) by its path below it."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {p[len(root.rstrip("/")) + 1 :]: bytes(fs.cat_file(p)) for p in fs.find(root)}


def test_round_trip_listing_and_clear(
    store_url: str, cache_docs: list[CompressedDocument], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = tmp_path / "staging"  # where entries are serialised before they are uploaded
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    doc, other = cache_docs[:2]
    fs, root = fsspec.core.url_to_fs(store_url)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/notes.json", b'{"name": "not ours"}')  # a foreign object under the prefix
    fs.pipe_file(f"{root}/leaves-{'0' * 32}.index", b"{}\n")  # an index file earlier versions kept
    writer = DocumentCache(store_url)
    with writer.labelled("book.txt"):
        assert writer.get_or_compute(doc.key, Counter(doc))[1] == "computed"
    writer.get_or_compute(other.key, Counter(other))
    stored = files(store_url)
    assert {f"{doc.key}.json", f"{doc.key}.safetensors", "notes.json"} <= set(stored)
    assert not [name for name in stored if name.startswith(".tmp/")]  # nothing half written is left
    assert not list(staging.iterdir()), "the staged tensors files are removed once uploaded"

    reader = DocumentCache(store_url)
    loaded, source = reader.get_or_compute(doc.key, Counter(doc, before=pytest.fail))
    assert source == "disk" and loaded is not doc
    assert_same_tensors(loaded, doc)
    listing = {e.key: e for e in reader.entries()}
    assert set(listing) == {doc.key, other.key} and listing[doc.key].label == "book.txt"
    assert reader.stats().disk_bytes == sum(len(v) for k, v in stored.items() if k.startswith((doc.key, other.key)))
    assert reader.info()["store"] == store_url and reader.info()["directory"] is None
    assert reader.set_label(other.key, "two.txt")
    assert {e.key: e.label for e in DocumentCache(store_url).entries()}[other.key] == "two.txt"
    assert doc.key in DocumentCache(store_url) and "nope" not in DocumentCache(store_url)

    assert not reader.discard("notes") and reader.discard(other.key)
    assert reader.clear() == 1
    assert files(store_url) == {"notes.json": b'{"name": "not ours"}'}  # leases and temporary files went too
    assert DocumentCache(store_url).get_or_compute(doc.key, Counter(doc))[1] == "computed"


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_key"])
def test_a_corrupt_entry_is_recomputed_never_served(
    store_url: str, cache_docs: list[CompressedDocument], cache_engine: HomerModel, damage: str
) -> None:
    doc, other = cache_docs[:2]
    store = FsspecStore(store_url)
    DocumentCache(store).get_or_compute(doc.key, Counter(doc))
    tensors_path, manifest_path = store.paths(doc.key)
    data = bytes(store.fs.cat_file(tensors_path))
    if damage == "flip":
        store.fs.pipe_file(tensors_path, data[:-40] + bytes(b ^ 0x5A for b in data[-40:-20]) + data[-20:])
    elif damage == "truncate":
        store.fs.pipe_file(tensors_path, data[: len(data) // 2])
    else:  # another document's entry copied under this key's names
        DocumentCache(store).get_or_compute(other.key, Counter(other))
        for src, dst in zip(store.paths(other.key), (tensors_path, manifest_path), strict=True):
            store.fs.pipe_file(dst, bytes(store.fs.cat_file(src)))
    cache, compute = DocumentCache(store_url), Counter(doc)
    with pytest.warns(DocumentCacheWarning, match="discarding unusable document cache entry"):
        result, source = cache.get_or_compute(doc.key, compute, spec=cache_engine.tiers.cache_spec)
    assert (result, source, compute.calls) == (doc, "computed", 1) and cache.stats().discarded == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reloaded, source = DocumentCache(store_url).get_or_compute(doc.key, Counter(doc, pytest.fail))
    assert source == "disk"
    assert_same_tensors(reloaded, doc)


def test_readers_never_see_half_an_entry(store_url: str, cache_docs: list[CompressedDocument]) -> None:
    """One writer rewrites a key with two different entries while readers load it: each read is None
    (absent, or a manifest and tensors of different writes, which the checksum rejects) or one whole entry."""
    doc = cache_docs[0]
    variants = [doc, replace(doc, values=tuple(v * 2 for v in doc.values))]
    writer = DocumentCache(store_url)
    stop = threading.Event()
    seen: list[CompressedDocument | None] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(DocumentCache(store_url, memory_budget_bytes=0).get(doc.key))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for i in range(16):
            writer.stored.write(doc.key, variants[i % 2], None)
        wait_for(lambda: any(d is not None for d in seen))  # the last write is whole: a read completes
    finally:
        stop.set()
        for t in readers:
            t.join(30)
    loaded = [d for d in seen if d is not None]
    assert loaded, "no read completed"
    for d in loaded:
        matches = []
        for v in variants:
            try:
                assert_same_tensors(d, v)
                matches.append(v)
            except AssertionError:
                pass
        assert len(matches) == 1
    assert not [name for name in files(store_url) if name.startswith(".tmp/")]


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_two_processes_sharing_a_store_compress_a_document_once(
    tmp_path: Path, cache_docs: list[CompressedDocument], kind: str, request: pytest.FixtureRequest
) -> None:
    url = (tmp_path / "store").as_uri() if kind == "file" else request.getfixturevalue("s3_url")
    doc = cache_docs[0]
    source = tmp_path / "source.safetensors"
    tensors, meta = doc.to_tensors()
    save_file(tensors, str(source), meta)
    marks = tmp_path / "marks"
    marks.mkdir()

    def child(name: str) -> subprocess.Popen[str]:
        args = [sys.executable, "-c", _CHILD, url, str(source), doc.key, str(marks), name]
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = child("first")
    second = None
    try:
        wait_for(lambda: (marks / "computing").exists(), timeout=60)
        second = child("second")
        wait_for(lambda: (marks / "asking-second").exists(), timeout=60)
        time.sleep(0.5)  # the second process now waits on the lease
        (marks / "go").touch()
        outputs = [p.communicate(timeout=60) for p in (first, second)]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    results = [json.loads(out) for out, _ in outputs]
    assert [r["source"] for r in results] == ["computed", "disk"]
    assert (marks / "computations").read_text() == "x"
    assert results[1]["seconds"] >= 0.4  # it waited for the first process instead of computing
    assert_same_tensors(DocumentCache(url).get_or_compute(doc.key, Counter(doc, before=pytest.fail))[0], doc)
    assert not [name for name in files(url) if name.startswith("locks/")]  # both leases released


def test_a_fresh_engine_answers_from_the_s3_store_without_compressing(
    tokenizer, cache_calib: Path, s3_url: str, cache_texts: list[str]
) -> None:
    writer = make_engine(tokenizer, cache_calib, store=s3_url)
    expected = writer.answer(cache_texts[2], QUESTION, max_new_tokens=6)
    assert writer.document_cache.stats().computations == 1

    reader = make_engine(tokenizer, cache_calib, store=s3_url)  # another engine: a new model object, same weights
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = reader.run(cache_texts[2], QUESTION, max_new_tokens=6)
        assert stream.text() == expected
    assert stream.info.cache_source == "disk" and stream.info.document_seconds == 0
    assert reader.document_cache.stats().computations == 0


_ASK = """
import json, sys, time
started = time.perf_counter()
from tests.conftest import tiny_model
from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.reading.strategies import FlatRoot, Recipe
from homer_integrations.engine.loading import SMOLLM2, load_embedded

url, calib, text = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
config = HomerConfig(max_chunk_len=128, warmup_layers=3, mode="shared")
recipe = Recipe(shared_root=FlatRoot(), calibration_segments=2)
tokenizer = load_embedded(SMOLLM2)[1]
engine = HomerModel(
    tiny_model("llama"), tokenizer, config, calibration_dir=calib, progress=False, store=url, recipe=recipe
)
stream = engine.run(text, "Who wrote the letter?", max_new_tokens=6)
answer = stream.text()
print(json.dumps({"answer": answer, "source": stream.info.cache_source,
                  "computations": engine.document_cache.stats().computations}))
"""


def test_a_fresh_process_answers_from_the_s3_store(
    cache_engine: HomerModel, cache_calib: Path, s3_url: str, cache_texts: list[str], tmp_path: Path
) -> None:
    doc = cache_engine.compress(cache_texts[3])
    DocumentCache(s3_url).get_or_compute(doc.key, lambda: doc)  # another machine wrote it
    expected = cache_engine.answer(cache_texts[3], QUESTION, max_new_tokens=6)
    text = tmp_path / "doc.txt"
    text.write_text(cache_texts[3], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _ASK, s3_url, str(cache_calib), str(text)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"answer": expected, "source": "disk", "computations": 0}


def test_a_directory_in_an_entrys_place_on_file_urls_is_reported_and_kept(
    tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    doc = cache_docs[0]
    root = tmp_path / "store"
    (root / f"{doc.key}.safetensors").mkdir(parents=True)
    (root / f"{doc.key}.safetensors" / "keep.txt").write_text("mine")
    cache = DocumentCache(root.as_uri())
    with pytest.warns(DocumentCacheWarning, match="keeping it in memory only"):
        assert cache.get_or_compute(doc.key, Counter(doc)) == (doc, "computed")
    assert (root / f"{doc.key}.safetensors" / "keep.txt").read_text() == "mine"
    assert not (root / f"{doc.key}.json").exists()
    cache.clear()
    assert (root / f"{doc.key}.safetensors" / "keep.txt").read_text() == "mine"


def test_a_budget_is_refused_for_urls(store_url: str) -> None:
    with pytest.raises(ValueError, match="lifecycle"):
        DocumentCache(store_url, disk_budget_bytes=10)


def test_a_content_split_tier_is_stored_by_its_leaves_on_any_filesystem(
    tokenizer, calibration, novel: str, store_url: str
) -> None:
    from tests.homer.leaves.test_leaf_reuse import store_engine, tier_of

    text = novel[20_000:24_000]
    writer = store_engine(tokenizer, calibration, store_url)
    expected = writer.answer(text, QUESTION, max_new_tokens=4)
    tier = tier_of(writer, text)
    kinds = [e.kind for e in writer.document_cache.entries()]
    assert kinds.count("leaf") == tier.plan.num_leaves and kinds.count("leaf_tier") == 1
    reader = store_engine(tokenizer, calibration, store_url)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = reader.run(text, QUESTION, max_new_tokens=4)
        assert stream.text() == expected
    assert stream.info.cache_source == "disk"
