"""``ModeCalls``: what a call about a document does in its mode, on a tiny random-weight engine."""

from __future__ import annotations

import pytest

from homer_integrations import HomerModel
from homer_integrations.engine.calls import ModeCalls
from homer_integrations.homer.decoding.generation import GenerationOptions
from tests.test_document_cache import make_engine


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> HomerModel:
    return make_engine(tokenizer, tmp_path_factory.mktemp("calibration"))


@pytest.fixture(scope="module")
def calls(engine: HomerModel) -> ModeCalls:
    return ModeCalls(engine.prompting, engine.tiers, engine.answerer)


@pytest.fixture(scope="module")
def document(novel: str) -> str:
    return novel[30_000:31_500]


def test_query_aware_without_a_question_is_the_shared_root_unless_asked_for(calls: ModeCalls, document: str) -> None:
    doc = calls.compress(document, None, "query_aware", requested=False)
    assert doc.question is None and doc.key == calls.entry_key(document, "shared")
    with pytest.raises(ValueError, match="pass question="):
        calls.compress(document, None, "query_aware", requested=True)


def test_each_mode_names_its_own_entry_and_prepares_it(calls: ModeCalls, document: str) -> None:
    keys = {mode: calls.entry_key(document, mode) for mode in ("shared", "full", "query_aware")}
    assert len(set(keys.values())) == 3
    tokens, source, stats = calls.cache_document(document, "shared", None, None)
    assert tokens > 0 and source in ("memory", "computed") and stats is not None
    assert stats.document_tokens == tokens
    assert calls.tiers.document_cache.get(keys["shared"]) is not None


def test_a_document_compressed_for_another_question_is_refused(calls: ModeCalls, document: str) -> None:
    doc = calls.compress(document, "Who is there?", "query_aware", requested=True)
    with pytest.raises(ValueError, match="another question"):
        calls.run(doc, "Where are they?", "query_aware", GenerationOptions(max_new_tokens=1))


def test_a_shared_root_past_the_window_warns_once_built_not_when_reread(
    calls: ModeCalls, novel: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the model's window a question-agnostic root keeps a sliver of the document: the build says so."""
    window = calls.prompting.context_window
    long = novel[40_000:50_000]  # past the 2048-token window, within the tiny tree's 3,040
    assert calls.prompting.count_tokens(long) > window
    with caplog.at_level("WARNING", logger="homer_integrations.engine.builder"):
        calls.compress(long, None, "shared", requested=True)
        calls.compress(long, None, "shared", requested=True)  # the stored root: nothing built, nothing said
    warned = [r.getMessage() for r in caplog.records if "past the model's" in r.getMessage()]
    assert len(warned) == 1 and f"{window}-token window" in warned[0] and "query_aware" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="homer_integrations.engine.builder"):
        calls.compress(novel[60_000:66_000], None, "shared", requested=True)  # pruned, within it
    assert not [r for r in caplog.records if "past the model's" in r.getMessage()], "within the window: silent"
