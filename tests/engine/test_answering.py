"""Answers carry the spans of the document they were read from, on a tiny random-weight engine."""

from __future__ import annotations

import itertools

import pytest

from homer_integrations import HomerModel
from homer_integrations.homer.decoding.sources import MOST_SOURCES
from tests.test_document_cache import make_engine


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> HomerModel:
    return make_engine(tokenizer, tmp_path_factory.mktemp("calibration"))


@pytest.mark.parametrize("mode", ["full", "query_aware"])
def test_an_answer_cites_spans_of_its_document(engine: HomerModel, novel: str, mode: str) -> None:
    text = novel[30_000:33_000]
    stream = engine.run(text, "Who came to the house?", mode=mode, max_new_tokens=4)
    assert stream.info.sources == [], "cited before the answer ended"
    stream.text()
    sources = stream.info.sources
    assert 1 <= len(sources) <= MOST_SOURCES
    assert all(0 <= s.start < s.end <= len(text) and text[s.start : s.end].strip() for s in sources)
    assert [s.start for s in sources] == sorted(s.start for s in sources)
    assert all(a.end < b.start for a, b in itertools.pairwise(sources)), "cited spans overlap"
    assert 0 < sum(s.score for s in sources) <= 1 + 1e-6
    assert stream.info.metadata()["sources"] == [s.as_dict() for s in sources]


def test_a_plain_prompt_and_a_compressed_document_without_its_text_cite_nothing(engine: HomerModel, novel: str) -> None:
    plain = engine.generate("Hello there", max_new_tokens=2)
    plain.text()
    assert plain.info.sources == []
    doc = engine.compress(novel[30_000:31_500], mode="full")
    stream = engine.run(doc, "Who came?", max_new_tokens=2)
    stream.text()
    assert stream.info.sources == []
