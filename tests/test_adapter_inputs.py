"""Bad input through every front end gets the one clear error ``HomerModel`` gives (issue 82, item 6): a lone
surrogate reached the tokenizer's TypeError, ``document=5`` an AttributeError, bytes LangChain's "Unsupported
message type", and ``query("")`` answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core import Document

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.langchain import ChatHomer
from homer_integrations.langchain import HomerLLM as LangChainLLM
from homer_integrations.llama_index import HomerCorpusQueryEngine, HomerQueryEngine
from homer_integrations.llama_index import HomerLLM as LlamaIndexLLM
from tests.conftest import tiny_model

TEXT = "The meeting is on Tuesday in room 42. " * 40


@pytest.fixture(scope="module")
def engine(tokenizer) -> HomerModel:
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    return HomerModel(tiny_model(), tokenizer, config, model_name="tiny", progress=False)


def fronts(engine: HomerModel) -> dict[str, Callable[..., Any]]:
    """Each front end's call with (prompt or question, document keyword)."""
    li = LlamaIndexLLM(engine=engine, max_tokens=1)
    return {
        "ChatHomer": lambda q, **kw: ChatHomer(engine=engine, max_tokens=1).invoke(q, **kw),
        "LangChain HomerLLM": lambda q, **kw: LangChainLLM(engine=engine, max_tokens=1).invoke(q, **kw),
        "LlamaIndex HomerLLM": lambda q, **kw: li.complete(q, **kw),
        "HomerQueryEngine": lambda q, **kw: HomerQueryEngine([Document(text=TEXT)], li).query(q),
        "HomerCorpusQueryEngine": lambda q, **kw: HomerCorpusQueryEngine([Document(text=TEXT)], li).query(q),
    }


FRONTS = ["ChatHomer", "LangChain HomerLLM", "LlamaIndex HomerLLM", "HomerQueryEngine", "HomerCorpusQueryEngine"]


@pytest.mark.parametrize("front", FRONTS)
def test_a_lone_surrogate_is_a_value_error_naming_it(engine: HomerModel, front: str) -> None:
    with pytest.raises(ValueError, match=r"not valid Unicode text: a lone surrogate U\+D800"):
        fronts(engine)[front]("When is it?\ud800")


@pytest.mark.parametrize("front", FRONTS)
def test_bytes_are_a_type_error_that_says_decode(engine: HomerModel, front: str) -> None:
    with pytest.raises(TypeError, match=r"not bytes: decode it first"):
        fronts(engine)[front](b"When is it?")


@pytest.mark.parametrize("front", ["ChatHomer", "LangChain HomerLLM", "LlamaIndex HomerLLM"])
@pytest.mark.parametrize(("document", "error"), [(5, TypeError), (b"text", TypeError), ("Tue\ud800sday", ValueError)])
def test_a_document_that_is_not_text_is_refused(engine: HomerModel, front: str, document: object, error: type) -> None:
    with pytest.raises(error, match=r"the document (must be text|is not valid Unicode)"):
        fronts(engine)[front]("When is it?", document=document)


@pytest.mark.parametrize("front", ["HomerQueryEngine", "HomerCorpusQueryEngine"])
def test_an_empty_query_is_refused(engine: HomerModel, front: str) -> None:
    with pytest.raises(ValueError, match="the question is empty"):
        fronts(engine)[front]("  ")
