"""LlamaIndex responses from an engine's ``AnswerStream``: whole or streamed, completion or chat.

Every response that ends an answer carries its statistics (mode, cache source, tokens, compression) in
``additional_kwargs``. Shared by ``HomerLLM``'s calls, at module level as LlamaIndex's own LLMs keep theirs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole

from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.engine.model import AnswerStream

R = TypeVar("R")


def completion_response(stream: AnswerStream) -> CompletionResponse:
    """The whole answer of ``stream``, decoded now."""
    text = stream.text()
    return CompletionResponse(text=text, additional_kwargs=stream.info.as_dict())


def chat_response(stream: AnswerStream) -> ChatResponse:
    """The whole answer of ``stream``, decoded now, as the assistant's message."""
    text = stream.text()
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
        additional_kwargs=stream.info.as_dict(),
    )


def completion_stream(stream: AnswerStream) -> Iterator[CompletionResponse]:
    """One response per piece of ``stream``, each with the text so far."""
    text = ""
    for piece in stream:
        text += piece
        yield CompletionResponse(text=text, delta=piece)
    # a last empty delta carries the statistics, complete only once decoding ended
    yield CompletionResponse(text=text, delta="", additional_kwargs=stream.info.as_dict())


def chat_stream(completions: Iterator[CompletionResponse]) -> Iterator[ChatResponse]:
    """``completion_stream``'s responses as the assistant's chat messages."""
    for c in completions:
        yield ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=c.text),
            delta=c.delta,
            additional_kwargs=c.additional_kwargs,
        )


async def in_thread(make: Callable[[], Iterator[R]]) -> AsyncIterator[R]:
    """The responses of ``make()``, produced in a worker thread so the event loop keeps running."""
    async for response in iterate_in_thread(make):
        yield response
