"""Corpus compression with a real tiny random-weight model saved to disk (workers load it by path), real
files, a local directory store and a real S3 API (moto's server), in process and on Ray in local mode."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache.store import open_store
from homer_integrations.cli import main
from homer_integrations.corpus import CorpusWorker, DocumentJob, DocumentOutcome, compress_corpus
from homer_integrations.engine.loading import SMOLLM2, converted_dir
from tests.cache.conftest import s3_endpoint, s3_url  # noqa: F401 (fixtures: a real S3 API on 127.0.0.1)
from tests.conftest import REPO, tiny_model

CONFIG = HomerConfig(max_chunk_len=128, warmup_layers=3)
QUESTION = "Who is speaking?"


class NeverLoads(CorpusWorker):
    """A worker that must not be needed: starting one fails the run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a worker was started although every document is stored")


class DiesOnce(CorpusWorker):
    """Exits its process at once (no cleanup, like a killed machine) the first time it meets a document
    that has a ``.kill`` file beside it; ``.died`` beside it marks that it did."""

    def compress(self, job: DocumentJob) -> DocumentOutcome:
        path = Path(job.path)
        died = path.with_suffix(".died")
        if path.with_suffix(".kill").exists() and not died.exists():
            died.touch()
            os._exit(1)
        return super().compress(job)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, smol_parts: Any) -> str:
    """A tiny random-weight Llama and the real SmolLM2 tokenizer, saved as a model directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_model("llama").save_pretrained(path)
    AutoTokenizer.from_pretrained(str(converted_dir(SMOLLM2))).save_pretrained(path)
    return str(path)


@pytest.fixture
def corpus(tmp_path: Path, novel: str) -> Path:
    """Four ~350-token documents (trees of height 2 at max_chunk_len 128), one in a subdirectory."""
    folder = tmp_path / "corpus"
    (folder / "more").mkdir(parents=True)
    for i in range(4):
        name = f"more/doc{i}.txt" if i == 3 else f"doc{i}.txt"
        (folder / name).write_text(novel[30_000 + i * 1500 : 30_000 + (i + 1) * 1500], encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def ray(s3_endpoint: str) -> Any:  # noqa: F811 (after the S3 environment: workers inherit it)
    """Ray in local mode with two CPUs; workers import this test package too (the workers above)."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
    )
    yield ray
    ray.shutdown()


def statuses(report: Any) -> dict[str, str]:
    return {Path(d.path).name: d.status for d in report.documents}


def answered_from(model_dir: str, store: str, text: str) -> str | None:
    """Where a fresh engine over the store found ``text``'s cache when asked about it."""
    engine = HomerModel.from_pretrained(model_dir, config=CONFIG, store=store, progress=False)
    stream = engine.run(text, QUESTION, max_new_tokens=1)
    stream.text()
    return stream.info.cache_source


# ----------------------------------------------------------------------------- in process
def test_in_process_stores_every_document_and_a_rerun_starts_no_worker(
    model_dir: str, corpus: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (corpus / "notes.txt").write_bytes(b"")  # unreadable: reported, the rest goes on
    report = compress_corpus([corpus], store, model=model_dir, config=CONFIG, progress=False)

    assert statuses(report) == {
        "doc0.txt": "compressed",
        "doc1.txt": "compressed",
        "doc2.txt": "compressed",
        "notes.txt": "failed",
        "doc3.txt": "compressed",
    }
    (notes,) = [d for d in report.documents if d.status == "failed"]
    assert not report.ok and notes.path.endswith("notes.txt") and "empty" in (notes.error or "")
    assert report.backend == "process" and report.workers == 1
    entries = open_store(store).entries()
    assert {e.label for e in entries.values()} == {"doc0.txt", "doc1.txt", "doc2.txt", "doc3.txt"}
    assert {d.key for d in report.documents if d.key} == set(entries)
    assert all(d.document_tokens > 300 and d.peak_rss_bytes > 0 for d in report.documents if d.key)

    (corpus / "notes.txt").unlink()
    again = compress_corpus([corpus], store, model=model_dir, config=CONFIG, progress=False, worker_class=NeverLoads)
    assert again.ok and again.count("skipped") == 4 and again.workers == 0

    text = (corpus / "doc1.txt").read_text(encoding="utf-8")
    assert answered_from(model_dir, str(store), text) == "disk"


def test_an_entry_gone_from_the_store_is_compressed_again(model_dir: str, corpus: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = compress_corpus([corpus], store, model=model_dir, config=CONFIG, progress=False)
    gone = first.documents[2]
    assert open_store(store).discard(gone.key or "")  # e.g. evicted over the disk budget

    again = compress_corpus([corpus], store, model=model_dir, config=CONFIG, progress=False)
    assert statuses(again) == {
        "doc0.txt": "skipped",
        "doc1.txt": "skipped",
        "doc2.txt": "compressed",
        "doc3.txt": "skipped",
    }
    assert again.documents[2].key == gone.key

    other = compress_corpus(  # other settings name other leaf tiers: nothing is skipped
        [corpus], store, model=model_dir, config=CONFIG.model_copy(update={"max_chunk_len": 160}), progress=False,
        mode="query_aware",
    )  # fmt: skip
    assert other.count("compressed") == 4 and not {d.key for d in other.documents} & {d.key for d in first.documents}


def test_a_loaded_engine_compresses_in_process_and_finds_what_it_stored(
    model_dir: str, corpus: Path, tmp_path: Path
) -> None:
    engine = HomerModel.from_pretrained(model_dir, config=CONFIG, progress=False, store=False)
    store = tmp_path / "store"
    first = compress_corpus([corpus / "doc0.txt"], store, model=engine, mode="shared", progress=False)
    assert statuses(first) == {"doc0.txt": "compressed"}
    again = compress_corpus(
        [corpus / "doc0.txt"], store, model=engine, mode="shared", progress=False, worker_class=NeverLoads
    )
    assert statuses(again) == {"doc0.txt": "skipped"}
    assert len(engine.document_cache.entries()) == 0, "the caller's own cache is left alone"

    tiers = compress_corpus([corpus / "doc0.txt"], store, model=engine, progress=False, mode="query_aware")
    assert statuses(tiers) == {"doc0.txt": "compressed"}, "the leaf tier is another entry"
    assert open_store(store).entries()[tiers.documents[0].key or ""].kind == "leaf_tier"
    text = (corpus / "doc0.txt").read_text(encoding="utf-8")
    stream = engine.with_store(store).run(text, QUESTION, mode="query_aware")
    stream.text()
    assert stream.info.mode == "query_aware" and stream.info.cache_source == "disk", "replayed from the stored tier"
    kept = compress_corpus([corpus / "doc0.txt"], store, model=engine, progress=False)  # the default: auto
    assert statuses(kept) == {"doc0.txt": "compressed"}, "the whole prefill (the document fits) is a third entry"
    stream = engine.with_store(store).run(text, QUESTION)
    stream.text()
    assert stream.info.mode == "full" and stream.info.cache_source == "disk", "read after the stored prefill"
    with pytest.raises(ValueError, match="Ray workers load the model"):
        compress_corpus([corpus], store, model=engine, ray_address="local", progress=False)


def test_a_document_past_the_window_needs_no_entry_and_is_reported_so(
    model_dir: str, tmp_path: Path, novel: str
) -> None:
    engine = HomerModel.from_pretrained(model_dir, config=CONFIG, progress=False, store=False)
    book = tmp_path / "book.txt"
    book.write_text(novel[20_000:32_000], encoding="utf-8")
    assert engine.count_tokens(book.read_text(encoding="utf-8")) > engine.context_window
    report = compress_corpus([book], tmp_path / "store", model=engine, progress=False)  # query_aware, the default
    assert statuses(report) == {"book.txt": "unneeded"}, "its questions read the text's passages: no tier to build"
    assert open_store(tmp_path / "store").entries() == {}


# ----------------------------------------------------------------------------- Ray
def test_ray_workers_report_a_worker_that_died_for_good_then_retry_a_killed_one_into_the_s3_store(
    ray: Any,
    model_dir: str,
    corpus: Path,
    s3_url: str,  # noqa: F811
) -> None:
    # One scenario, three Ray runs: every run starts worker processes that import torch, so the
    # failure and the retry share them rather than each paying for its own.
    (corpus / "doc1.kill").touch()
    report = compress_corpus(
        [corpus], s3_url, model=model_dir, config=CONFIG, ray_address="local", workers=2, retries=0,
        progress=False, worker_class=DiesOnce,
    )  # fmt: skip
    # a worker that failed before reaching doc1 (its start, its model load) leaves no mark: say why it failed
    errors = {Path(d.path).name: d.error for d in report.documents if d.error}
    assert (corpus / "doc1.died").exists(), f"no worker reached doc1 to die on it; the run's errors: {errors}"
    assert not report.ok and report.backend == "ray" and report.workers == 2
    assert statuses(report)["doc1.txt"] == "failed" and "died" in (report.documents[1].error or "")
    assert statuses(report) | {"doc1.txt": "compressed"} == dict.fromkeys(statuses(report), "compressed")
    assert len(report.peak_rss_by_worker()) >= 1

    (corpus / "doc1.died").unlink()  # its next worker dies again, once, and is retried
    again = compress_corpus(
        [corpus], s3_url, model=model_dir, config=CONFIG, ray_address="local", workers=2, retries=1,
        progress=False, worker_class=DiesOnce,
    )  # fmt: skip
    assert (corpus / "doc1.died").exists()
    assert again.ok and statuses(again) == {
        "doc0.txt": "skipped",
        "doc1.txt": "compressed",
        "doc2.txt": "skipped",
        "doc3.txt": "skipped",
    }
    keys = {d.key for d in report.documents + again.documents} - {None}
    assert len(keys) == 4 and keys == set(open_store(s3_url).entries())

    stored = compress_corpus(
        [corpus], s3_url, model=model_dir, config=CONFIG, ray_address="local", progress=False, worker_class=NeverLoads
    )
    assert stored.ok and stored.count("skipped") == 4

    text = (corpus / "doc1.txt").read_text(encoding="utf-8")
    assert answered_from(model_dir, s3_url, text) == "disk"


# ----------------------------------------------------------------------------- the command
def test_compress_command_then_ask_answers_from_the_store(
    capsys: pytest.CaptureFixture[str], model_dir: str, corpus: Path, tmp_path: Path
) -> None:
    store = str(tmp_path / "store")
    settings = ["--model", model_dir, "--max-chunk-len", "128", "--warmup-layers", "3"]
    code = main(["compress", str(corpus), "--store", store, *settings, "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"4 documents into {store}: 4 compressed, 0 already stored, 0 failed" in out and "this process" in out

    code = main(["compress", str(corpus), "--store", store, *settings, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["skipped"] == 4 and report["compressed"] == 0

    book = corpus / "more" / "doc3.txt"
    code = main(["ask", str(book), "-q", QUESTION, "--store", store, *settings, "--max-new-tokens", "1", "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 0 and answer["answers"][0]["cache_source"] == "disk"

    code = main(["compress", str(tmp_path / "nowhere"), "--store", store, *settings])
    assert code == 1 and "no such file or directory" in capsys.readouterr().err
