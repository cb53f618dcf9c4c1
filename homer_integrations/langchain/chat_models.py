"""``ChatHomer``: a LangChain chat model that compresses each long document once (HOMER)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from homer_integrations.aio import iterate_in_thread
from homer_integrations.langchain.base import HomerCall, HomerSettings

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}
SUPPORTED_CONTENT = "plain strings and {'type': 'text'} parts"
SUPPORTED_MESSAGES = "human, ai, system, tool and function messages, and chat messages with a role"


def message_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template role/content dicts.

    Raises ``ValueError`` for content the model cannot read (an image, audio, a file, any part
    that is not text) and for message types without a chat role, rather than dropping them.
    """
    out = []
    for i, m in enumerate(messages):
        role = getattr(m, "role", None) if m.type == "chat" else _ROLES.get(m.type)
        if not role:
            raise ValueError(
                f"message {i} is a {m.type!r} message{' with no role' if m.type == 'chat' else ''}; "
                f"ChatHomer supports {SUPPORTED_MESSAGES}"
            )
        out.append({"role": role, "content": _content_text(m, i)})
    return out


def _content_text(message: BaseMessage, index: int) -> str:
    """The text of a message whose content is a string or a list of text parts."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type", "untyped") if isinstance(part, dict) else type(part).__name__
            raise ValueError(
                f"message {index} ({message.type}) has a {kind!r} content part, which ChatHomer cannot read: "
                f"its model takes text only ({SUPPORTED_CONTENT})"
            )
    return "".join(texts)


class ChatHomer(HomerSettings, BaseChatModel):
    """A local Hugging Face chat model that answers about whole documents beyond its window.

    Long documents are compressed once by HOMER into a short cache and every later question
    about them reuses it. A document gets in three ways (see ``homer_integrations.prompt_split``):
    ``ChatHomer(document=...)``, ``.bind(document=...)`` or ``invoke(..., document=...)``;
    a document this engine compressed before, found by its exact text in a message; or, for a
    prompt longer than ``long_prompt_tokens``, the long middle of its longest message (an
    unchanged "stuff" chain). Everything else runs as a plain chat call.

    ``mode`` picks how a document answers (``shared``: one compressed cache for every question;
    ``query_aware``: the question is compressed with the document; ``full``: uncompressed, must
    fit the window); None follows the engine's configuration, and ``invoke(..., mode=...)`` or
    ``.bind(mode=...)`` overrides it per call.

    ``usage_metadata.input_token_details`` has ``cache_creation`` (tokens compressed on this
    call) and ``cache_read`` (tokens served from the cache); ``response_metadata["homer"]``
    has the mode that served, the cache source, cache size, compression time and how the
    document was found.

    Example:
        ```python
        chat = ChatHomer()  # embedded default model, loaded on first use
        chain = prompt | chat  # prompt with {context} and {question}
        chain.invoke({"context": book, "question": "Who is Mr. Darcy?"})
        ```
    """

    streaming: bool = False
    """Whether ``invoke`` streams internally (token callbacks fire either way with ``stream``)."""

    @property
    def _llm_type(self) -> str:
        return "homer-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="homer",
            ls_model_name=kwargs.get("model") or self.model_name,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
        )
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def _start(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> HomerCall:
        return self.start_call(message_dicts(messages), stop, kwargs)

    @staticmethod
    def _result(call: HomerCall, text: str) -> ChatResult:
        message = AIMessage(content=text, usage_metadata=call.usage(), response_metadata=call.metadata())
        return ChatResult(generations=[ChatGeneration(message=message)])

    @staticmethod
    def _chunks(call: HomerCall) -> Iterator[ChatGenerationChunk]:
        for piece in call.stream:
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        # usage and metadata once, on the last chunk: they are complete only now
        last = AIMessageChunk(
            content="", usage_metadata=call.usage(), response_metadata=call.metadata(), chunk_position="last"
        )
        yield ChatGenerationChunk(message=last)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._start(messages, stop, kwargs)
        return self._result(call, call.stream.text())

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await asyncio.to_thread(self._generate, messages, stop, None, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # BaseChatModel.stream fires on_llm_new_token for each chunk itself
        yield from self._chunks(self._start(messages, stop, kwargs))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in iterate_in_thread(lambda: self._chunks(self._start(messages, stop, kwargs))):
            yield chunk
