"""``ChatHomer.with_structured_output`` and ``bind_tools`` over whole documents, on a random-weight tiny
model: constrained decoding must still return schema-valid objects and well-formed tool calls."""

from __future__ import annotations

from typing import Annotated, Literal

import jsonschema
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from homer_integrations.langchain import ChatHomer
from homer_integrations.langchain.chat_models import message_dicts
from tests.conftest import mode_engine


class Character(BaseModel):
    """A character of the book (strings bounded: a random model never closes one by itself)."""

    name: str = Field(max_length=10, description="the character's name")
    age: int = Field(ge=0, le=99)
    role: Literal["hero", "villain"]


class Setting(TypedDict):
    """Where the book takes place."""

    town: Annotated[Literal["Longbourn", "Meryton"], ..., "the town"]  # LangChain's TypedDict annotation style
    century: Literal[18, 19]


SETTING_SCHEMA = {
    "title": "Setting",
    "type": "object",
    "properties": {"town": {"enum": ["Longbourn", "Meryton"]}, "century": {"enum": [18, 19]}},
    "required": ["town", "century"],
}


class WeatherArgs(BaseModel):
    city: Literal["Paris", "Rome"]
    days: int = Field(ge=1, le=7)


@tool(args_schema=WeatherArgs)
def get_weather(city: str, days: int) -> str:
    """Forecast the weather of a city."""
    return f"sunny in {city} for {days} days"


class TimeArgs(BaseModel):
    zone: Literal["UTC", "CET"]


@tool(args_schema=TimeArgs)
def get_time(zone: str) -> str:
    """Tell the time in a time zone."""
    return f"noon {zone}"


TOOL_SCHEMAS = {t.name: convert_to_openai_tool(t)["function"]["parameters"] for t in (get_weather, get_time)}


@pytest.fixture(scope="module")
def chat(tokenizer, calibration, text):
    return ChatHomer(engine=mode_engine(tokenizer, calibration, mode="shared"), max_tokens=80, document=text)


QUESTION = [HumanMessage("Who is the main character?")]


def test_pydantic_schema_returns_instances_invoke_and_stream(chat):
    structured = chat.with_structured_output(Character)
    assert isinstance(structured.invoke(QUESTION), Character)
    chunks = list(structured.stream(QUESTION))
    assert chunks and isinstance(chunks[-1], Character)


@pytest.mark.parametrize("schema", [Setting, SETTING_SCHEMA], ids=["typeddict", "json_schema"])
def test_typeddict_and_json_schema_return_valid_dicts(chat, schema):
    result = chat.with_structured_output(schema).invoke(QUESTION)
    jsonschema.validate(result, SETTING_SCHEMA)
    assert set(result) == {"town", "century"}


def test_function_calling_method_and_include_raw(chat):
    result = chat.with_structured_output(Character, method="function_calling", include_raw=True).invoke(QUESTION)
    assert result["parsing_error"] is None and isinstance(result["parsed"], Character)
    raw: AIMessage = result["raw"]
    assert raw.tool_calls[0]["name"] == "Character" and raw.content == ""
    assert Character.model_validate(raw.tool_calls[0]["args"]) == result["parsed"]


def test_json_mode_returns_an_object(chat):
    short = chat.model_copy(update={"max_tokens": 40})
    out = short.with_structured_output(None, method="json_mode", include_raw=True).invoke(QUESTION)
    # any JSON object; a random model may not close it in 40 tokens, which include_raw reports
    assert isinstance(out["parsed"], dict) or out["parsing_error"] is not None
    assert out["raw"].content.startswith("{")


def test_every_schema_reads_the_one_compressed_document(tokenizer, calibration, text):
    chat = ChatHomer(engine=mode_engine(tokenizer, calibration, mode="shared"), max_tokens=80, document=text)
    first = chat.with_structured_output(Character, include_raw=True).invoke(QUESTION)["raw"]
    second = chat.with_structured_output(Setting, include_raw=True).invoke(QUESTION)["raw"]
    created = first.usage_metadata["input_token_details"]["cache_creation"]
    assert created > 500
    assert second.usage_metadata["input_token_details"] == {"cache_creation": 0, "cache_read": created}


@pytest.mark.parametrize("choice", ["any", "required", True, "get_time", {"function": {"name": "get_time"}}])
def test_forced_tool_calls_are_valid_calls(chat, choice):
    message = chat.bind_tools([get_weather, get_time], tool_choice=choice).invoke(QUESTION)
    assert message.content == "" and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call["type"] == "tool_call" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], TOOL_SCHEMAS[call["name"]])
    if choice not in ("any", "required", True):
        assert call["name"] == "get_time"


def test_streamed_tool_call_aggregates_to_the_same_call(chat):
    bound = chat.bind_tools([get_weather], tool_choice="any")
    full = None
    for chunk in bound.stream(QUESTION):
        full = chunk if full is None else full + chunk
    assert full.tool_calls and full.tool_calls[0]["name"] == "get_weather"
    assert full.tool_calls[0]["args"] == bound.invoke(QUESTION).tool_calls[0]["args"]  # greedy: same call
    assert full.usage_metadata["output_tokens"] > 0


def test_auto_is_a_call_or_text_and_none_is_text(chat):
    message = chat.bind_tools([get_weather, get_time]).invoke(QUESTION)
    assert bool(message.tool_calls) != bool(message.content)
    if message.tool_calls:
        jsonschema.validate(message.tool_calls[0]["args"], TOOL_SCHEMAS[message.tool_calls[0]["name"]])
    else:
        assert not message.content.startswith("{")
    assert not chat.bind_tools([get_weather], tool_choice="none").invoke(QUESTION).tool_calls


def test_tool_histories_render_past_calls_and_bad_choices_fail_at_bind(chat):
    history = [
        HumanMessage("Weather in Rome?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Rome", "days": 2}, "id": "c1"}]),
        ToolMessage("sunny", tool_call_id="c1"),
    ]
    dicts = message_dicts(history)
    assert dicts[1] == {"role": "assistant", "content": '{"name":"get_weather","arguments":{"city":"Rome","days":2}}'}
    assert dicts[2]["role"] == "tool"
    assert isinstance(chat.bind_tools([get_weather]).invoke(history), AIMessage)
    with pytest.raises(ValueError, match="names no bound tool"):
        chat.bind_tools([get_weather], tool_choice="get_time")


def test_first_policy_calls_on_a_question_and_is_auto_after_a_tool_result(chat):
    agent = chat.model_copy(update={"default_tool_choice": "first"}).bind_tools([get_weather])
    call = agent.invoke(QUESTION)
    assert call.tool_calls and call.tool_calls[0]["name"] == "get_weather"
    result = get_weather.invoke(call.tool_calls[0])
    after = agent.invoke([*QUESTION, call, result])
    assert isinstance(after, AIMessage) and bool(after.tool_calls) != bool(after.content)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"title": "X", "type": 5}, "type must be a string"),
        ({"title": "L", "type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}, "without end"),
    ],
)
def test_an_unsatisfiable_schema_is_refused_when_the_runnable_is_built(method: str, schema: dict, says: str) -> None:
    """``{"type": 5}`` gave an AttributeError inside langchain-core (issue 82, item 9)."""
    with pytest.raises(ValueError, match=says):
        ChatHomer(model="tiny").with_structured_output(schema, method=method)
