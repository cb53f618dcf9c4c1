"""The ``DocumentCache`` façade over each store, and the options that choose its store."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from homer_integrations import CompressedDocument, HomerModel
from homer_integrations.cache import DocumentCache, DocumentCacheWarning, LocalStore, MemoryLRU, Store
from homer_integrations.cache.fsspec_store import FsspecStore
from homer_integrations.cli import main
from tests import test_cli
from tests.test_cli import ask_json, run_cli
from tests.test_document_cache import Counter, make_engine

tiny_cli = test_cli.tiny_cli  # the CLI tests' fixture: a tiny model in place of any named one


@pytest.mark.parametrize(
    ("where", "kind"),
    [(None, type(None)), ("dir", LocalStore), ("file-url", FsspecStore), ("memory-url", FsspecStore)],
)
def test_the_first_argument_picks_the_store(tmp_path: Path, where: str | None, kind: type) -> None:
    arg = {"dir": tmp_path, "file-url": (tmp_path / "s").as_uri(), "memory-url": "memory://homer-pick"}.get(where)
    cache = DocumentCache(arg)
    assert isinstance(cache.store, kind)
    assert cache.location == (None if arg is None else str(arg))
    assert isinstance(cache._memory, MemoryLRU)
    assert isinstance(DocumentCache(cache.store).store, kind) if cache.store else True


def test_open_builds_what_an_engine_asks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path))
    assert DocumentCache.open().store is None
    budgeted = DocumentCache.open(disk_budget=1000)
    assert budgeted.directory == tmp_path / "documents" and budgeted.store.budget_bytes == 1000
    assert isinstance(DocumentCache.open("memory://homer-open").store, FsspecStore)
    with pytest.raises(ValueError):
        DocumentCache(None, disk_budget_bytes=10)


def test_a_store_object_is_used_as_is(cache_docs: list[CompressedDocument]) -> None:
    store: Store = FsspecStore("memory://homer-as-is")
    cache = DocumentCache(store)
    assert cache.store is store
    doc = cache_docs[0]
    cache.get_or_compute(doc.key, Counter(doc))
    assert DocumentCache(store).get_or_compute(doc.key, Counter(doc, pytest.fail))[1] == "disk"


def test_the_engine_takes_a_store_url(tokenizer, cache_calib: Path, cache_texts: list[str]) -> None:
    engine: HomerModel = make_engine(tokenizer, cache_calib, store="memory://homer-engine")
    assert engine.document_cache.location == "memory://homer-engine"
    first = engine.run(cache_texts[1], "Who?", max_new_tokens=2)
    first.text()
    again = make_engine(tokenizer, cache_calib, store="memory://homer-engine").run(
        cache_texts[1], "Who?", max_new_tokens=2
    )
    again.text()
    assert (first.info.cache_source, again.info.cache_source) == ("computed", "disk")
    with pytest.raises(ValueError, match="not both"):
        make_engine(tokenizer, cache_calib, store="memory://x", document_cache=DocumentCache())


def test_cache_commands_take_a_store_and_a_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    url = (tmp_path / "shared").as_uri()
    cache = DocumentCache(url)
    for doc in cache_docs[:2]:
        cache.get_or_compute(doc.key, Counter(doc))
    assert main(["cache", "ls", "--json", "--store", url]) == 0
    assert {e["key"] for e in json.loads(capsys.readouterr().out)} == {d.key for d in cache_docs[:2]}

    local = tmp_path / "local"
    cache = DocumentCache(local)
    for doc in cache_docs:
        cache.get_or_compute(doc.key, Counter(doc))
    one = max(e.disk_bytes for e in cache.entries())
    assert main(["cache", "info", "--json", "--cache-dir", str(local), "--max-bytes", str(2 * one)]) == 0
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert info["disk_entries"] == 2 and info["disk_bytes"] <= 2 * one and info["disk_budget_bytes"] == 2 * one
    assert "evicted 2 cached document(s)" in captured.err

    assert main(["cache", "ls", "--store", url, "--max-bytes", "1MB"]) == 2
    assert "--max-bytes" in capsys.readouterr().err
    assert main(["cache", "ls", "--store", url, "--cache-dir", str(local)]) == 2
    assert "give one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cache", "ls", "--max-bytes", "lots"])
    assert "not a size" in capsys.readouterr().err


def test_ask_answers_from_a_store_url_in_a_later_run(
    capsys: pytest.CaptureFixture[str], tiny_cli: list[str], tmp_path: Path, cache_texts: list[str]
) -> None:
    book = tmp_path / "doc.txt"
    book.write_text(cache_texts[0], encoding="utf-8")
    url = (tmp_path / "shared").as_uri()
    options = [o for o in tiny_cli if o != "--no-disk-cache"]
    common = [str(book), "-q", "Who?", "--max-new-tokens", "2", *options, "--store", url]
    first = ask_json(capsys, *common)
    second = ask_json(capsys, *common)
    assert [first["answers"][0]["cache_source"], second["answers"][0]["cache_source"]] == ["computed", "disk"]
    assert second["cache_directory"] == url and second["cache"]["computations"] == 0
    assert first["answers"][0]["answer"] == second["answers"][0]["answer"]
    code, _, err = run_cli(capsys, "ask", *common, "--no-disk-cache")
    assert code == 2 and "give one" in err


def test_sizes_read_like_people_write_them() -> None:
    from homer_integrations.cli.options import byte_size as _byte_size

    assert [_byte_size(t) for t in ("0", "1500", "2KB", "1.5MB", "2GiB", "3mib")] == [
        0,
        1500,
        2000,
        1_500_000,
        2 * 1024**3,
        3 * 1024**2,
    ]


def test_an_entry_nothing_keeps_is_said_once_loudly(cache_docs: list[CompressedDocument]) -> None:
    cache = DocumentCache(memory_budget_bytes=16)  # smaller than any document, and no store
    with pytest.warns(DocumentCacheWarning, match=r"not kept: every question about it computes it again.*store="):
        cache.get_or_compute(cache_docs[0].key, Counter(cache_docs[0]))
    counter = Counter(cache_docs[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time is silent
        cache.get_or_compute(cache_docs[1].key, counter)
        cache.get_or_compute(cache_docs[1].key, counter)
    assert counter.calls == 2, "nothing kept it, so it was computed twice"


def test_a_store_keeps_what_memory_cannot_without_a_warning(
    tmp_path: Path, cache_docs: list[CompressedDocument]
) -> None:
    cache = DocumentCache(tmp_path, memory_budget_bytes=16)
    counter = Counter(cache_docs[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.get_or_compute(cache_docs[0].key, counter)
        assert cache.get_or_compute(cache_docs[0].key, counter)[1] == "disk"
    assert counter.calls == 1


def test_from_pretrained_keeps_documents_on_disk_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer
) -> None:
    from tests.conftest import tiny_model

    model_dir = tmp_path / "model"
    tiny_model("llama", vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path / "cache"))
    engine = HomerModel.from_pretrained(str(model_dir), dtype="float32", progress=False)
    assert engine.document_cache.directory == tmp_path / "cache" / "documents"
    for off in (False, None):
        assert HomerModel.from_pretrained(str(model_dir), store=off, progress=False).document_cache.store is None
    mine = DocumentCache(memory_budget_bytes=1000)
    assert HomerModel.from_pretrained(str(model_dir), document_cache=mine, progress=False).document_cache is mine
