"""Structured output of ``HomerLLM`` and ``HomerQueryEngine(output_cls=...)`` over whole documents, on a
random-weight tiny model: constrained decoding must still return validated pydantic objects."""

from __future__ import annotations

from typing import Literal

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.base.response.schema import PydanticResponse
from llama_index.core.prompts import PromptTemplate
from llama_index.core.schema import Document
from pydantic import BaseModel, Field

from homer_integrations.llama_index import HomerLLM, HomerQueryEngine
from tests.conftest import mode_engine


class Character(BaseModel):
    """Strings bounded: a random-weight model never closes one by itself."""

    name: str = Field(max_length=10, description="the character's name")
    age: int = Field(ge=0, le=99)
    role: Literal["hero", "villain"]


class Setting(BaseModel):
    town: Literal["Longbourn", "Meryton"]
    century: Literal[18, 19]


PROMPT = PromptTemplate("Read the text.\n\n{text}\n\nWho is the main character?")


@pytest.fixture
def llm(tokenizer, calibration):
    return HomerLLM(engine=mode_engine(tokenizer, calibration, mode="shared"), num_output=80)


def roots(llm: HomerLLM) -> int:
    return sum(e.kind == "root" for e in llm.engine.document_cache.entries())


def test_structured_predict_over_a_whole_document_compresses_it_once(llm, text):
    character = llm.structured_predict(Character, PROMPT, text=text)
    setting = llm.structured_predict(Setting, PROMPT, text=text)
    assert isinstance(character, Character) and isinstance(setting, Setting)
    assert roots(llm) == 1  # the second schema answered from the first one's compressed document


async def test_async_and_streaming_forms(llm, text):
    assert isinstance(await llm.astructured_predict(Character, PROMPT, text=text), Character)
    streamed = list(llm.stream_structured_predict(Setting, PROMPT, text=text))
    assert streamed and all(isinstance(s, Setting) for s in streamed)
    assert streamed[-1] == llm.structured_predict(Setting, PROMPT, text=text)  # greedy: the same answer
    items = [s async for s in await llm.astream_structured_predict(Setting, PROMPT, text=text)]
    assert items[-1] == streamed[-1]


def test_as_structured_llm_returns_the_object_as_raw(llm, text):
    structured = llm.as_structured_llm(Character)
    response = structured.chat([ChatMessage(role=MessageRole.USER, content="Who is the hero?")], document=text)
    assert isinstance(response.raw, Character)
    assert Character.model_validate_json(response.message.content) == response.raw


def test_query_engine_output_cls_returns_validated_objects(llm, text):
    engine = HomerQueryEngine([Document(text=text)], llm=llm, output_cls=Character)
    response = engine.query("Who is the hero?")
    assert isinstance(response, PydanticResponse) and isinstance(response.response, Character)
    assert response.source_nodes[0].metadata["homer"]["cache_source"] == "computed"
    assert engine.query("Who is the villain?").source_nodes[0].metadata["homer"]["cache_source"] == "memory"


def test_query_engine_combines_several_documents_under_the_schema(llm, text):
    docs = [Document(text=text[:1500], id_="a"), Document(text=text[1500:], id_="b")]
    response = HomerQueryEngine(docs, llm=llm, output_cls=Setting, max_documents=None).query("Where?")
    assert isinstance(response.response, Setting) and len(response.source_nodes) == 2
    for node in response.source_nodes:
        Setting.model_validate_json(node.metadata["homer"]["answer"])
    with pytest.raises(ValueError, match="streaming=False"):
        HomerQueryEngine(docs, llm=llm, output_cls=Setting, streaming=True)
