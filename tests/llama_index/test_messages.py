"""``llama_index.messages``: LlamaIndex prompts as the engine's role/content messages (no model needed)."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from llama_index.core.llms.llm import default_completion_to_prompt

from homer_integrations.engine.prompt_split import render_plain_text
from homer_integrations.llama_index.llm import message_text as reexported
from homer_integrations.llama_index.messages import chat_messages, completion_messages, message_text


def test_a_completion_prompt_takes_the_system_prompt_and_the_chat_template():
    messages, render = completion_messages(
        "Q?", "Be brief.", formatted=False, completion_to_prompt=default_completion_to_prompt
    )
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}]
    assert render is None
    assert completion_messages("Q?", None, formatted=False, completion_to_prompt=default_completion_to_prompt)[0] == [
        {"role": "user", "content": "Q?"}
    ]


def test_a_formatted_or_custom_formatted_prompt_is_rendered_as_text_without_the_system_prompt():
    messages, render = completion_messages(
        "Q?", "Be brief.", formatted=True, completion_to_prompt=default_completion_to_prompt
    )
    assert messages == [{"role": "user", "content": "Q?"}] and render is render_plain_text
    messages, render = completion_messages(
        "Q?", "Be brief.", formatted=False, completion_to_prompt=lambda text: f"<{text}>"
    )
    assert messages == [{"role": "user", "content": "Q?"}] and render(messages) == "<Q?>"


def test_chat_messages_add_the_system_prompt_only_where_none_is_given():
    user = ChatMessage(role=MessageRole.USER, content="Hi")
    assert chat_messages([user], "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    system = ChatMessage(role=MessageRole.SYSTEM, content="Mine.")
    assert chat_messages([system, user], "Be brief.") == [
        {"role": "system", "content": "Mine."},
        {"role": "user", "content": "Hi"},
    ]


def test_message_text_reads_text_blocks_and_refuses_others():
    assert reexported is message_text
    message = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="a"), TextBlock(text="b")])
    assert message_text(message) == message.content
    image = ChatMessage(role=MessageRole.USER, blocks=[ImageBlock(image=b"\x89PNG", image_mimetype="image/png")])
    with pytest.raises(ValueError, match=r"message 2 \(user\) has a 'image' block"):
        message_text(image, 2)
