"""The HOMER ``mode`` of ``ChatHomer``, ``HomerLLM`` and ``HomerRouter``: per model, per call, bound.

A tiny random-weight model with the real SmolLM2 tokenizer (fast); each test gets a fresh
engine, so its document cache shows what the calls built: a ``root`` (``shared`` or ``full``)
or the document's ``leaf_tier`` (``query_aware``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from pydantic import ValidationError

from homer_integrations import HomerModel
from homer_integrations.langchain import ChatHomer, HomerLLM, HomerRouter
from tests.conftest import mode_engine

QUESTION = "Who is Mr. Bingley?"


@pytest.fixture
def engine(tokenizer: Any, calibration: Path) -> HomerModel:
    return mode_engine(tokenizer, calibration)


def kinds(engine: HomerModel) -> set[str]:
    return {e.kind for e in engine.document_cache.entries()}


def served(message: AIMessage) -> str | None:
    return message.response_metadata["homer"]["mode"]


def test_the_default_follows_the_engine_config(tokenizer, calibration, text):
    default = mode_engine(tokenizer, calibration)  # auto: a document that fits the window is kept whole
    message = ChatHomer(engine=default, max_tokens=2).invoke(QUESTION, document=text)
    assert served(message) == "full" and kinds(default) == {"root"}
    assert message.response_metadata["homer"]["document_seconds"] > 0
    aware = mode_engine(tokenizer, calibration, mode="query_aware")
    message = ChatHomer(engine=aware, max_tokens=2).invoke(QUESTION, document=text)
    assert served(message) == "query_aware" and kinds(aware) == {"leaf_tier"}
    shared = mode_engine(tokenizer, calibration, mode="shared")
    assert served(ChatHomer(engine=shared, max_tokens=2).invoke(QUESTION, document=text)) == "shared"
    assert kinds(shared) == {"root"}


def test_a_call_overrides_the_mode_the_langchain_way(engine, text):
    chat = ChatHomer(engine=engine, max_tokens=2)
    message = chat.invoke(QUESTION, document=text, mode="shared")
    assert served(message) == "shared" and kinds(engine) == {"root"}
    assert served(chat.bind(mode="full").invoke(QUESTION, document=text)) == "full"
    assert kinds(engine) == {"root"} and engine.document_cache.stats().computations == 2
    default = chat.invoke(QUESTION, document=text)
    assert served(default) == "full", "the engine's default again: auto keeps this document whole"
    assert default.response_metadata["homer"]["cache_source"] == "memory"
    assert kinds(engine) == {"root"} and engine.document_cache.stats().computations == 2
    chat.invoke(QUESTION, document=text, mode="query_aware")
    assert kinds(engine) == {"leaf_tier", "root"} and engine.document_cache.stats().computations == 3
    again = chat.invoke("Where is Netherfield?", document=text, mode="query_aware")
    assert served(again) == "query_aware" and again.response_metadata["homer"]["cache_source"] == "memory"
    assert again.response_metadata["homer"]["document_seconds"] == 0, "the leaf tier is reused"


def test_the_model_field_is_the_default_and_a_call_still_wins(engine, text):
    chat = ChatHomer(engine=engine, max_tokens=2, mode="query_aware")
    assert chat._identifying_params["mode"] == "query_aware"
    assert served(chat.invoke(QUESTION, document=text)) == "query_aware"
    assert served(chat.invoke(QUESTION, document=text, mode="shared")) == "shared"
    assert served(chat.invoke(QUESTION, document=text, mode=None)) == "query_aware", "None: the model's mode"
    plain = chat.invoke("Hello")
    assert served(plain) is None and plain.response_metadata["homer"]["cache_source"] is None


def test_streaming_and_async_paths_carry_the_mode(engine, text):
    chat = ChatHomer(engine=engine, max_tokens=2)
    chunks = list(chat.stream([HumanMessage(QUESTION)], document=text, mode="query_aware"))
    last = chunks[-1]
    assert isinstance(last, AIMessageChunk) and served(last) == "query_aware"

    async def run() -> tuple[AIMessage, AIMessageChunk]:
        message = await chat.ainvoke(QUESTION, document=text, mode="full")
        streamed = [c async for c in chat.astream(QUESTION, document=text, mode="full")]
        return message, streamed[-1]

    import asyncio

    message, tail = asyncio.run(run())
    assert served(message) == served(tail) == "full"
    assert kinds(engine) == {"leaf_tier", "root"}


def test_the_text_llm_takes_the_mode_per_model_and_per_call(engine, text):
    llm = HomerLLM(engine=engine, max_tokens=2, mode="full")
    result = llm.generate([QUESTION], document=text)
    assert result.generations[0][0].generation_info["homer"]["mode"] == "full"
    result = llm.generate([QUESTION, "Where is Netherfield?"], document=text, mode="query_aware")
    assert [g[0].generation_info["homer"]["mode"] for g in result.generations] == ["query_aware"] * 2
    chunks = list(llm.bind(mode="shared").stream(QUESTION, document=text))
    assert chunks[-1] == ""
    assert kinds(engine) == {"root", "leaf_tier"} and engine.document_cache.stats().computations == 3


def test_an_invalid_mode_is_refused_clearly(engine):
    with pytest.raises(ValueError, match=r"unknown HOMER mode 'sideways'.*'shared', 'query_aware', 'full'"):
        ChatHomer(engine=engine).invoke(QUESTION, document="Some text.", mode="sideways")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        list(HomerLLM(engine=engine).stream(QUESTION, mode="fast"))
    with pytest.raises(ValidationError, match="mode"):
        ChatHomer(engine=engine, mode="sideways")
    with pytest.raises(ValidationError, match="mode"):
        HomerLLM(engine=engine, mode="fast")
    assert engine.document_cache.stats().computations == 0


def test_the_router_passes_the_mode_to_its_homer_calls(engine, text):
    chat = ChatHomer(engine=engine, max_tokens=2)
    router = HomerRouter(chat, text, strategy=lambda question: "homer", mode="full")
    assert served(router.invoke(QUESTION)) == "full"
    message = router.invoke(QUESTION, mode="query_aware")
    assert served(message) == "query_aware" and message.response_metadata["route"] == "homer"
    assert served(router.bind(mode="shared").invoke(QUESTION)) == "shared"
    assert kinds(engine) == {"root", "leaf_tier"}
    # the retrieval route's excerpts make a prompt short enough to run plainly: no mode served it
    plain_chat = ChatHomer(engine=engine, max_tokens=2, long_prompt_tokens=1000)
    retrieval = HomerRouter(plain_chat, text, strategy=lambda question: "retrieval")
    message = retrieval.invoke(QUESTION, mode="query_aware")
    assert message.response_metadata["route"] == "retrieval" and served(message) is None
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        router.invoke(QUESTION, mode="sideways")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        HomerRouter(engine, text, mode="sideways")
