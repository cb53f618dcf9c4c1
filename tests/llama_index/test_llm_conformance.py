"""``HomerLLM`` against LlamaIndex's LLM interface, on the embedded SmolLM2 model (greedy, short answers)."""

from __future__ import annotations

import asyncio
import time

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import PromptTemplate

pytestmark = pytest.mark.real_model

PROMPT = "Name the capital of France in one word."
MESSAGES = [
    ChatMessage(role=MessageRole.SYSTEM, content="You answer in one short sentence."),
    ChatMessage(role=MessageRole.USER, content="What colour is the sky on a clear day?"),
]


def test_metadata_is_honest(homer_llm, smol_engine):
    meta = homer_llm.metadata
    assert meta.context_window == smol_engine.context_window == 8192
    assert meta.num_output == 12
    assert meta.is_chat_model is True
    assert meta.model_name == smol_engine.model_name
    assert homer_llm.compress_threshold == smol_engine.config.max_chunk_len


def test_complete_and_stream_complete_agree(homer_llm):
    response = homer_llm.complete(PROMPT)
    assert response.text.strip()
    assert response.additional_kwargs["cache_source"] is None  # a plain prompt, nothing compressed
    assert 0 < response.additional_kwargs["output_tokens"] <= 12

    chunks = list(homer_llm.stream_complete(PROMPT))
    assert "".join(c.delta for c in chunks) == response.text == chunks[-1].text
    assert chunks[-1].additional_kwargs["output_tokens"] == response.additional_kwargs["output_tokens"]
    assert all(not c.additional_kwargs for c in chunks[:-1])


def test_per_call_generation_options(homer_llm):
    short = homer_llm.complete(PROMPT, max_tokens=2)
    assert short.additional_kwargs["output_tokens"] <= 2
    assert short.additional_kwargs["finish_reason"] in {"length", "eos"}


def test_chat_and_stream_chat_agree(homer_llm):
    response = homer_llm.chat(MESSAGES)
    assert response.message.role == MessageRole.ASSISTANT
    assert response.message.content.strip()
    chunks = list(homer_llm.stream_chat(MESSAGES))
    assert "".join(c.delta for c in chunks) == response.message.content == chunks[-1].message.content


async def test_async_forms_match_sync(homer_llm):
    sync_text = homer_llm.complete(PROMPT).text
    assert (await homer_llm.acomplete(PROMPT)).text == sync_text
    pieces = [c.delta async for c in await homer_llm.astream_complete(PROMPT)]
    assert "".join(pieces) == sync_text

    sync_chat = homer_llm.chat(MESSAGES).message.content
    assert (await homer_llm.achat(MESSAGES)).message.content == sync_chat
    chat_pieces = [c.delta async for c in await homer_llm.astream_chat(MESSAGES)]
    assert "".join(chat_pieces) == sync_chat


async def test_async_does_not_block_the_event_loop(homer_llm):
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    await homer_llm.acomplete(PROMPT, max_tokens=8)
    elapsed = time.perf_counter() - started
    task.cancel()
    # the loop kept ticking while the model worked in a thread
    assert elapsed > 0.1
    assert len([t for t in ticks if t >= started]) >= 5


def test_completion_events_fire(homer_llm, events):
    homer_llm.complete(PROMPT, max_tokens=3)
    names = events.names()
    assert names.count("LLMCompletionStartEvent") == 1
    assert names.count("LLMCompletionEndEvent") == 1
    end = next(e for e in events.events if type(e).__name__ == "LLMCompletionEndEvent")
    assert end.response.text.strip()


def test_streaming_and_chat_events_fire(homer_llm, events):
    list(homer_llm.stream_complete(PROMPT, max_tokens=3))
    list(homer_llm.stream_chat(MESSAGES, max_tokens=3))
    names = events.names()
    assert "LLMCompletionInProgressEvent" in names
    assert names.count("LLMChatStartEvent") == 1
    assert names.count("LLMChatEndEvent") == 1
    assert "LLMChatInProgressEvent" in names


async def test_async_events_fire(homer_llm, events):
    await homer_llm.acomplete(PROMPT, max_tokens=3)
    await homer_llm.achat(MESSAGES, max_tokens=3)
    names = events.names()
    assert names.count("LLMCompletionEndEvent") == 1
    assert names.count("LLMChatEndEvent") == 1


def test_predict_with_a_prompt_template(homer_llm, events):
    """LlamaIndex's own prompt path (``predict``) goes through our chat with no global Settings."""
    out = homer_llm.predict(PromptTemplate("Say the word {word} and nothing else."), word="hello")
    assert out.strip()
    assert "LLMPredictEndEvent" in events.names()
    assert "LLMChatEndEvent" in events.names()


def test_plain_prompt_over_the_window_is_refused_clearly(homer_llm):
    with pytest.raises(ValueError, match="window"):
        homer_llm.complete("word " * 9000, formatted=True)
