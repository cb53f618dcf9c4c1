"""``HomerLLM``: a LlamaIndex LLM over a ``HomerModel`` that compresses long documents in its prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
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
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from homer_integrations.engine.model import AnswerStream, HomerModel
from homer_integrations.engine.pool import shared_engine
from homer_integrations.engine.prompt_split import (
    PromptSplit,
    Renderer,
    long_prompt_default,
    remember_document,
    split_prompt,
    start_answer,
)
from homer_integrations.engine.prompting import check_text
from homer_integrations.homer.config import Mode
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.kv.compressed import CompressionStats
from homer_integrations.llama_index.messages import chat_messages, completion_messages
from homer_integrations.llama_index.messages import message_text as message_text  # importable here, as before
from homer_integrations.llama_index.responses import (
    chat_response,
    chat_stream,
    completion_response,
    completion_stream,
    in_thread,
)
from homer_integrations.llama_index.structured import StructuredOutput


class HomerLLM(StructuredOutput, CustomLLM):
    """A local Hugging Face model behind HOMER, usable wherever LlamaIndex accepts an LLM.

    Build it over an engine (``HomerLLM(engine=...)``), from a local path, hub id or embedded
    name (``HomerLLM(model=...)``, one shared engine per name), or with neither for the
    embedded default model.

    How a long document reaches the model (``homer_integrations.engine.prompt_split`` decides):

    - explicitly: ``complete(question, document=text)`` answers ``question`` about ``text``;
      ``chat(messages, document=text)`` puts ``text`` at the start of the first user message
      (or cuts it out where a message already holds it);
    - a prompt holding the exact text of a document this engine compressed recently (e.g. by
      ``HomerQueryEngine``) reuses that document's cache;
    - a prompt longer than ``compress_threshold`` tokens: in its longest message, the text
      between the first and the last paragraph break is taken as the document (a synthesizer's
      ``{context_str}``), the rest as instructions and question.

    The document is compressed once (cached in the engine's document cache) and everything
    else of the prompt is fed after the cache; other prompts run plainly. ``mode`` picks how: ``auto`` (the engine's
    default: ``full`` for a document that fits the window, else ``query_aware``), ``query_aware`` (the question is
    compressed with the document, replayed from a cached leaf tier), ``shared`` (one compressed cache for every
    question) or ``full`` (uncompressed, must fit the window); None follows the engine's configuration, and a call's
    ``mode=`` (``complete(prompt, mode="query_aware")``, ``chat``, the streaming and async forms) replaces it.

    ``metadata.context_window`` is the model's own window by default: what a *plain* prompt
    may hold. A compressed document may be far longer (only its cache, at most the engine's
    ``max_chunk_len`` tokens, takes room in the window). Set a larger ``context_window`` to let
    LlamaIndex's synthesizers stuff a whole long document into one prompt; a prompt over the
    model's window in which no document is found is then refused with a clear error.
    Responses carry the statistics (mode, cache source, tokens, compression) in ``additional_kwargs``.
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
        "0 means prompt_split.long_prompt_default (1,024 tokens or the engine's max_chunk_len, the smaller).",
    )
    mode: Mode | None = Field(
        default=None,
        description="HOMER mode of a document's answers: query_aware, shared or full; None means the "
        "engine's configured mode (auto unless its HomerConfig says otherwise). A call's mode= replaces it.",
    )

    _engine: HomerModel = PrivateAttr()

    def __init__(
        self, engine: HomerModel | None = None, model: str | None = None, store: str | None = None, **kwargs: Any
    ) -> None:
        """``store``: where compressed documents live, shared by every process with the same model and
        settings (a directory or a URL fsspec knows, e.g. ``s3://bucket/prefix``); None: the engine's cache."""
        if engine is not None and model is not None:
            raise ValueError("pass either engine= or model=, not both")
        engine = engine if engine is not None else shared_engine(model, store)
        if store is not None and engine.document_cache.location != store:
            engine = engine.with_store(store)
        kwargs.setdefault("model_name", engine.model_name)
        super().__init__(**kwargs)
        if not self.context_window:
            self.context_window = engine.context_window
        if not self.compress_threshold:
            self.compress_threshold = long_prompt_default(engine)
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
    def generation_options(self, overrides: dict[str, Any] | None = None) -> GenerationOptions:
        """Engine generation options: this LLM's settings, overridden per call (``max_tokens`` too)."""
        settings = {"max_new_tokens": self.num_output, "stop": self.stop}
        settings |= {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        return GenerationOptions.merged(settings, overrides or {})

    def _completion_split(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> PromptSplit:
        """Where the document is in a completion prompt (rendered with the chat template unless
        ``formatted`` or a custom ``completion_to_prompt`` says how)."""
        check_text(prompt, "prompt")
        messages, render = completion_messages(
            prompt, self.system_prompt, formatted=formatted, completion_to_prompt=self.completion_to_prompt
        )
        return self._split(messages, render, kwargs)

    def _chat_split(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> PromptSplit:
        return self._split(chat_messages(messages, self.system_prompt), None, kwargs)

    def call_mode(self, kwargs: dict[str, Any] | None = None) -> Mode:
        """The HOMER mode of a call: its ``mode`` (checked), else this LLM's, else the engine's default."""
        return self._engine.mode_for((kwargs or {}).get("mode"), self.mode)

    def _split(self, messages: list[dict[str, str]], render: Renderer | None, kwargs: dict[str, Any]) -> PromptSplit:
        return split_prompt(
            self._engine,
            messages,
            document=kwargs.get("document"),
            render=render,
            long_prompt_tokens=self.compress_threshold,
            mode=self.call_mode(kwargs),
        )

    def _start(self, split: PromptSplit, kwargs: dict[str, Any]) -> AnswerStream:
        return start_answer(self._engine, split, self.generation_options(kwargs))

    def _start_completion(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> AnswerStream:
        return self._start(self._completion_split(prompt, formatted, kwargs), kwargs)

    def _start_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> AnswerStream:
        return self._start(self._chat_split(messages, kwargs), kwargs)

    def answer_stream(self, question: str, document: str, **kwargs: Any) -> AnswerStream:
        """The engine's stream answering ``question`` about ``document`` (no LlamaIndex events);
        its ``info`` holds the statistics once consumed. ``HomerQueryEngine`` answers through this.
        ``kwargs``: generation options and ``mode``."""
        return self._start_completion(question, False, {**kwargs, "document": document})

    def precompress(self, document: str, *, mode: Mode | None = None) -> CompressionStats | None:
        """Prepare ``document`` now (cached) exactly as ``answer_stream`` will need it in ``mode`` (default:
        this LLM's, else the engine's; ``auto`` decided for ``document``). ``query_aware`` builds the document's
        leaf tier, which every question replays from, and returns None: each question's own selection is made
        when it is asked. ``shared`` and ``full`` compress it and return its ``CompressionStats``."""
        mode = self._engine.mode_for(self.call_mode({"mode": mode}), document=document)
        # nothing of a question reaches the cached entry (the tier reads the prefix and the document only):
        # lay out the document alone
        split = self._completion_split("", False, {"document": document, "mode": mode})
        prepared = self._engine.cache_document(document, mode, prefix=split.prefix, suffix=split.suffix)
        remember_document(self._engine, document)
        return prepared.stats

    # ----------------------------------------------------------------------------- LlamaIndex API
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt``; ``document=`` names a long document it is about. ``additional_kwargs``
        holds the statistics (cache source, tokens, compression)."""
        return completion_response(self._start_completion(prompt, formatted, kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream the answer; the last response (empty delta) carries the statistics."""
        return completion_stream(self._start_completion(prompt, formatted, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return chat_response(self._start_chat(messages, kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return chat_stream(completion_stream(self._start_chat(messages, kwargs)))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(lambda: completion_response(self._start_completion(prompt, formatted, kwargs)))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return in_thread(lambda: completion_stream(self._start_completion(prompt, formatted, kwargs)))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(lambda: chat_response(self._start_chat(messages, kwargs)))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return in_thread(lambda: chat_stream(completion_stream(self._start_chat(messages, kwargs))))
