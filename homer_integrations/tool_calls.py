"""Tool calls for models without a tool-calling chat template: a prompt note, a grammar, a parser.

Framework-free: tools are OpenAI-format function dicts (``{"type": "function", "function": {"name",
"description", "parameters"}}``, what LangChain's ``convert_to_openai_tool`` returns). A call is
written as one compact JSON object, ``{"name": ..., "arguments": {...}}``, decoded under a grammar
(see ``homer.decoding.constraints``): with ``choice="any"`` the answer must be a call to one of the tools,
with a tool's name a call to that tool, with ``"auto"`` either a call (the answer starts with ``{``)
or plain text. One call per answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homer_integrations.homer.decoding.constraints import ResponseFormat, closed_schema

AUTO, ANY, NONE = "auto", "any", "none"


@dataclass(frozen=True)
class ToolSpec:
    """One callable tool: its name, what it does, and the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def from_openai(cls, tool: Mapping[str, Any]) -> ToolSpec:
        """From an OpenAI-format tool dict (or its ``function`` part)."""
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not fn.get("name"):
            raise ValueError(f"not an OpenAI-format tool: {tool!r}")
        parameters = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        return cls(str(fn["name"]), str(fn.get("description") or ""), parameters)

    def signature(self) -> str:
        """``name(arg: type, ...): description`` for the prompt note."""
        props = self.parameters.get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'value') if isinstance(v, dict) else 'value'}" for k, v in props.items())
        description = " ".join(self.description.split())
        return f"{self.name}({args})" + (f": {description}" if description else "")

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema of a call to this tool."""
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": closed_schema(self.parameters)},
            "required": ["name", "arguments"],
        }


@dataclass(frozen=True)
class ToolCall:
    """A decoded call: tool name, arguments, and a fresh id."""

    name: str
    arguments: dict[str, Any]
    id: str


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as the model writes it (also how past calls appear in a conversation)."""
    return json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False, separators=(",", ":"))


class ToolCallFormat:
    """The tools bound to a call and how the model may use them (``choice``: auto, any, none or a name)."""

    def __init__(self, tools: Sequence[Mapping[str, Any]], choice: str | None = None) -> None:
        self.tools = [ToolSpec.from_openai(t) for t in tools]
        if not self.tools:
            raise ValueError("no tools given")
        names = [t.name for t in self.tools]
        choice = AUTO if choice in (None, AUTO) else ANY if choice in (ANY, "required") else choice
        if choice not in (AUTO, ANY, NONE) and choice not in names:
            raise ValueError(f"tool_choice {choice!r} names no bound tool; tools: {names}")
        self.choice = choice

    def callable_tools(self) -> list[ToolSpec]:
        """The tools a call may name under this choice."""
        if self.choice in (AUTO, ANY):
            return self.tools
        return [t for t in self.tools if t.name == self.choice] if self.choice != NONE else []

    def instructions(self) -> str:
        """The note added to the prompt: the tools and how to call them (no blank lines)."""
        tools = self.callable_tools()
        if not tools:
            return ""
        listing = "\n".join(f"- {t.signature()}" for t in tools)
        how = 'answer only with JSON: {"name": <tool name>, "arguments": {<arguments>}}'
        if self.choice == AUTO:
            return f"Tools you can call:\n{listing}\nTo call a tool, {how}. Otherwise answer in plain text."
        return f"Tools you can call:\n{listing}\nCall a tool now: {how}."

    def response_format(self) -> ResponseFormat | None:
        """The grammar of the answer: a call (any / named), a call or text (auto), or None (none)."""
        tools = self.callable_tools()
        if not tools:
            return None
        schema = {"anyOf": [t.call_schema() for t in tools]}
        if self.choice != AUTO:
            return ResponseFormat.json_schema(schema)
        compact = {**schema, "x-guidance": {"whitespace_flexible": False}}
        return ResponseFormat.lark(f"start: call | TEXT\ncall: %json {json.dumps(compact)}\nTEXT: /[^{{](.|\\n)*/\n")

    @staticmethod
    def is_call(text: str) -> bool:
        """Whether an answer (so far) is a call rather than text: it starts with ``{``."""
        return text.startswith("{")

    def parse(self, text: str) -> ToolCall:
        """The call an answer holds; ``ValueError`` if it is not a complete call of a bound tool."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"incomplete tool call ({e}); was it cut by max_tokens?") from e
        if not isinstance(data, dict) or data.get("name") not in {t.name for t in self.tools}:
            raise ValueError(f"not a call of a bound tool: {text[:200]!r}")
        arguments = data.get("arguments")
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call arguments are not an object: {text[:200]!r}")
        return ToolCall(data["name"], arguments, f"call_{uuid.uuid4().hex[:24]}")
