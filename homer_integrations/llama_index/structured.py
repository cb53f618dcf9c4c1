"""Structured output for ``HomerLLM``: a pydantic program whose answer is decoded under the output class's
JSON schema (``homer_integrations.homer.decoding.constraints``), so it validates even from a small model.

The model comes in as an argument typed by LlamaIndex's ``LLM`` (only ``chat`` and ``stream_chat`` are
called), so this module does not import ``llm``, whose ``HomerLLM`` mixes ``StructuredOutput`` in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any, Generic, TypeVar

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import LLMStructuredPredictEndEvent, LLMStructuredPredictStartEvent
from llama_index.core.llms.llm import LLM
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import BasePydanticProgram
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.homer.decoding.constraints import ResponseFormat

Model = TypeVar("Model", bound=BaseModel)
dispatcher = get_dispatcher(__name__)


def with_note(messages: list[ChatMessage], note: str) -> list[ChatMessage]:
    """``note`` appended to the last message on its own line (no blank line: a document found by its
    paragraph breaks keeps the question and the note after it, outside the compressed cache)."""
    if not note or not messages:
        return messages
    last = messages[-1]
    return [*messages[:-1], ChatMessage(role=last.role, content=f"{(last.content or '').rstrip()}\n{note}")]


class HomerProgram(BasePydanticProgram[Model], Generic[Model]):
    """Formats ``prompt``, answers it through ``llm`` (a ``HomerLLM``) with the answer constrained to
    ``output_cls``'s schema, and returns the validated object. A whole document in the prompt (or
    ``document=`` in ``llm_kwargs``) is compressed once, as for any ``HomerLLM`` call."""

    def __init__(self, llm: LLM, output_cls: type[Model], prompt: BasePromptTemplate) -> None:
        self._llm = llm
        self._output_cls = output_cls
        self._prompt = prompt
        self._format = ResponseFormat.json_schema(output_cls)

    @property
    def output_cls(self) -> type[Model]:
        return self._output_cls

    def _messages(self, prompt_args: dict[str, Any]) -> list[ChatMessage]:
        messages = self._prompt.format_messages(llm=self._llm, **prompt_args)
        return with_note(list(messages), self._format.instructions())

    def _kwargs(self, llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        return {**(llm_kwargs or {}), "response_format": self._format}

    def __call__(self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        response = self._llm.chat(self._messages(prompt_args), **self._kwargs(llm_kwargs))
        return self._output_cls.model_validate_json(response.message.content or "")

    async def acall(self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        return await asyncio.to_thread(self.__call__, llm_kwargs=llm_kwargs, **prompt_args)

    def stream_call(
        self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Generator[Model, None, None]:
        """Objects as the answer grows: each partial answer that already validates, then the whole one."""
        text, last = "", None
        for response in self._llm.stream_chat(self._messages(prompt_args), **self._kwargs(llm_kwargs)):
            text = response.message.content or ""
            partial = self._partial(text)
            if partial is not None and partial != last:
                last = partial
                yield partial
        final = self._output_cls.model_validate_json(text)
        if final != last:
            yield final

    async def astream_call(
        self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> AsyncGenerator[Model, None]:
        async def gen() -> AsyncGenerator[Model, None]:
            async for item in iterate_in_thread(lambda: self.stream_call(llm_kwargs=llm_kwargs, **prompt_args)):
                yield item

        return gen()

    def _partial(self, text: str) -> Model | None:
        try:
            return self._output_cls.model_validate(from_json(text, allow_partial=True))
        except (ValueError, ValidationError):
            return None


class StructuredOutput:
    """``HomerLLM``'s structured output: every structured path (``structured_predict``,
    ``as_structured_llm``, the streaming and async forms) runs a ``HomerProgram``, so the answer is
    decoded under ``output_cls``'s JSON schema and validated, never re-prompted."""

    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """A validated ``output_cls`` answering ``prompt`` (``llm_kwargs``: generation options, ``document=``)."""
        dispatcher.event(
            LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt, template_args=prompt_args)
        )
        result = HomerProgram(self, output_cls, prompt)(llm_kwargs=llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        return await asyncio.to_thread(self.structured_predict, output_cls, prompt, llm_kwargs, **prompt_args)

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Model, None, None]:
        return HomerProgram(self, output_cls, prompt).stream_call(llm_kwargs=llm_kwargs, **prompt_args)

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Model, None]:
        return await HomerProgram(self, output_cls, prompt).astream_call(llm_kwargs=llm_kwargs, **prompt_args)
