"""LlamaIndex prompts as the engine's chat messages (``role``/``content`` dicts) and how to render them.

Shared by ``HomerLLM``'s completion and chat calls, at module level as LlamaIndex's own LLMs keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.llms.llm import default_completion_to_prompt

from homer_integrations.engine.prompt_split import Renderer, render_plain_text

Messages = list[dict[str, str]]


def message_text(message: ChatMessage, index: int = 0) -> str:
    """The text of a chat message (its text blocks, joined as ``ChatMessage.content`` joins them).

    Raises ``ValueError`` for any other block (an image, audio, a document, a tool call...): the
    model reads text only, and a dropped block would be answered about unseen.
    """
    for block in message.blocks:
        if not isinstance(block, TextBlock):
            kind = getattr(block, "block_type", type(block).__name__)
            raise ValueError(
                f"message {index} ({message.role.value}) has a {kind!r} block, which HomerLLM cannot read: "
                f"its model takes text only (TextBlock blocks or string content)"
            )
    return message.content or ""


def system_messages(system_prompt: str | None) -> Messages:
    """The system message an LLM's ``system_prompt`` adds, if it has one."""
    return [{"role": "system", "content": system_prompt}] if system_prompt else []


def completion_messages(
    prompt: str, system_prompt: str | None, *, formatted: bool, completion_to_prompt: Callable[[str], str]
) -> tuple[Messages, Renderer | None]:
    """A completion prompt as messages, and how to render them (None: the chat template, after the system
    prompt). A ``formatted`` prompt is plain text; a custom ``completion_to_prompt`` formats it itself."""
    messages = [{"role": "user", "content": prompt}]
    if formatted:
        return messages, render_plain_text
    if completion_to_prompt is not default_completion_to_prompt:
        return messages, lambda msgs: completion_to_prompt(render_plain_text(msgs))
    return system_messages(system_prompt) + messages, None


def chat_messages(messages: Sequence[ChatMessage], system_prompt: str | None) -> Messages:
    """Chat messages as dicts (text only, see ``message_text``), after the system prompt unless one is there."""
    dicts = [{"role": m.role.value, "content": message_text(m, i)} for i, m in enumerate(messages)]
    if not any(d["role"] == "system" for d in dicts):
        dicts = system_messages(system_prompt) + dicts
    return dicts
