"""Fault injection on the disk document cache (issue 16): damaged, foreign or impossible entries made from real files.

Every case is produced on disk under ``tmp_path`` by the cache's own writer (so the file is well
formed and its checksum matches) or by editing those files, then read back by a cache that knows
the tiny random-weight model's ``CacheSpec``. Each must end the same way: no exception, a
``DocumentCacheWarning``, the entry recomputed (equal to a clean compression, the same answer),
never another document's answer, and nothing this cache did not write removed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save, save_file

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache, DocumentCacheWarning
from homer_integrations.cli import main
from homer_integrations.homer.kv.compressed import CacheSpec, check_consistent, validate
from tests import test_document_cache as base
from tests.test_document_cache import Counter, _paths, _rewrite_manifest, assert_same_tensors

# The engine, its calibration and the texts come from the document-cache tests' fixtures.
calib_dir = base.calib_dir
engine = base.engine
texts = base.texts

QUESTION = "Who wrote the letter?"
FOREIGN = {"config.json": b'{"model_type": "llama"}', "package.json": b'{"name": "app"}', "notes.tmp": b"mine"}
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pair(engine: HomerModel, texts: list[str]) -> tuple[CompressedDocument, CompressedDocument]:
    """Two clean compressions (the engine's memory cache): the document asked about and another one."""
    return engine.compress(texts[0]), engine.compress(texts[1])


@pytest.fixture(scope="module")
def expected(engine: HomerModel, texts: list[str], pair: tuple[CompressedDocument, CompressedDocument]) -> str:
    """The clean answer about ``texts[0]``; the other document's answer differs."""
    answer = engine.answer(texts[0], QUESTION, max_new_tokens=6)
    assert engine.answer(texts[1], QUESTION, max_new_tokens=6) != answer
    return answer


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Path]:
    """A cache directory that also holds files the cache never wrote; they must survive every test."""
    directory = tmp_path / "cache"
    directory.mkdir()
    for name, data in FOREIGN.items():
        (directory / name).write_bytes(data)
    (tmp_path / "outside.txt").write_text("outside")
    yield directory
    assert {name: (directory / name).read_bytes() for name in FOREIGN} == FOREIGN
    assert (tmp_path / "outside.txt").read_text() == "outside"


@pytest.fixture()
def on_disk(engine: HomerModel, store: Path, expected: str) -> HomerModel:
    """The module's engine over a disk cache in ``store`` (a fresh cache object: a restarted program).

    Asks for ``expected`` first, so the clean documents and answer come from the memory cache.
    """
    return engine.with_store(DocumentCache(store))


def write_entry(directory: Path, doc: CompressedDocument, key: str) -> None:
    """Write ``doc`` under ``key`` with the cache's own writer: a well-formed entry whose checksum matches."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        writer = DocumentCache(directory)
        writer.discard(key)
        assert writer.get_or_compute(key, Counter(doc))[1] == "computed"


def assert_recomputed(directory: Path, doc: CompressedDocument, spec: CacheSpec, match: str) -> None:
    """A lookup warns (``match``), computes, returns ``doc``; the rewritten entry then loads silently."""
    cache, compute = DocumentCache(directory), Counter(doc)
    with pytest.warns(DocumentCacheWarning, match=match):
        result, source = cache.get_or_compute(doc.key, compute, spec=spec)
    assert (result, source, compute.calls) == (doc, "computed", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reloaded, source = DocumentCache(directory).get_or_compute(doc.key, Counter(doc, pytest.fail), spec=spec)
    assert source == "disk"
    assert_same_tensors(reloaded, doc)


# ----------------------------------------------------------------------------- forged documents
def _kv(doc: CompressedDocument, fn: Callable[[torch.Tensor], torch.Tensor]) -> CompressedDocument:
    return replace(doc, keys=tuple(map(fn, doc.keys)), values=tuple(map(fn, doc.values)))


def _poke(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[t.numel() // 2] = value
    return t


def _positions(doc: CompressedDocument, index: int, value: int) -> CompressedDocument:
    positions = doc.position_ids.clone()
    positions[index] = value
    return replace(doc, position_ids=positions, last_position=int(positions.max()))


def _origin(doc: CompressedDocument, index: int, value: int) -> CompressedDocument:
    origin = doc.origin.clone()
    origin[index] = value
    return replace(doc, origin=origin)


def _twice(doc: CompressedDocument) -> CompressedDocument:
    doubled = _kv(doc, lambda t: torch.cat([t, t], dim=2))
    return replace(doubled, position_ids=doc.position_ids.repeat(2), origin=doc.origin.repeat(2))


Forgery = Callable[[CompressedDocument, CompressedDocument], CompressedDocument]
NAN, INF = float("nan"), float("inf")
# name: (forge(doc, other), the reason given, also caught by a cache that has no model spec);
# <n> in a reason stands for the document's cached token count (it depends on how the root is selected).
FORGERIES: dict[str, tuple[Forgery, str, bool]] = {
    "fewer_layers": (lambda d, o: replace(d, keys=d.keys[:4], values=d.values[:4]), "4/4 key/value layers", False),
    "more_kv_heads": (lambda d, o: _kv(d, lambda t: torch.cat([t, t], dim=1)), r"\(1, 4, <n>, 16\), the model", False),
    "other_head_dim": (lambda d, o: _kv(d, lambda t: t[..., :8].contiguous()), r"\(1, 2, <n>, 8\), the model", False),
    "half_precision": (lambda d, o: _kv(d, lambda t: t.half()), "float16 .* the model needs torch.float32", False),
    "nan_key": (lambda d, o: replace(d, keys=(_poke(d.keys[0], NAN), *d.keys[1:])), "NaN or infinite", True),
    "inf_value": (lambda d, o: replace(d, values=(*d.values[:-1], _poke(d.values[-1], -INF))), "NaN or infinite", True),
    "last_position_1e8": (lambda d, o: replace(d, last_position=10**8), "last_position is 100000000", True),
    "last_position_not_the_max": (lambda d, o: replace(d, last_position=d.last_position - 1), "last_position", True),
    "position_at_max_chunk_len": (lambda d, o: _positions(d, -1, 128), "128 is not below the position limit", False),
    "negative_position": (lambda d, o: _positions(d, 0, -1), r"positions span \[-1", True),
    "float_positions": (lambda d, o: replace(d, position_ids=d.position_ids.float()), "not <n> integers", True),
    "origin_past_the_document": (lambda d, o: _origin(d, -1, d.stats.document_tokens), "origins span", True),
    "origin_below_minus_one": (lambda d, o: _origin(d, 0, -2), r"origins span \[-2", True),
    "too_many_tokens": (lambda d, o: _twice(d), "<2n> cached tokens, over the final cache length 128", False),
    "logits_of_another_vocabulary": (
        lambda d, o: replace(d, next_token_logits=torch.zeros(100)),
        r"\(100,\), the vocabulary has 49152",
        False,
    ),
    "nan_logits": (lambda d, o: replace(d, next_token_logits=torch.full((49152,), NAN)), "NaN or infinite", True),
    "other_documents_tensors_inf": (
        lambda d, o: replace(o, key=d.key, keys=(_poke(o.keys[0], INF), *o.keys[1:])),
        "NaN or infinite",
        True,
    ),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_well_formed_entry_that_does_not_fit_the_model_is_recomputed(
    store: Path, engine: HomerModel, pair: tuple[CompressedDocument, CompressedDocument], name: str
) -> None:
    doc, other = pair
    forge, reason, model_independent = FORGERIES[name]
    n = doc.position_ids.numel()
    reason = reason.replace("<2n>", str(2 * n)).replace("<n>", str(n))
    write_entry(store, forge(doc, other), doc.key)
    assert_recomputed(store, doc, engine.tiers.cache_spec, f"fails validation: .*{reason}")
    if model_independent:  # a cache used without a model spec still refuses it
        write_entry(store, forge(doc, other), doc.key)
        cache = DocumentCache(store)
        with pytest.warns(DocumentCacheWarning, match=f"fails validation: .*{reason}"):
            assert cache.get_or_compute(doc.key, Counter(doc)) == (doc, "computed")


def test_validate_accepts_the_clean_documents(
    engine: HomerModel, pair: tuple[CompressedDocument, CompressedDocument]
) -> None:
    for doc in pair:
        validate(doc, engine.tiers.cache_spec)
        check_consistent(doc)
    with pytest.raises(ValueError, match="key/value layers, the model has 7"):
        validate(pair[0], replace(engine.tiers.cache_spec, num_layers=7))


@FAST
@given(
    layers=st.integers(1, 8),
    heads=st.integers(1, 4),
    head_dim=st.sampled_from([4, 8, 16, 32]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_any_other_shape_is_discarded(
    tmp_path_factory: pytest.TempPathFactory,
    engine: HomerModel,
    pair: tuple[CompressedDocument, CompressedDocument],
    layers: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> None:
    spec, doc = engine.tiers.cache_spec, pair[0]
    if (layers, heads, head_dim, dtype) == (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype):
        return
    shape = (1, heads, doc.num_tokens, head_dim)
    keys, values = (tuple(torch.randn(shape).to(dtype) for _ in range(layers)) for _ in "kv")
    directory = tmp_path_factory.mktemp("shapes")
    write_entry(directory, replace(doc, keys=keys, values=values), doc.key)
    assert_recomputed(directory, doc, spec, "fails validation")


@pytest.mark.parametrize("name", ["more_kv_heads", "nan_key", "last_position_1e8"])
def test_the_engine_answers_as_if_the_entry_were_clean(
    on_disk: HomerModel,
    store: Path,
    texts: list[str],
    pair: tuple[CompressedDocument, CompressedDocument],
    expected: str,
    name: str,
) -> None:
    """The issue's crash (wrong K/V heads) and garbage answers (NaN, last_position=1e8), end to end."""
    write_entry(store, FORGERIES[name][0](*pair), pair[0].key)
    with pytest.warns(DocumentCacheWarning, match="fails validation"):
        stream = on_disk.run(texts[0], QUESTION, max_new_tokens=6)
        assert stream.text() == expected
    assert stream.info.cache_source == "computed"
    on_disk = on_disk.with_store(DocumentCache(store))  # restarted: the rewritten entry is served, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = on_disk.run(texts[0], QUESTION, max_new_tokens=6)
        assert stream.text() == expected and stream.info.cache_source == "disk"


def test_an_entry_read_without_a_spec_is_checked_when_one_is_given(
    store: Path, engine: HomerModel, pair: tuple[CompressedDocument, CompressedDocument]
) -> None:
    doc = pair[0]
    write_entry(store, FORGERIES["more_kv_heads"][0](*pair), doc.key)
    cache = DocumentCache(store)
    assert cache.get(doc.key, spec=engine.tiers.cache_spec) is None
    assert cache.get(doc.key) is not None  # no spec: nothing says it is wrong
    with pytest.warns(DocumentCacheWarning, match="fails validation"):
        assert cache.get_or_compute(doc.key, Counter(doc), spec=engine.tiers.cache_spec) == (doc, "computed")
    assert cache.get_or_compute(doc.key, Counter(doc, pytest.fail), spec=engine.tiers.cache_spec) == (doc, "memory")


# ----------------------------------------------------------------------------- another document's files
def copy_as_is(directory: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    for src, dst in zip(_paths(directory, other.key), _paths(directory, doc.key), strict=True):
        shutil.copyfile(src, dst)


def copy_and_edit_key(directory: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    copy_as_is(directory, doc, other)
    manifest_path = _paths(directory, doc.key)[1]
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "key": doc.key}))


def copy_with_tensors_rekeyed(directory: Path, doc: CompressedDocument, other: CompressedDocument) -> None:
    """Another document's tensors whose metadata and manifest were edited to this key (a version-1 style stamp)."""
    copy_and_edit_key(directory, doc, other)
    tensors, meta = other.to_tensors()
    data = save(tensors, {**meta, "key": doc.key})
    _paths(directory, doc.key)[0].write_bytes(data)
    _rewrite_manifest(directory, doc.key, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


@pytest.mark.parametrize(
    ("copy", "match"),
    [
        (copy_as_is, "belongs to another document"),
        (copy_and_edit_key, "checksum"),
        (copy_with_tensors_rekeyed, "checksum"),
    ],
    ids=["as_is", "key_edited", "tensors_rekeyed"],
)
def test_another_documents_entry_never_answers(
    on_disk: HomerModel,
    store: Path,
    texts: list[str],
    pair: tuple[CompressedDocument, CompressedDocument],
    expected: str,
    copy: Callable[[Path, CompressedDocument, CompressedDocument], None],
    match: str,
) -> None:
    doc, other = pair
    write_entry(store, other, other.key)
    copy(store, doc, other)
    with pytest.warns(DocumentCacheWarning, match=match):
        stream = on_disk.run(texts[0], QUESTION, max_new_tokens=6)
        assert stream.text() == expected
    assert stream.info.cache_source == "computed"
    assert_same_tensors(DocumentCache(store).get(other.key), other)  # the original is untouched


# ----------------------------------------------------------------------------- random damage
@FAST
@given(
    target=st.sampled_from(["tensors", "manifest"]),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
)
def test_random_byte_damage_never_serves_a_wrong_document(
    tmp_path_factory: pytest.TempPathFactory,
    engine: HomerModel,
    pair: tuple[CompressedDocument, CompressedDocument],
    target: str,
    edits: list[tuple[float, int]],
    cut: float | None,
) -> None:
    doc = pair[0]
    directory = tmp_path_factory.mktemp("damage")
    write_entry(directory, doc, doc.key)
    path = _paths(directory, doc.key)[0 if target == "tensors" else 1]
    data = bytearray(path.read_bytes())
    for where, value in edits:
        data[int(where * len(data))] = value
    path.write_bytes(bytes(data[: int(cut * len(data))] if cut is not None else data))

    compute = Counter(doc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, source = DocumentCache(directory).get_or_compute(doc.key, compute, spec=engine.tiers.cache_spec)
    assert_same_tensors(result, doc)
    warned = any(issubclass(w.category, DocumentCacheWarning) for w in caught)
    assert (source, compute.calls, warned) in {("disk", 0, False), ("computed", 1, True)}


def test_a_manifest_size_that_is_not_an_integer_says_so(
    store: Path, engine: HomerModel, pair: tuple[CompressedDocument, CompressedDocument]
) -> None:
    doc = pair[0]
    for size in (str, float, lambda n: None):
        write_entry(store, doc, doc.key)
        _rewrite_manifest(store, doc.key, size=size(_paths(store, doc.key)[0].stat().st_size))
        with pytest.warns(DocumentCacheWarning, match="is not a whole number of bytes") as caught:
            assert (
                DocumentCache(store).get_or_compute(doc.key, Counter(doc), spec=engine.tiers.cache_spec)[1]
                == "computed"
            )
        assert not any("the manifest says" in str(w.message) for w in caught)


# ----------------------------------------------------------------------------- directories in an entry's place
@pytest.mark.parametrize("where", ["manifest", "tensors", "both"])
def test_a_directory_in_place_of_an_entry_is_reported_and_kept(
    on_disk: HomerModel,
    store: Path,
    texts: list[str],
    pair: tuple[CompressedDocument, CompressedDocument],
    expected: str,
    where: str,
) -> None:
    tensors_path, manifest_path = _paths(store, pair[0].key)
    blocked = {"manifest": [manifest_path], "tensors": [tensors_path], "both": [manifest_path, tensors_path]}[where]
    for path in blocked:
        path.mkdir()
        (path / "keep.txt").write_text("not the cache's")
    cache = on_disk.document_cache
    with pytest.warns(DocumentCacheWarning) as caught:
        stream = on_disk.run(texts[0], QUESTION, max_new_tokens=6)
        assert stream.text() == expected
    assert stream.info.cache_source == "computed"
    assert any("keeping it in memory only" in str(w.message) for w in caught)
    assert on_disk.run(texts[0], QUESTION, max_new_tokens=6).info.cache_source == "memory"
    assert not cache.discard("no-such-key")
    assert cache.discard(pair[0].key)  # the memory copy; the directories stay
    cache.clear()
    with pytest.warns(DocumentCacheWarning):  # a restarted program: computed again, reported again
        assert on_disk.answer(texts[0], QUESTION, max_new_tokens=6) == expected
    assert all((path / "keep.txt").read_text() == "not the cache's" for path in blocked)
    assert sorted(p.name for p in store.glob("*.safetensors")) == [tensors_path.name] * (where != "manifest")


# ----------------------------------------------------------------------------- clear, discard, info
def test_clear_and_discard_remove_only_what_the_cache_wrote(
    store: Path, pair: tuple[CompressedDocument, CompressedDocument], capsys: pytest.CaptureFixture[str]
) -> None:
    doc, other = pair
    save_file({"weight": torch.zeros(2)}, str(store / "model.safetensors"))
    (store / "sub").mkdir()
    (store / "sub" / "data.json").write_text("{}")
    (store / "broken.json").write_text('{"format": "homer-document-cache-entry", "key": ')
    write_entry(store, doc, doc.key)
    write_entry(store, other, other.key)
    ours_tmp = store / f".{doc.key}.json.4242.0123abcd.tmp"
    ours_tmp.write_text("half written")
    theirs = {p: p.read_bytes() for p in (store / "model.safetensors", store / "sub" / "data.json")}
    theirs[store / "broken.json"] = (store / "broken.json").read_bytes()
    theirs[store / ".notes.tmp"] = b"not ours"
    (store / ".notes.tmp").write_bytes(b"not ours")

    assert main(["cache", "info", "--json", "--cache-dir", str(store)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert main(["cache", "ls", "--json", "--cache-dir", str(store)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert info["disk_entries"] == len(listed) == 2
    assert info["disk_bytes"] == sum(e["disk_bytes"] for e in listed)

    cache = DocumentCache(store)
    assert not cache.discard("config") and not cache.discard("model")  # foreign files named like keys
    assert cache.discard(other.key) and not _paths(store, other.key)[0].exists()
    assert main(["cache", "clear", "--cache-dir", str(store)]) == 0
    assert capsys.readouterr().out.startswith("removed 1 cached document(s)")
    assert not ours_tmp.exists() and not any(p.exists() for p in _paths(store, doc.key))
    assert not list((store / "locks").iterdir())
    assert {p: p.read_bytes() for p in theirs} == theirs
