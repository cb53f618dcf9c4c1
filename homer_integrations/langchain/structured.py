"""Structured output for ``ChatHomer``: ``with_structured_output``'s runnable, whose answer is decoded under
the schema (``homer_integrations.homer.decoding.constraints``) and parsed, so it fits even from a small model.

The chat model comes in as an argument typed by LangChain's ``BaseChatModel`` (only ``bind`` and
``bind_tools`` are called), so this module does not import ``chat_models``, which imports it."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticToolsParser
from langchain_core.output_parsers.pydantic import PydanticOutputParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel

from homer_integrations.homer.decoding.constraints import ResponseFormat


def structured_runnable(
    chat: BaseChatModel,
    schema: dict[str, Any] | type | None,
    method: Literal["json_schema", "function_calling", "json_mode"],
    include_raw: bool,
) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
    """``chat.with_structured_output(schema, method=method, include_raw=include_raw)``: ``chat`` bound to
    decode under ``schema`` (or to call a tool named after it), piped into the matching parser. ``chat`` is a
    ``ChatHomer`` (any chat model whose ``bind`` takes ``response_format=ResponseFormat`` would do)."""
    if schema is None and method != "json_mode":
        raise ValueError(f"method={method!r} needs a schema")
    if isinstance(schema, dict):  # refused here in our words: LangChain's converters fail on it with AttributeError
        ResponseFormat.of(schema)
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    traced = {"kwargs": {"method": method}, "schema": schema}
    parser: Runnable
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = chat.bind_tools([schema], tool_choice=name, ls_structured_output_format=traced)
        parser = (
            PydanticToolsParser(tools=[schema], first_tool_only=True)
            if is_pydantic
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    elif method in ("json_schema", "json_mode"):
        # pydantic 2 classes compile directly; TypedDicts (LangChain's annotations) and pydantic 1 via LangChain;
        # json_mode without a schema: any JSON object
        if schema is None:
            target: Any = {"type": "object"}
        elif isinstance(schema, type) and issubclass(schema, BaseModel):
            target = schema
        else:
            target = convert_to_json_schema(schema)
        llm = chat.bind(response_format=ResponseFormat.of(target), ls_structured_output_format=traced)
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    else:
        raise ValueError(f"unknown method {method!r}: use json_schema, function_calling or json_mode")
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")
