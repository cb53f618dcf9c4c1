"""``ModeCalls``: what a call about a document does in its mode, on a tiny random-weight engine."""

from __future__ import annotations

import pytest

from homer_integrations import HomerModel
from homer_integrations.homer.generation import GenerationOptions
from homer_integrations.mode_calls import ModeCalls
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
    tokens, source = calls.cache_document(document, "shared", None, None)
    assert tokens > 0 and source in ("memory", "computed")
    assert calls.tiers.document_cache.get(keys["shared"]) is not None


def test_a_document_compressed_for_another_question_is_refused(calls: ModeCalls, document: str) -> None:
    doc = calls.compress(document, "Who is there?", "query_aware", requested=True)
    with pytest.raises(ValueError, match="another question"):
        calls.run(doc, "Where are they?", "query_aware", GenerationOptions(max_new_tokens=1))
