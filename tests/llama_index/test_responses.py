"""``llama_index.responses``: LlamaIndex responses from an answer stream (a stand-in stream, no model needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from llama_index.core.base.llms.types import MessageRole

from homer_integrations.llama_index.responses import (
    chat_response,
    chat_stream,
    completion_response,
    completion_stream,
    in_thread,
)


class Info:
    def as_dict(self) -> dict[str, Any]:
        return {"output_tokens": 2}


class Stream:
    """What the helpers read of an ``AnswerStream``: its pieces, ``text()`` and ``info``."""

    def __init__(self, *pieces: str) -> None:
        self.pieces = pieces
        self.info = Info()

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def text(self) -> str:
        return "".join(self.pieces)


def test_whole_responses_carry_the_text_and_the_statistics():
    completion = completion_response(Stream("Par", "is"))  # type: ignore[arg-type]
    assert completion.text == "Paris" and completion.additional_kwargs == {"output_tokens": 2}
    chat = chat_response(Stream("Par", "is"))  # type: ignore[arg-type]
    assert chat.message.role == MessageRole.ASSISTANT and chat.message.content == "Paris"
    assert chat.additional_kwargs == {"output_tokens": 2}


def test_streams_grow_the_text_and_end_with_an_empty_delta_carrying_the_statistics():
    completions = list(completion_stream(Stream("Par", "is")))  # type: ignore[arg-type]
    assert [(c.text, c.delta) for c in completions] == [("Par", "Par"), ("Paris", "is"), ("Paris", "")]
    assert [c.additional_kwargs for c in completions] == [{}, {}, {"output_tokens": 2}]
    chats = list(chat_stream(completion_stream(Stream("Par", "is"))))  # type: ignore[arg-type]
    assert [(c.message.content, c.delta) for c in chats] == [("Par", "Par"), ("Paris", "is"), ("Paris", "")]
    assert chats[-1].additional_kwargs == {"output_tokens": 2}


def test_in_thread_yields_what_the_iterator_yields():
    async def collect() -> list[str]:
        return [r async for r in in_thread(lambda: iter(["a", "b"]))]

    assert asyncio.run(collect()) == ["a", "b"]
