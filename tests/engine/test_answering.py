"""Answers carry the spans of the document they were read from, on a tiny random-weight engine."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from homer_integrations import HomerModel
from homer_integrations.engine.answering import TokenUsage
from homer_integrations.homer.decoding.sources import MOST_SOURCES
from homer_integrations.homer.document.prompt import concat, encode, encode_offsets, plain, units_at
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.echo import ECHO_LINE, Echo, PassageEcho
from homer_integrations.homer.reading.strategies import Recipe
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


def test_a_full_answer_reads_its_passages_echoed_after_the_prefill(tokenizer, calibration, novel: str) -> None:
    """The package's answer is the model's own greedy answer over the prefill's K/V, the echoed rows after it and
    the pointer line before the question; the echoed rows count as cache reads."""
    echo = PassageEcho(min_document_tokens=0)
    recipe = Recipe(calibration_segments=2, echo=echo)
    engine = make_engine(tokenizer, calibration, recipe=recipe)
    text, question = novel[30_000:35_000], "What did Mr. Collins say to Elizabeth?"
    stream = engine.run(text, question, mode="full", max_new_tokens=5)
    answer = stream.text()
    info = stream.info
    assert info.echoed_tokens > 16 and info.metadata()["echoed_tokens"] == info.echoed_tokens
    prompt = info.compression.prompt_tokens
    read = info.echoed_tokens
    assert info.token_usage() == TokenUsage(prompt + read + info.input_tokens, 5, prompt, read), "echoed: cache reads"
    assert info.sources and all(0 <= s.start < s.end <= len(text) for s in info.sources)

    doc = engine.compress(text, mode="full")
    ids, offsets = encode_offsets(tokenizer, text)
    passages = echo.selection.passages(tokenizer, ids, units_at(text, offsets, "statement"))
    taken = echo.document_tokens(question, passages)
    rows = Echo.of(DecoderStack(engine.model), doc, taken)
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(doc.keys, doc.values, strict=True)):
        cache.update(torch.cat([k, rows.keys[layer]], dim=2), torch.cat([v, rows.values[layer]], dim=2), layer)
    fed = encode(tokenizer, concat(plain(ECHO_LINE), engine.prompting.layout(question, "full").continuation))
    assert fed.numel() == info.input_tokens, "the pointer line, then the question"
    position, greedy = doc.last_position + 1 + rows.tokens, []
    with torch.no_grad():
        for _ in range(5):
            out = engine.model(
                fed[None], position_ids=torch.arange(position, position + fed.numel())[None], cache=cache
            )
            position += fed.numel()
            fed = out.logits[0, -1].argmax()[None]
            greedy.append(int(fed))
    assert answer == tokenizer.decode(greedy), "the model's own answer over the prefill and the echoed rows"

    engine.tiers.recipe = replace(recipe, echo=None)
    alone = engine.run(text, question, mode="full", max_new_tokens=5)
    alone.text()
    assert alone.info.echoed_tokens == 0 and alone.info.input_tokens < info.input_tokens
    assert alone.info.token_usage().cache_read == prompt, "the question alone after the prefill"


def test_a_short_document_or_another_mode_echoes_nothing(engine: HomerModel, novel: str) -> None:
    for mode in ("full", "query_aware", "shared"):
        stream = engine.run(novel[30_000:33_000], "What did Mr. Collins say?", mode=mode, max_new_tokens=2)
        stream.text()
        assert stream.info.echoed_tokens == 0, mode


def test_threads_asking_about_one_document_get_the_answers_each_gets_alone(tokenizer, calibration, novel: str) -> None:
    engine = make_engine(
        tokenizer, calibration, recipe=Recipe(calibration_segments=2, echo=PassageEcho(min_document_tokens=0))
    )
    text = novel[30_000:35_000]
    questions = ["What did Mr. Collins say to Elizabeth?", "Who came to the house?", "Where did Jane go?"]
    alone = {q: engine.answer(text, q, mode="full", max_new_tokens=4) for q in questions}
    answers: list[tuple[str, str]] = []
    threads = [
        threading.Thread(target=lambda q=q: answers.append((q, engine.answer(text, q, mode="full", max_new_tokens=4))))
        for q in questions * 2
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 6 and all(answer == alone[q] for q, answer in answers)
