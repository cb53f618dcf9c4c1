"""``ChatHomer`` and ``HomerLLM`` in real chains over one long document: one compression each.

Every test counts compressions on a fresh engine with ``engine.document_cache.stats().computations``.
The chain tests are plumbing (one compression, later calls read the cache, usage metadata, the event
loop keeps running), so they run on ``tiny_engine`` (a tiny random-weight Llama with the real SmolLM2
tokenizer, ``max_chunk_len`` 128); the document is about 2,000 tokens of the novel, a 16-leaf tree.
Its answers are arbitrary tokens, so they are checked by count (``max_tokens`` of them, finish reason
``length``), never by wording. Tests whose answers must make sense run on SmolLM2 (``fresh_engine``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

from homer_integrations.langchain import ChatHomer, HomerLLM

QUESTIONS = [
    "Who is Mr. Bingley?",
    "Where does the Bennet family live?",
    "How many daughters do the Bennets have?",
    "Who visits Mr. Bingley first?",
    "What does Mrs. Bennet want?",
]
QA = ChatPromptTemplate.from_messages(
    [("human", "Answer the question using the text below.\n\n{context}\n\nQuestion: {question}\nAnswer briefly.")]
)


@pytest.fixture(scope="module")
def book(novel_excerpt) -> str:
    return novel_excerpt(2000, skip=3000)


def computations(engine) -> int:
    return engine.document_cache.stats().computations


def cache_details(message: AIMessage) -> dict[str, int]:
    return message.usage_metadata["input_token_details"]


def most_of(engine, document: str) -> int:
    """Cache token counts below this mean the document was not (all) in the cache: 95% of its tokens."""
    return int(0.95 * engine.prompting.count_tokens(document))


def full_answer(message: AIMessage, max_tokens: int) -> bool:
    """The (random) model answered with exactly ``max_tokens`` tokens, none of them stripped away."""
    return (
        bool(message.text.strip())
        and message.usage_metadata["output_tokens"] == max_tokens
        and message.response_metadata["finish_reason"] == "length"
    )


class Recorder(BaseCallbackHandler):
    """Keeps streamed tokens and finished LLM results."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.results: list[LLMResult] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.results.append(response)


def test_lcel_chain_compresses_once_for_five_questions_and_later_paths_reuse_it(tiny_engine, book):
    chat = ChatHomer(engine=tiny_engine, max_tokens=8)
    chain = QA | chat
    most = most_of(tiny_engine, book)
    answers = [chain.invoke({"context": book, "question": q}) for q in QUESTIONS]
    assert computations(tiny_engine) == 1
    first, *rest = answers
    assert cache_details(first)["cache_creation"] > most and cache_details(first)["cache_read"] == 0
    assert first.response_metadata["homer"]["document_found_by"] == "heuristic"
    assert first.response_metadata["homer"]["cache_source"] == "computed"
    homer, chunk = first.response_metadata["homer"], tiny_engine.config.max_chunk_len
    assert homer["document_tokens"] > 8 * chunk >= 8 * homer["cache_tokens"]  # a tree of many leaves, pruned
    for a in rest:
        assert cache_details(a)["cache_creation"] == 0 and cache_details(a)["cache_read"] > most
        assert a.response_metadata["homer"]["cache_source"] == "memory"
        assert a.response_metadata["homer"]["document_found_by"] == "known"
        assert a.usage_metadata["input_tokens"] >= cache_details(a)["cache_read"] + 5
        assert full_answer(a, 8) and a.response_metadata["model_name"] == tiny_engine.model_name

    # the explicit path finds the same cache: same template head, same document text
    bound = chat.bind(document=book).invoke("Who is Mr. Bingley?")
    assert bound.response_metadata["homer"]["document_found_by"] == "explicit"
    assert cache_details(bound)["cache_read"] > most

    # conversation history after the document is fed after the cache
    history = [*QA.format_messages(context=book, question=QUESTIONS[0]), first, HumanMessage("And his sisters?")]
    later = chat.invoke(history)
    assert later.response_metadata["homer"]["document_found_by"] == "known"
    assert cache_details(later)["cache_read"] > most
    assert later.usage_metadata["input_tokens"] > bound.usage_metadata["input_tokens"]

    recorder = Recorder()
    chunks = list(chat.stream("Who is Mr. Bingley?", {"callbacks": [recorder]}, document=book))
    text = "".join(c.text for c in chunks)
    assert text.strip() and "".join(recorder.tokens) == text
    assert len(chunks) > 2  # streamed piece by piece, then the usage chunk
    assert chunks[-1].usage_metadata["input_token_details"]["cache_read"] > most
    assert chunks[-1].usage_metadata["output_tokens"] == 8
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    # a stop string ends the same (greedy) answer just before its first occurrence
    lead = text.strip()[0]
    stop = next(ch for ch in text.strip() if ch != lead and not ch.isspace())
    stopped = "".join(c.text for c in chat.stream("Who is Mr. Bingley?", document=book, stop=[stop]))
    assert stopped == text[: text.index(stop)] and stopped.strip()
    assert computations(tiny_engine) == 1


def test_stuff_documents_chain_with_the_text_llm_compresses_once(tiny_engine, book):
    paragraphs = book.split("\n\n")
    half = len(paragraphs) // 2
    docs = [Document(page_content="\n\n".join(part)) for part in (paragraphs[:half], paragraphs[half:])]
    prompt = PromptTemplate.from_template(
        "Answer the question from the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:"
    )
    chain = create_stuff_documents_chain(HomerLLM(engine=tiny_engine, max_tokens=8), prompt)
    recorder = Recorder()
    answers = [chain.invoke({"context": docs, "question": q}, {"callbacks": [recorder]}) for q in QUESTIONS]
    assert computations(tiny_engine) == 1
    assert all(isinstance(a, str) and a.strip() for a in answers)
    infos = [r.generations[0][0].generation_info for r in recorder.results]
    assert len(infos) == len(QUESTIONS)
    assert all(i["usage"]["output_tokens"] == 8 and i["finish_reason"] == "length" for i in infos)
    usages = [i["usage"]["input_token_details"] for i in infos]
    most = most_of(tiny_engine, book)
    assert usages[0]["cache_creation"] > most
    assert all(u["cache_read"] > most and u["cache_creation"] == 0 for u in usages[1:])
    assert [i["homer"]["cache_source"] for i in infos] == ["computed"] + ["memory"] * 4
    assert recorder.results[-1].llm_output["model_name"] == tiny_engine.model_name


async def test_abatch_on_one_document_compresses_once_without_blocking_the_loop(tiny_engine, book):
    # 64 tokens per answer: a window of a second or more (the tiny model compresses in a fraction of one),
    # so one stall of a busy machine does not decide the tick rate
    chain = QA | ChatHomer(engine=tiny_engine, max_tokens=64)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    beat = asyncio.create_task(ticker())
    started = time.perf_counter()
    answers = await chain.abatch([{"context": book, "question": q} for q in QUESTIONS])
    elapsed = time.perf_counter() - started
    beat.cancel()
    assert computations(tiny_engine) == 1
    assert sorted(a.response_metadata["homer"]["cache_source"] for a in answers) == ["computed"] + ["memory"] * 4
    assert all(full_answer(a, 64) for a in answers)
    assert ticks >= 0.5 * elapsed / 0.05  # the event loop kept running while the model worked

    streamed = [c async for c in chain.astream({"context": book, "question": QUESTIONS[0]})]
    assert streamed[-1].usage_metadata["input_token_details"]["cache_read"] > most_of(tiny_engine, book)
    assert computations(tiny_engine) == 1


async def test_text_llm_async_stream_fires_token_callbacks(fresh_engine):
    llm = HomerLLM(engine=fresh_engine, max_tokens=12)
    recorder = Recorder()
    pieces = [p async for p in llm.astream("Name three colours.", {"callbacks": [recorder]})]
    assert "".join(pieces).strip() and "".join(recorder.tokens) == "".join(pieces)
    assert recorder.results[0].generations[0][0].generation_info["homer"]["document_found_by"] == "plain"
    assert await llm.ainvoke("Say hello.", stop=["hello", "Hello"]) == ""
    assert llm.get_token_ids("Hello world") == fresh_engine.prompting.token_ids("Hello world")
    assert computations(fresh_engine) == 0


def test_unknown_call_options_are_refused(fresh_engine):
    with pytest.raises(TypeError, match="unsupported call options"):
        ChatHomer(engine=fresh_engine).invoke("Hi", documnet="typo")


def test_text_model_serializes_its_settings_not_its_engine(fresh_engine):
    from langchain_core.load import dumpd, load

    llm = HomerLLM(engine=fresh_engine, temperature=0.5, max_tokens=7, stop=["\n"], mode="shared")
    data = dumpd(llm)
    assert data["id"] == ["homer_integrations", "langchain", "HomerLLM"] and "engine" not in data["kwargs"]
    loaded = load(data, valid_namespaces=["homer_integrations"], allowed_objects=[HomerLLM])
    assert (loaded.model_name, loaded.temperature, loaded.max_tokens, loaded.stop, loaded.mode) == (
        fresh_engine.model_name,
        0.5,
        7,
        ["\n"],
        "shared",
    )
    assert loaded.engine is None  # resolved by name on first use
