"""The HOMER ``mode`` of ``HomerLLM`` and ``HomerQueryEngine``: per LLM, per call, per query engine.

A tiny random-weight model with the real SmolLM2 tokenizer (fast); each test gets a fresh
engine, so its document cache shows what the calls built: a ``root`` (``shared`` or ``full``)
or the document's ``leaf_tier`` (``query_aware``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import ValidationError
from llama_index.core.schema import Document

from homer_integrations.llama_index import HomerLLM, HomerQueryEngine
from tests.conftest import mode_engine

QUESTION = "Who is Mr. Bingley?"


def make_llm(tokenizer: Any, calibration: Path, llm_mode: str | None = None, **config: Any) -> HomerLLM:
    return HomerLLM(engine=mode_engine(tokenizer, calibration, **config), num_output=2, mode=llm_mode)


@pytest.fixture
def llm(tokenizer: Any, calibration: Path) -> HomerLLM:
    return make_llm(tokenizer, calibration)


def kinds(llm: HomerLLM) -> set[str]:
    return {e.kind for e in llm.engine.document_cache.entries()}


def test_the_default_follows_the_engine_config(tokenizer, calibration, text):
    default = make_llm(tokenizer, calibration)  # auto: a document that fits the window is kept whole
    response = default.complete(QUESTION, document=text)
    assert response.additional_kwargs["mode"] == "full" and kinds(default) == {"root"}
    assert response.additional_kwargs["document_seconds"] > 0
    aware = make_llm(tokenizer, calibration, mode="query_aware")
    response = aware.complete(QUESTION, document=text)
    assert response.additional_kwargs["mode"] == "query_aware" and kinds(aware) == {"leaf_tier"}
    shared = make_llm(tokenizer, calibration, mode="shared")
    assert shared.complete(QUESTION, document=text).additional_kwargs["mode"] == "shared"
    assert kinds(shared) == {"root"}


def test_every_call_form_takes_a_mode(llm, text):
    assert llm.complete(QUESTION, document=text, mode="query_aware").additional_kwargs["mode"] == "query_aware"
    assert kinds(llm) == {"leaf_tier"}
    *_, last = llm.stream_complete(QUESTION, document=text, mode="full")
    assert last.additional_kwargs["mode"] == "full" and kinds(llm) == {"leaf_tier", "root"}
    messages = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
    assert llm.chat(messages, document=text, mode="query_aware").additional_kwargs["mode"] == "query_aware"
    *_, last = llm.stream_chat(messages, document=text, mode="shared")
    assert last.additional_kwargs["mode"] == "shared"
    assert llm.engine.document_cache.stats().computations == 3, "leaf tier, full prefill, shared root: once each"

    async def run() -> list[str]:
        modes = [(await llm.acomplete(QUESTION, document=text, mode="full")).additional_kwargs["mode"]]
        modes.append((await llm.achat(messages, document=text, mode="query_aware")).additional_kwargs["mode"])
        streamed = [r async for r in await llm.astream_complete(QUESTION, document=text, mode="query_aware")]
        modes.append(streamed[-1].additional_kwargs["mode"])
        streamed = [r async for r in await llm.astream_chat(messages, document=text, mode="full")]
        modes.append(streamed[-1].additional_kwargs["mode"])
        return modes

    assert asyncio.run(run()) == ["full", "query_aware", "query_aware", "full"]
    assert llm.engine.document_cache.stats().computations == 3, "later calls read the cache"


def test_the_llm_field_is_the_default_and_a_call_still_wins(tokenizer, calibration, text):
    llm = make_llm(tokenizer, calibration, llm_mode="full")
    assert llm.complete(QUESTION, document=text).additional_kwargs["mode"] == "full"
    assert llm.complete(QUESTION, document=text, mode=None).additional_kwargs["mode"] == "full"
    assert llm.complete(QUESTION, document=text, mode="query_aware").additional_kwargs["mode"] == "query_aware"
    assert llm.complete("Hello").additional_kwargs["mode"] is None, "a plain prompt has no mode"


def test_the_query_engine_answers_and_precompresses_in_its_mode(llm, text):
    documents = [Document(text=text, id_="ch1")]
    aware = HomerQueryEngine(documents, llm, mode="query_aware")
    assert aware.mode == "query_aware"
    response = aware.query(QUESTION)
    assert response.metadata["ch1"]["homer"]["mode"] == "query_aware" and kinds(llm) == {"leaf_tier"}
    assert aware.precompress() == [None], "the leaf tier is there: nothing question-independent to report"

    full = HomerQueryEngine(documents, llm, mode="full", streaming=True)
    (stats,) = full.precompress()
    assert stats.tree_height == 0 and kinds(llm) == {"leaf_tier", "root"}
    streamed = full.query(QUESTION)
    "".join(streamed.response_gen)
    node = streamed.source_nodes[0]  # the spans the answer cites, once the stream is consumed
    assert node.node.metadata["homer"]["mode"] == "full" and node.node.metadata["homer"]["cache_source"] == "memory"
    assert all(n.node.ref_doc_id == "ch1" and n.node.node_id != "ch1" for n in streamed.source_nodes)

    shared = HomerQueryEngine(documents, llm, mode="shared")
    assert len(shared.precompress()) == 1 and llm.engine.document_cache.stats().computations == 3
    assert shared.query(QUESTION).metadata["ch1"]["homer"]["cache_source"] == "memory"


def test_the_query_engine_keeps_the_document_whole_by_default_and_its_queries_reuse_it(llm, text):
    default = HomerQueryEngine([Document(text=text, id_="ch1")], llm)
    assert default.mode == "auto"
    [prepared] = default.precompress()
    assert prepared.tree_height == 0 and prepared.cache_tokens == prepared.prompt_tokens and kinds(llm) == {"root"}
    stats = default.query(QUESTION).metadata["ch1"]["homer"]
    assert stats["mode"] == "full" and stats["cache_source"] == "memory" and stats["document_seconds"] == 0
    assert llm.engine.document_cache.stats().computations == 1
    aware = HomerQueryEngine([Document(text=text, id_="ch1")], llm, mode="query_aware")
    assert aware.precompress() == [None] and kinds(llm) == {"leaf_tier", "root"}


def test_precompress_prepares_every_mode(llm, text):
    assert llm.precompress(text, mode="query_aware") is None and kinds(llm) == {"leaf_tier"}
    assert llm.complete(QUESTION, document=text, mode="query_aware").additional_kwargs["cache_source"] == "memory"
    assert llm.precompress(text, mode="full").document_tokens > 500
    assert llm.complete(QUESTION, document=text, mode="full").additional_kwargs["cache_source"] == "memory"


def test_an_invalid_mode_is_refused_clearly(llm, text):
    with pytest.raises(ValueError, match=r"unknown HOMER mode 'sideways'.*'shared', 'query_aware', 'full'"):
        llm.complete(QUESTION, document=text, mode="sideways")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        llm.stream_chat([ChatMessage(role=MessageRole.USER, content=QUESTION)], mode="fast")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        llm.precompress(text, mode="fast")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        HomerQueryEngine([Document(text=text)], llm, mode="sideways")
    with pytest.raises(ValidationError, match="mode"):
        HomerLLM(engine=llm.engine, mode="sideways")
    assert llm.engine.document_cache.stats().computations == 0
