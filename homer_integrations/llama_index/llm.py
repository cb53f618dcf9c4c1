"""``HomerLLM``: a LlamaIndex LLM over a ``HomerModel`` that compresses long documents in its prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.llm import default_completion_to_prompt

from homer_integrations.engine import AnswerStream, HomerModel
from homer_integrations.llama_index.aio import iterate_in_thread
from homer_integrations.llama_index.info import answer_info_dict

_GENERATION_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")


class HomerLLM(CustomLLM):
    """A local Hugging Face model behind HOMER, usable wherever LlamaIndex accepts an LLM.

    Build it over an engine (``HomerLLM(engine=HomerModel...)``), from a local path or hub id
    (``HomerLLM(model="...")``), or with neither for the embedded default model.

    How a long document reaches the model:

    - ``complete(question, document=text)`` answers ``question`` about ``text``, and
      ``chat(messages, document=text)`` puts ``text`` at the start of the first user message.
      Either way the document is compressed once into a short cache (reused by every later
      call, and by ``HomerQueryEngine`` over the same engine).
    - Without ``document=``, a prompt longer than ``compress_threshold`` tokens is searched for
      one long document span (a synthesizer's ``{context_str}``); that span is compressed and
      the rest of the prompt is fed after the cache. Other prompts run as plain prompts.

    ``metadata.context_window`` is the model's own window by default: what a plain prompt may
    hold. A compressed document may be far longer (only its cache, at most
    ``max_chunk_len`` tokens, takes room in the window). Raise ``context_window`` if you want
    LlamaIndex's synthesizers to stuff whole long documents into one prompt.
    """

    model_name: str = Field(default="", description="Name reported in metadata and events.")
    context_window: int = Field(
        default=0, ge=0, description="Tokens a plain prompt may hold; 0 means the model's own window."
    )
    num_output: int = Field(default=256, ge=1, description="Default maximum new tokens per answer.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 decodes greedily.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, description="Makes sampling repeatable.")
    stop: list[str] = Field(default_factory=list, description="Stop strings, cut from the answer.")
    compress_threshold: int = Field(
        default=0,
        ge=0,
        description="Prompts longer than this many tokens are searched for a document to compress; "
        "0 means the engine's max_chunk_len.",
    )

    _engine: HomerModel = PrivateAttr()

    def __init__(self, engine: HomerModel | None = None, model: str | None = None, **kwargs: Any) -> None:
        if engine is not None and model is not None:
            raise ValueError("pass either engine= or model=, not both")
        engine = engine if engine is not None else HomerModel.from_pretrained(model)
        kwargs.setdefault("model_name", engine.model_name)
        super().__init__(**kwargs)
        if not self.context_window:
            self.context_window = engine.context_window
        if not self.compress_threshold:
            self.compress_threshold = int(engine.config.max_chunk_len or engine.context_window)
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "HomerLLM"

    @property
    def engine(self) -> HomerModel:
        """The shared ``HomerModel`` (model, tokenizer, document cache)."""
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window,
            num_output=self.num_output,
            is_chat_model=True,
            model_name=self.model_name,
        )

    # ----------------------------------------------------------------------------- core
    def generation_kwargs(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Engine generation options: this LLM's settings, overridden per call (``max_tokens`` too)."""
        options: dict[str, Any] = {
            "max_new_tokens": self.num_output,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": tuple(self.stop),
        }
        overrides = dict(overrides or {})
        if "max_tokens" in overrides and "max_new_tokens" not in overrides:
            overrides["max_new_tokens"] = overrides.pop("max_tokens")
        for key in _GENERATION_KEYS:
            if overrides.get(key) is not None:
                options[key] = overrides[key]
        options["stop"] = tuple(options["stop"])
        return options

    def _completion_text(self, prompt: str, formatted: bool) -> str:
        if formatted:
            return prompt
        if self.completion_to_prompt is not default_completion_to_prompt:
            return self.completion_to_prompt(prompt)
        return self._engine.chat_prompt(self._message_dicts([ChatMessage(role=MessageRole.USER, content=prompt)]))

    def _message_dicts(self, messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        dicts = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        if self.system_prompt and not any(d["role"] == "system" for d in dicts):
            dicts.insert(0, {"role": "system", "content": self.system_prompt})
        return dicts

    def _start(self, prompt_text: str, options: dict[str, Any]) -> AnswerStream:
        """Start answering an already rendered prompt: compress a long document in it, or run it plainly."""
        return self._engine.generate(prompt_text, **options)

    def _start_completion(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> AnswerStream:
        options = self.generation_kwargs(kwargs)
        document = kwargs.get("document")
        if document is not None:
            return self._engine.run(document, prompt, **options)
        return self._start(self._completion_text(prompt, formatted), options)

    def _start_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> AnswerStream:
        options = self.generation_kwargs(kwargs)
        return self._start(self._engine.chat_prompt(self._message_dicts(messages)), options)

    @staticmethod
    def _completion_stream(stream: AnswerStream) -> Iterator[CompletionResponse]:
        text = ""
        for piece in stream:
            text += piece
            yield CompletionResponse(text=text, delta=piece)
        # a last empty delta carries the statistics, complete only once decoding ended
        yield CompletionResponse(text=text, delta="", additional_kwargs=answer_info_dict(stream.info))

    @staticmethod
    def _chat_stream(completions: Iterator[CompletionResponse]) -> Iterator[ChatResponse]:
        for c in completions:
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=c.text),
                delta=c.delta,
                additional_kwargs=c.additional_kwargs,
            )

    def _complete_now(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        stream = self._start_completion(prompt, formatted, kwargs)
        text = stream.text()
        return CompletionResponse(text=text, additional_kwargs=answer_info_dict(stream.info))

    def _chat_now(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponse:
        stream = self._start_chat(messages, kwargs)
        text = stream.text()
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
            additional_kwargs=answer_info_dict(stream.info),
        )

    # ----------------------------------------------------------------------------- LlamaIndex API
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt``; ``document=`` names a long document it is about. ``additional_kwargs``
        holds the statistics (cache source, tokens, compression)."""
        return self._complete_now(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream the answer; the last response (empty delta) carries the statistics."""
        return self._completion_stream(self._start_completion(prompt, formatted, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat_now(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chat_stream(self._completion_stream(self._start_chat(messages, kwargs)))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self._complete_now, prompt, formatted, kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        async def gen() -> CompletionResponseAsyncGen:
            make = lambda: self._completion_stream(self._start_completion(prompt, formatted, kwargs))  # noqa: E731
            async for response in iterate_in_thread(make):
                yield response

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat_now, messages, kwargs)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        async def gen() -> ChatResponseAsyncGen:
            make = lambda: self._chat_stream(self._completion_stream(self._start_chat(messages, kwargs)))  # noqa: E731
            async for response in iterate_in_thread(make):
                yield response

        return gen()
