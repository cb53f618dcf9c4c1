"""The document cache on real compressed documents (tiny random-weight models), real files and real threads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save, save_file

from homer_integrations import CompressedDocument, HomerConfig, HomerModel
from homer_integrations.cache import (
    FORMAT_VERSION,
    CacheStats,
    DocumentCache,
    DocumentCacheWarning,
    document_nbytes,
    entry_checksum,
)
from homer_integrations.homer.reading.strategies import FlatRoot, Recipe, TreeRoot
from tests.conftest import REPO, tiny_model, uncalibrated

CONFIG = HomerConfig(max_chunk_len=128, warmup_layers=3, mode="shared")
"""Answers from the shared root (pinned: the default is ``query_aware``): these tests check the cache on roots."""
RECIPE = Recipe(shared_root=FlatRoot(), calibration_segments=2)
"""The flat root: these tests check the cache's mechanics on dense roots (head-wise ones: tests/homer)."""


@pytest.fixture(scope="module")
def calib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("calibration")


def make_engine(
    tokenizer, calib_dir: Path, config: HomerConfig = CONFIG, recipe: Recipe = RECIPE, **kwargs
) -> HomerModel:
    model = kwargs.pop("model", None) or tiny_model("llama")
    return HomerModel(model, tokenizer, config, calibration_dir=calib_dir, progress=False, recipe=recipe, **kwargs)


@pytest.fixture(scope="module")
def engine(tokenizer, calib_dir: Path) -> HomerModel:
    return make_engine(tokenizer, calib_dir)


@pytest.fixture(scope="module")
def texts(novel: str) -> list[str]:
    """Four different ~350-token documents (a tree of height 2 at max_chunk_len 128)."""
    return [novel[20_000 + i * 1500 : 20_000 + (i + 1) * 1500] for i in range(4)]


@pytest.fixture(scope="module")
def docs(engine: HomerModel, texts: list[str]) -> list[CompressedDocument]:
    """Real compressed documents (shared mode), keyed by the engine's cache key."""
    return [engine.compress(t) for t in texts]


@pytest.fixture(scope="module")
def qa_doc(tokenizer, calib_dir: Path, texts: list[str]) -> CompressedDocument:
    """A query-aware document: it also carries next-token logits and the question."""
    qa = make_engine(tokenizer, calib_dir, CONFIG.model_copy(update={"mode": "query_aware"}))
    return qa.compress(texts[0], question="Who is Mr. Bingley?")


class Counter:
    """A compute function that counts its calls and returns ``doc``."""

    def __init__(self, doc: CompressedDocument, before: Callable[[], None] | None = None) -> None:
        self.doc = doc
        self.calls = 0
        self.before = before
        self._lock = threading.Lock()

    def __call__(self) -> CompressedDocument:
        with self._lock:
            self.calls += 1
        if self.before is not None:
            self.before()
        return self.doc


def assert_same_tensors(a: CompressedDocument, b: CompressedDocument) -> None:
    """Every tensor bit-exact (values, dtype, shape) and every scalar field equal."""
    ta, ma = a.to_tensors()
    tb, mb = b.to_tensors()
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype, name
        assert torch.equal(ta[name], tb[name]), name
    assert ma == mb
    assert (a.key, a.last_position, a.question, a.stats) == (b.key, b.last_position, b.question, b.stats)


# ----------------------------------------------------------------------------- memory
def test_memory_hit_returns_the_same_object(docs: list[CompressedDocument]) -> None:
    cache = DocumentCache()
    compute = Counter(docs[0])
    first, source = cache.get_or_compute(docs[0].key, compute)
    assert (first, source) == (docs[0], "computed")
    again, source = cache.get_or_compute(docs[0].key, compute)
    assert again is first and source == "memory"
    assert compute.calls == 1
    s = cache.stats()
    assert isinstance(s, CacheStats)
    assert (s.hits_memory, s.hits_disk, s.misses, s.computations, s.entries) == (1, 0, 1, 1, 1)
    assert s.memory_bytes == document_nbytes(docs[0]) > docs[0].nbytes
    assert s.disk_bytes == 0 and s.disk_entries == 0
    assert cache.get(docs[0].key) is first and docs[0].key in cache and "nope" not in cache
    assert cache.get("nope") is None


def test_lru_eviction_under_a_byte_budget(docs: list[CompressedDocument]) -> None:
    a, b, c, d = docs
    size = max(document_nbytes(x) for x in docs)
    cache = DocumentCache(memory_budget_bytes=int(size * 2.5))
    for doc in (a, b):
        cache.get_or_compute(doc.key, Counter(doc))
    assert cache.get_or_compute(a.key, Counter(a))[1] == "memory"  # a is now the most recent
    cache.get_or_compute(c.key, Counter(c))  # evicts b, the least recently used
    s = cache.stats()
    assert s.evictions == 1 and s.entries == 2 and s.memory_bytes <= int(size * 2.5)
    assert {e.key for e in cache.entries()} == {a.key, c.key}
    assert cache.get_or_compute(a.key, Counter(a))[1] == "memory"
    recompute = Counter(b)
    assert cache.get_or_compute(b.key, recompute)[1] == "computed" and recompute.calls == 1  # evicts c
    cache.get_or_compute(d.key, Counter(d))  # evicts a
    assert {e.key for e in cache.entries()} == {b.key, d.key}
    assert cache.stats().evictions == 3


def test_a_document_over_the_budget_is_returned_not_kept(docs: list[CompressedDocument]) -> None:
    cache = DocumentCache(memory_budget_bytes=document_nbytes(docs[0]) - 1)
    compute = Counter(docs[0])
    assert cache.get_or_compute(docs[0].key, compute) == (docs[0], "computed")
    assert cache.get_or_compute(docs[0].key, compute) == (docs[0], "computed")
    assert compute.calls == 2 and cache.stats().entries == 0 and cache.stats().memory_bytes == 0
    with pytest.raises(ValueError):
        DocumentCache(memory_budget_bytes=-1)


def test_compute_errors_reach_every_waiter_and_the_next_call_retries(docs: list[CompressedDocument]) -> None:
    cache = DocumentCache()
    started, release = threading.Event(), threading.Event()

    def failing() -> CompressedDocument:
        started.set()
        release.wait(10)
        raise RuntimeError("out of memory while compressing")

    errors: list[BaseException] = []

    def ask() -> None:
        try:
            cache.get_or_compute(docs[0].key, failing)
        except RuntimeError as exc:
            errors.append(exc)

    leader = threading.Thread(target=ask)
    leader.start()
    assert started.wait(10)
    followers = [threading.Thread(target=ask) for _ in range(3)]
    for t in followers:
        t.start()
    wait_for(lambda: cache.stats().waits == 3)
    release.set()
    for t in [leader, *followers]:
        t.join(10)
    assert len(errors) == 4 and all("out of memory" in str(e) for e in errors)
    assert cache.get_or_compute(docs[0].key, Counter(docs[0])) == (docs[0], "computed")


def test_compute_must_return_a_document() -> None:
    with pytest.raises(TypeError, match="not a CompressedDocument"):
        DocumentCache().get_or_compute("k", lambda: "text")  # type: ignore[arg-type, return-value]


# ----------------------------------------------------------------------------- disk round trip
@pytest.mark.parametrize("which", ["shared", "query_aware", "bfloat16", "views"])
def test_disk_round_trip_is_bit_exact(
    tmp_path: Path, docs: list[CompressedDocument], qa_doc: CompressedDocument, which: str
) -> None:
    doc = {"shared": docs[0], "query_aware": qa_doc}.get(which)
    if which == "bfloat16":  # a half-precision cache must come back in its own dtype
        doc = replace(
            docs[1],
            keys=tuple(k.to(torch.bfloat16) for k in docs[1].keys),
            values=tuple(v.to(torch.bfloat16) for v in docs[1].values),
        )
    elif which == "views":  # per-layer views into one shared storage, as a compressor may produce
        keys, values = torch.stack(docs[2].keys), torch.stack(docs[2].values)
        doc = replace(docs[2], keys=tuple(keys.unbind(0)), values=tuple(values.unbind(0)))
        assert doc.keys[0].untyped_storage().data_ptr() == doc.keys[1].untyped_storage().data_ptr()
    assert doc is not None
    writer = DocumentCache(tmp_path)
    assert writer.get_or_compute(doc.key, Counter(doc))[1] == "computed"
    files = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert files == [f"{doc.key}.json", f"{doc.key}.safetensors"]

    reader = DocumentCache(tmp_path)
    never = Counter(doc, before=lambda: pytest.fail("a valid disk entry must not be recomputed"))
    loaded, source = reader.get_or_compute(doc.key, never)
    assert source == "disk" and loaded is not doc
    assert_same_tensors(loaded, doc)
    assert loaded.keys[0].dtype == doc.keys[0].dtype
    assert (loaded.next_token_logits is None) == (doc.next_token_logits is None)
    s = reader.stats()
    assert (s.hits_disk, s.computations, s.misses, s.disk_entries) == (1, 0, 0, 1)
    assert s.disk_bytes == sum(p.stat().st_size for p in tmp_path.iterdir() if p.is_file())
    assert reader.get_or_compute(doc.key, never) == (loaded, "memory")

    manifest = json.loads((tmp_path / f"{doc.key}.json").read_text())
    data = (tmp_path / f"{doc.key}.safetensors").read_bytes()
    assert manifest["version"] == FORMAT_VERSION and manifest["key"] == doc.key
    assert manifest["sha256"] == entry_checksum(doc.key, data) and manifest["size"] == len(data)
    assert manifest["sha256"] != hashlib.sha256(data).hexdigest()  # the checksum binds the key too
    assert manifest["tokens"] == doc.num_tokens


def test_engine_answers_identically_from_disk(tokenizer, calib_dir: Path, tmp_path: Path, texts: list[str]) -> None:
    first = make_engine(tokenizer, calib_dir, document_cache=DocumentCache(tmp_path))
    stream = first.run(texts[2], "Who is Elizabeth?", max_new_tokens=8)
    answer = stream.text()
    assert stream.info.cache_source == "computed"
    doc = first.compress(texts[2])
    snapshot = [t.clone() for t in doc.keys + doc.values]
    first.answer(texts[2], "Another question about the ball?", max_new_tokens=8)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, doc.keys + doc.values, strict=True))

    second = make_engine(tokenizer, calib_dir, document_cache=DocumentCache(tmp_path))  # a restarted program
    stream = second.run(texts[2], "Who is Elizabeth?", max_new_tokens=8)
    assert stream.text() == answer
    assert stream.info.cache_source == "disk"
    assert second.document_cache.stats().computations == 0


def test_default_directory_is_under_the_package_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path))
    assert DocumentCache(True).directory == tmp_path / "documents"
    assert DocumentCache().directory is None and DocumentCache(False).directory is None


def test_keys_that_are_not_file_names_are_hashed(tmp_path: Path, docs: list[CompressedDocument]) -> None:
    key = "../escape/ me?"
    doc = replace(docs[0], key=key)
    DocumentCache(tmp_path).get_or_compute(key, Counter(doc))
    assert all(p.parent == tmp_path for p in tmp_path.rglob("*.json"))
    loaded, source = DocumentCache(tmp_path).get_or_compute(key, Counter(doc))
    assert source == "disk" and loaded.key == key


def test_an_unusable_directory_falls_back_to_memory(tmp_path: Path, docs: list[CompressedDocument]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = DocumentCache(blocker)
    with pytest.warns(DocumentCacheWarning, match="memory only"):
        assert cache.get_or_compute(docs[0].key, Counter(docs[0])) == (docs[0], "computed")
    assert cache.get_or_compute(docs[0].key, Counter(docs[0])) == (docs[0], "memory")


# ----------------------------------------------------------------------------- corruption
def _paths(directory: Path, key: str) -> tuple[Path, Path]:
    return directory / f"{key}.safetensors", directory / f"{key}.json"


def _rewrite_manifest(directory: Path, key: str, **changes: object) -> None:
    path = _paths(directory, key)[1]
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def _restamp(directory: Path, key: str, data: bytes) -> None:
    """Replace the tensors file with ``data`` and make the manifest vouch for it (a consistent forgery)."""
    _paths(directory, key)[0].write_bytes(data)
    _rewrite_manifest(directory, key, sha256=entry_checksum(key, data), size=len(data))


def truncate(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    path = _paths(d, doc.key)[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bytes(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    path = _paths(d, doc.key)[0]
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 64, len(data) - 32):  # inside the last tensor's values
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def tamper_checksum(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _rewrite_manifest(d, doc.key, sha256="0" * 64)


def tamper_manifest_json(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _paths(d, doc.key)[1].write_text('{"format": "homer-document-cache-entry", "version": 1, "key": ')


def foreign_manifest(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _paths(d, doc.key)[1].write_text(json.dumps({"name": "something else", "key": doc.key}))


def foreign_safetensors(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _restamp(d, doc.key, save({"weight": torch.randn(4, 4)}, {"format": "pt"}))


def old_manifest_version(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _rewrite_manifest(d, doc.key, version=FORMAT_VERSION - 1)


def old_document_version(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    tensors, meta = doc.to_tensors()
    _restamp(d, doc.key, save(tensors, {**meta, "version": "0"}))


def other_keys_files(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    """Another document's entry copied under this key's names, as is."""
    DocumentCache(d).get_or_compute(other.key, Counter(other))
    for src, dst in zip(_paths(d, other.key), _paths(d, doc.key), strict=True):
        dst.write_bytes(src.read_bytes())


def other_keys_tensors(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    """Another document's tensors with a manifest forged to match them and this key."""
    tensors, meta = other.to_tensors()
    _restamp(d, doc.key, save(tensors, meta))


def missing_tensors(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    _paths(d, doc.key)[0].unlink()


def inconsistent_lengths(d: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    tensors, meta = doc.to_tensors()
    tensors["position_ids"] = tensors["position_ids"][:-1].clone()
    _restamp(d, doc.key, save(tensors, meta))


CORRUPTIONS = {
    truncate: "bytes, the manifest says",
    flip_bytes: "sha256",
    tamper_checksum: "sha256",
    tamper_manifest_json: "not JSON",
    foreign_manifest: "not a homer document cache manifest",
    foreign_safetensors: "does not hold a compressed document",
    old_manifest_version: "format version",
    old_document_version: "does not hold a compressed document",
    other_keys_files: "belongs to another document",
    other_keys_tensors: "holds another document",
    missing_tensors: "safetensors file is missing",
    inconsistent_lengths: "inconsistent cache lengths",
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=lambda f: f.__name__)
def test_unusable_entries_are_removed_and_recomputed(
    tmp_path: Path, docs: list[CompressedDocument], corrupt: Callable[..., None]
) -> None:
    doc, other = docs[0], docs[1]
    DocumentCache(tmp_path).get_or_compute(doc.key, Counter(doc))
    corrupt(tmp_path, doc, other)

    cache = DocumentCache(tmp_path)
    compute = Counter(doc)
    with pytest.warns(DocumentCacheWarning, match=CORRUPTIONS[corrupt]):
        result, source = cache.get_or_compute(doc.key, compute)
    assert source == "computed" and compute.calls == 1 and result is doc
    assert cache.stats().discarded == 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten entry is sound again
        reloaded, source = DocumentCache(tmp_path).get_or_compute(doc.key, Counter(doc, before=pytest.fail))
    assert source == "disk"
    assert_same_tensors(reloaded, doc)


def test_a_corrupted_file_never_changes_an_answer(tokenizer, calib_dir: Path, tmp_path: Path, texts: list[str]) -> None:
    engine = make_engine(tokenizer, calib_dir, document_cache=DocumentCache(tmp_path))
    expected = engine.answer(texts[3], "Who wrote the letter?", max_new_tokens=8)
    key = engine.compress(texts[3]).key
    flip_bytes(tmp_path, engine.compress(texts[3]), engine.compress(texts[3]))

    restarted = make_engine(tokenizer, calib_dir, document_cache=DocumentCache(tmp_path))
    with pytest.warns(DocumentCacheWarning, match=key[:12]):
        stream = restarted.run(texts[3], "Who wrote the letter?", max_new_tokens=8)
        assert stream.text() == expected
    assert stream.info.cache_source == "computed"


def test_an_unfinished_write_is_a_silent_miss(tmp_path: Path, docs: list[CompressedDocument]) -> None:
    doc = docs[0]
    tensors, meta = doc.to_tensors()
    save_file(tensors, str(_paths(tmp_path, doc.key)[0]), meta)  # tensors written, manifest not yet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DocumentCache(tmp_path).get_or_compute(doc.key, Counter(doc))[1] == "computed"
    assert DocumentCache(tmp_path).get_or_compute(doc.key, Counter(doc))[1] == "disk"


# ----------------------------------------------------------------------------- concurrency
def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_eight_threads_one_key_one_computation(tmp_path: Path, docs: list[CompressedDocument], on_disk: bool) -> None:
    cache = DocumentCache(tmp_path if on_disk else None)
    # compute() returns only once all seven other threads are waiting on it, so they overlap it.
    compute = Counter(docs[0], before=lambda: wait_for(lambda: cache.stats().waits == 7))
    results: list[tuple[CompressedDocument, str]] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait(10)
        results.append(cache.get_or_compute(docs[0].key, compute))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert compute.calls == 1
    assert len(results) == 8 and all(doc is docs[0] for doc, _ in results)
    assert sorted(source for _, source in results) == ["computed"] + ["memory"] * 7
    s = cache.stats()
    assert (s.computations, s.misses, s.hits_memory, s.waits) == (1, 1, 7, 7)


async def test_asyncio_tasks_one_key_one_computation(tmp_path: Path, docs: list[CompressedDocument]) -> None:
    cache = DocumentCache(tmp_path)
    computes = [Counter(d, before=lambda: wait_for(lambda: cache.stats().waits >= 5)) for d in docs[:2]]
    tasks = [asyncio.to_thread(cache.get_or_compute, docs[0].key, computes[0]) for _ in range(3)]
    tasks += [cache.aget_or_compute(docs[0].key, computes[0]) for _ in range(3)]
    tasks += [cache.aget_or_compute(docs[1].key, computes[1]) for _ in range(2)]
    results = await asyncio.gather(*tasks)
    assert [c.calls for c in computes] == [1, 1]
    assert all(doc is docs[0] for doc, _ in results[:6]) and all(doc is docs[1] for doc, _ in results[6:])
    assert cache.stats().computations == 2
    assert [r[1] for r in results].count("computed") == 2


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_different_keys_compute_side_by_side(tmp_path: Path, docs: list[CompressedDocument], on_disk: bool) -> None:
    cache = DocumentCache(tmp_path if on_disk else None)
    both_inside = threading.Barrier(2, timeout=20)  # broken (an error) if the computations run one after the other
    computes = [Counter(d, before=both_inside.wait) for d in docs[:2]]
    results: dict[int, tuple[CompressedDocument, str]] = {}

    def ask(i: int) -> None:
        results[i] = cache.get_or_compute(docs[i].key, computes[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: (docs[0], "computed"), 1: (docs[1], "computed")}
    assert not both_inside.broken


_CHILD = """
import json, sys, time
from pathlib import Path
from safetensors import safe_open
from safetensors.torch import load_file
from homer_integrations.cache import DocumentCache, document_from_tensors

directory, source, key, marks = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])

def compute():
    with (marks / "computations").open("a") as f:
        f.write("x")
    (marks / "computing").touch()
    while not (marks / "go").exists():  # hold the lock until the parent says so
        time.sleep(0.02)
    with safe_open(source, "pt") as f:
        meta = f.metadata()
    return document_from_tensors(load_file(source), meta)

cache = DocumentCache(directory)
(marks / ("asking-" + sys.argv[5])).touch()
started = time.perf_counter()
doc, where = cache.get_or_compute(key, compute)
print(json.dumps({"source": where, "key": doc.key, "tokens": doc.num_tokens, "seconds": time.perf_counter() - started}))
"""


def test_two_processes_compress_a_document_once(tmp_path: Path, docs: list[CompressedDocument]) -> None:
    doc = docs[0]
    source = tmp_path / "source.safetensors"
    tensors, meta = doc.to_tensors()
    save_file(tensors, str(source), meta)
    marks = tmp_path / "marks"
    marks.mkdir()
    store = tmp_path / "store"

    def child(name: str) -> subprocess.Popen[str]:
        args = [sys.executable, "-c", _CHILD, str(store), str(source), doc.key, str(marks), name]
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = child("first")
    try:
        wait_for(lambda: (marks / "computing").exists(), timeout=60)
        second = child("second")
        wait_for(lambda: (marks / "asking-second").exists(), timeout=60)
        time.sleep(0.3)  # the second process is now blocked on the file lock
        (marks / "go").touch()
        outputs = [p.communicate(timeout=60) for p in (first, second)]
    finally:
        for p in (first, locals().get("second")):
            if p is not None and p.poll() is None:
                p.kill()
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    results = [json.loads(out) for out, _ in outputs]
    assert [r["source"] for r in results] == ["computed", "disk"]
    assert all(r["key"] == doc.key and r["tokens"] == doc.num_tokens for r in results)
    assert (marks / "computations").read_text() == "x"
    assert results[1]["seconds"] >= 0.25  # it waited for the first process instead of computing
    assert_same_tensors(DocumentCache(store).get_or_compute(doc.key, Counter(doc, before=pytest.fail))[0], doc)


# ----------------------------------------------------------------------------- keys
def test_the_key_changes_with_every_component(tokenizer, calib_dir: Path, texts: list[str]) -> None:
    base = make_engine(tokenizer, calib_dir)
    twin = make_engine(tokenizer, calib_dir)  # same weights, same settings
    prefix, suffix = base.prompting.layout().prefix, base.prompting.layout().suffix
    key = base.tiers.keys.root(prefix, texts[0], suffix)
    assert twin.tiers.keys.root(prefix, texts[0], suffix) == key
    variants = {
        "prefix": base.tiers.keys.root(prefix + " ", texts[0], suffix),
        "suffix": base.tiers.keys.root(prefix, texts[0], suffix + "."),
        "text": base.tiers.keys.root(prefix, texts[0][:-1], suffix),
        "text, one character": base.tiers.keys.root(prefix, texts[0].replace("e", "é", 1), suffix),
        "settings": make_engine(tokenizer, calib_dir, CONFIG.model_copy(update={"warmup_layers": 2})).tiers.keys.root(
            prefix, texts[0], suffix
        ),
        "scoring": make_engine(tokenizer, calib_dir, recipe=replace(RECIPE, scoring=uncalibrated())).tiers.keys.root(
            prefix, texts[0], suffix
        ),
        "shared root": make_engine(
            tokenizer, calib_dir, recipe=replace(RECIPE, shared_root=TreeRoot())
        ).tiers.keys.root(prefix, texts[0], suffix),
        "calibration segments": make_engine(
            tokenizer, calib_dir, recipe=replace(RECIPE, calibration_segments=3)
        ).tiers.keys.root(prefix, texts[0], suffix),
        "calibration": make_engine(
            tokenizer, calib_dir, CONFIG.model_copy(update={"max_chunk_len": 256})
        ).tiers.keys.root(prefix, texts[0], suffix),
        "dtype": make_engine(tokenizer, calib_dir, model=tiny_model("llama").to(torch.bfloat16)).tiers.keys.root(
            prefix, texts[0], suffix
        ),
        "weights": make_engine(tokenizer, calib_dir, model=tiny_model("llama", seed=1)).tiers.keys.root(
            prefix, texts[0], suffix
        ),
        "architecture": make_engine(tokenizer, calib_dir, model=tiny_model("qwen2")).tiers.keys.root(
            prefix, texts[0], suffix
        ),
    }
    assert all(v != key for v in variants.values()), [k for k, v in variants.items() if v == key]
    assert len(set(variants.values())) == len(variants)
    # the configured mode is only a default per call: a root is the same whichever mode the engine defaults to
    other_mode = make_engine(tokenizer, calib_dir, CONFIG.model_copy(update={"mode": "query_aware"}))
    assert other_mode.tiers.keys.root(prefix, texts[0], suffix) == key
    assert other_mode.tiers.keys.tier(prefix, texts[0]) != key and base.tiers.keys.full(prefix, texts[0], suffix) != key


def test_the_question_is_part_of_a_query_aware_key(tokenizer, calib_dir: Path, texts: list[str]) -> None:
    qa = make_engine(tokenizer, calib_dir, CONFIG.model_copy(update={"mode": "query_aware"}))
    a, b = qa.prompting.layout("Who is Jane?"), qa.prompting.layout("Who is Lydia?")
    assert qa.tiers.keys.root(a.prefix, texts[0], a.suffix) != qa.tiers.keys.root(b.prefix, texts[0], b.suffix)


# ----------------------------------------------------------------------------- listing, labels, clear
def test_entries_labels_info_and_clear(tokenizer, calib_dir: Path, tmp_path: Path, texts: list[str]) -> None:
    cache = DocumentCache(tmp_path)
    engine = make_engine(tokenizer, calib_dir, document_cache=cache)
    with cache.labelled("chapter-1.txt"):
        engine.answer(texts[0], "Who?", max_new_tokens=2)
    engine.answer(texts[1], "Who?", max_new_tokens=2)
    key0, key1 = engine.compress(texts[0]).key, engine.compress(texts[1]).key
    assert cache.set_label(key1, "chapter-2.txt")
    assert not cache.set_label("no-such-key", "x")

    listing = {e.key: e for e in DocumentCache(tmp_path).entries()}  # read back from the manifests
    assert {k: e.label for k, e in listing.items()} == {key0: "chapter-1.txt", key1: "chapter-2.txt"}
    entry = listing[key0]
    assert entry.on_disk and not entry.in_memory and entry.tokens <= 128
    assert entry.document_tokens == engine.prompting.count_tokens(texts[0]) and entry.nbytes > 0
    assert entry.disk_bytes > entry.nbytes and abs(entry.created - time.time()) < 600
    assert all(e.in_memory and e.on_disk for e in cache.entries())

    other = DocumentCache(tmp_path)
    with other.labelled("renamed.txt"):  # a labelled disk hit relabels the entry
        other.get_or_compute(key0, Counter(engine.compress(texts[0]), before=pytest.fail))
    assert {e.key: e.label for e in DocumentCache(tmp_path).entries()}[key0] == "renamed.txt"

    info = cache.info()
    assert info["directory"] == str(tmp_path) and info["disk_entries"] == 2 and info["entries"] == 2
    assert info["format_version"] == FORMAT_VERSION and info["disk_bytes"] > 0
    json.dumps(info)

    assert cache.discard(key1) and not cache.discard(key1)
    assert cache.clear() == 1
    assert cache.entries() == [] and cache.stats().disk_bytes == 0 and cache.stats().memory_bytes == 0
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.json"))
    assert engine.run(texts[0], "Who?", max_new_tokens=2).info.cache_source == "computed"


def test_an_empty_cache_is_still_the_engines_cache(tokenizer, calib_dir: Path) -> None:
    cache = DocumentCache()
    assert make_engine(tokenizer, calib_dir, document_cache=cache).document_cache is cache
