"""``ChatHomer``: a LangChain chat model that compresses each long document once (HOMER)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.homer.decoding.constraints import ResponseFormat
from homer_integrations.langchain.base import HomerCall, HomerSettings
from homer_integrations.langchain.structured import structured_runnable
from homer_integrations.tool_calls import ToolCall, ToolCallFormat, render_call

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}
SUPPORTED_CONTENT = "plain strings and {'type': 'text'} parts"
_CALL_PARTS = frozenset({"tool_use", "tool_call", "function_call"})
_REASONING_PARTS = frozenset({"thinking", "redacted_thinking", "reasoning"})
"""An earlier answer's reasoning (Anthropic's thinking blocks, LangChain's reasoning blocks): left out of
the prompt, as reasoning models' own chat templates leave past reasoning out."""
SUPPORTED_MESSAGES = "human, ai, system, tool and function messages, and chat messages with a role"


def message_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template role/content dicts.

    Raises ``ValueError`` for content the model cannot read (an image, audio, a file, any part
    that is not text) and for message types without a chat role, rather than dropping them.
    """
    out = []
    for i, m in enumerate(messages):
        # a streamed answer kept in the history is a chunk ("AIMessageChunk"): the role of its message kind
        kind = m.type.removesuffix("MessageChunk").lower() if m.type.endswith("MessageChunk") else m.type
        role = getattr(m, "role", None) if kind == "chat" else _ROLES.get(kind)
        if not role:
            raise ValueError(
                f"message {i} is a {m.type!r} message{' with no role' if kind == 'chat' else ''}; "
                f"ChatHomer supports {SUPPORTED_MESSAGES}"
            )
        content = _content_text(m, i)
        calls = getattr(m, "tool_calls", None) or []
        if calls:  # past calls are shown as the model writes them
            content = "\n".join([content, *(render_call(c["name"], c["args"]) for c in calls)]).strip()
        out.append({"role": role, "content": content})
    return out


def _with_note(messages: list[dict[str, str]], note: str) -> list[dict[str, str]]:
    """``note`` appended to the last message on its own line. No blank line: a document found by its
    paragraph breaks (``prompt_split``) keeps the question and the note after it, outside the cache."""
    if not note:
        return messages
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last['content'].rstrip()}\n{note}"}]


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {"name": call.name, "args": call.arguments, "id": call.id, "type": "tool_call"}


def _answer_message(call: HomerCall, text: str) -> AIMessage:
    """The answer as an ``AIMessage``: text, or (with bound tools) the tool call it holds."""
    if call.tools is None or not ToolCallFormat.is_call(text.lstrip()):
        return AIMessage(content=text)
    try:
        decoded = call.tools.parse(text)
    except ValueError as e:
        invalid = {"name": None, "args": text, "id": None, "error": str(e), "type": "invalid_tool_call"}
        return AIMessage(content="", invalid_tool_calls=[invalid])
    return AIMessage(content="", tool_calls=[_tool_call_dict(decoded)])


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
        elif isinstance(part, dict) and part.get("type") in _CALL_PARTS and getattr(message, "tool_calls", None):
            continue  # a provider's copy of a call that message.tool_calls holds (and message_dicts renders)
        elif isinstance(part, dict) and part.get("type") in _REASONING_PARTS and message.type == "ai":
            continue
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
    about them reuses it. A document gets in three ways (see ``homer_integrations.engine.prompt_split``):
    ``ChatHomer(document=...)``, ``.bind(document=...)`` or ``invoke(..., document=...)``;
    a document this engine compressed before, found by its exact text in a message; or, for a
    prompt longer than ``long_prompt_tokens``, the long middle of its longest message (an
    unchanged "stuff" chain). Everything else runs as a plain chat call.

    ``mode`` picks how a document answers (``auto``, the engine's default: ``full`` where the document fits the
    window, else ``query_aware``; ``query_aware``: the question is compressed with the document; ``shared``: one
    compressed cache for every question; ``full``: uncompressed, must fit the window); None follows the engine's
    configuration, and ``invoke(..., mode=...)`` or ``.bind(mode=...)`` overrides it per call.

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
    default_tool_choice: Literal["auto", "first"] = "auto"
    """What bound tools without a ``tool_choice`` do: ``auto`` lets the model choose between a call and
    text; ``first`` requires a call unless the last message is a tool result (then ``auto``), the
    agent-loop pattern for small models, which rarely choose a tool by themselves."""

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
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        choice = kwargs.pop("tool_choice", None)
        if choice is None and self.default_tool_choice == "first" and messages and messages[-1].type != "tool":
            choice = "any"
        tool_format = ToolCallFormat(tools, choice) if tools else None
        if tool_format is not None:
            note = tool_format.instructions()
            kwargs["response_format"] = tool_format.response_format()
        elif kwargs.get("response_format") is not None:
            kwargs["response_format"] = ResponseFormat.of(kwargs["response_format"])
            note = kwargs["response_format"].instructions()
        else:
            note = ""
        call = self.start_call(_with_note(message_dicts(messages), note), stop, kwargs)
        call.tools = tool_format
        return call

    @staticmethod
    def _result(call: HomerCall, text: str) -> ChatResult:
        message = _answer_message(call, text)
        message.usage_metadata = call.usage()
        message.response_metadata = call.metadata()
        return ChatResult(generations=[ChatGeneration(message=message)])

    @staticmethod
    def _chunks(call: HomerCall) -> Iterator[ChatGenerationChunk]:
        # With tools, an answer that starts with "{" is a call: held back and sent whole, as one
        # tool-call chunk, once decoded; text answers stream as they come.
        held, text_mode = "", call.tools is None
        for piece in call.stream:
            if not text_mode:
                held += piece
                start = held.lstrip()
                if not start or ToolCallFormat.is_call(start):
                    continue
                piece, held, text_mode = held, "", True
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if held:
            message = _answer_message(call, held)
            calls = [{**c, "args": json.dumps(c["args"])} for c in message.tool_calls]
            if message.invalid_tool_calls:  # unparsable args: LangChain reports them as an invalid call
                calls = [{"name": None, "args": held, "id": None}]
            chunks = [{**c, "index": i, "type": "tool_call_chunk"} for i, c in enumerate(calls)]
            yield ChatGenerationChunk(message=AIMessageChunk(content=message.content, tool_call_chunks=chunks))
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

    # ----------------------------------------------------------------------------- tools and structure
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; their calls are decoded under a grammar and returned as ``AIMessage.tool_calls``.

        ``tool_choice``: ``"auto"``/None (a call or a text answer), ``"any"``/``"required"``/True (a call
        of one of the tools), a tool's name or ``{"function": {"name": ...}}`` (a call of that tool), or
        ``"none"`` (text). One call per answer.
        """
        formatted = [convert_to_openai_tool(t) for t in tools]
        if isinstance(tool_choice, dict):
            tool_choice = (tool_choice.get("function") or tool_choice).get("name")
        elif tool_choice is True:
            tool_choice = "any"
        elif tool_choice is False:
            tool_choice = "none"
        ToolCallFormat(formatted, tool_choice)  # a bad tool or choice fails here, not at the first call
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """A runnable that answers with ``schema`` (a pydantic model class, TypedDict or JSON schema dict;
        None with ``json_mode``).

        Decoding is constrained, so the answer always fits the schema unless ``max_tokens`` cuts it.
        ``method``: ``json_schema`` (the answer is the JSON object), ``function_calling`` (a forced call
        of a tool named after the schema) or ``json_mode`` (the same as ``json_schema``; without a schema,
        any JSON object, parsed as a dict). Pydantic schemas return instances, the others dicts.
        ``include_raw`` returns ``{"raw", "parsed", "parsing_error"}``. ``strict`` is accepted for
        compatibility: decoding is always strict.
        """
        if kwargs:
            raise ValueError(f"unsupported arguments: {sorted(kwargs)}")
        return structured_runnable(self, schema, method, include_raw)
