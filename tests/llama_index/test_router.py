"""The HOMER-or-retrieval router on the embedded model: both routes, every strategy kind, offline."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core import Settings
from llama_index.core.query_engine import RouterQueryEngine
from llama_index.core.schema import Document
from llama_index.core.tools import QueryEngineTool, ToolMetadata

from homer_integrations.llama_index import (
    HomerLLM,
    HomerQueryEngine,
    HomerRouterQueryEngine,
    HomerRouteSelector,
    bm25_query_engine,
)
from homer_integrations.routing import SelfRouteStrategy

pytestmark = pytest.mark.real_model

FACT = "Who has taken Netherfield Park?"
WHOLE = "Summarize the whole chapter."
SMALL = {"chunk_size": 128, "similarity_top_k": 2}  # short retrieval prompts keep the tests quick


@pytest.fixture(scope="module")
def llm(smol_engine) -> HomerLLM:
    return HomerLLM(engine=smol_engine, num_output=6)


@pytest.fixture(scope="module")
def doc(excerpt) -> Document:
    return Document(text=excerpt, id_="pride-ch1")


def assert_homer_route(response, doc: Document) -> None:
    assert response.metadata["route"] == "homer"
    assert response.metadata["selector_result"].ind == 0
    assert [n.node.node_id for n in response.source_nodes] == [doc.doc_id]
    assert response.source_nodes[0].node.metadata["homer"]["cache_source"] in {"computed", "memory"}
    assert str(response).strip()


def assert_retrieval_route(response, doc: Document) -> None:
    assert response.metadata["route"] == "retrieval"
    assert response.metadata["selector_result"].ind == 1
    assert 1 <= len(response.source_nodes) <= SMALL["similarity_top_k"]
    assert all(n.node.ref_doc_id == doc.doc_id and n.node.node_id != doc.doc_id for n in response.source_nodes)
    assert response.source_nodes[0].score > 0  # BM25 found the words of the question
    assert str(response).strip()


def test_rules_route_both_ways(llm, doc):
    router = HomerRouterQueryEngine.from_documents([doc], llm, **SMALL, strategy="rules")
    whole = router.query(WHOLE)
    assert_homer_route(whole, doc)
    assert whole.metadata["route_strategy"] == "rules"
    assert "Summarize" in whole.metadata["route_reason"]

    fact = router.query(FACT)
    assert_retrieval_route(fact, doc)
    assert fact.metadata["route_reason"] == "no rule matched; default route retrieval"


def test_self_route_answers_from_excerpts_or_falls_back_to_homer(llm, doc, events):
    router = HomerRouterQueryEngine.from_documents([doc], llm, **SMALL, strategy="self_route")
    first = router.query(FACT)
    assert first.metadata["route_strategy"] == "self_route"
    prompts = [e.prompt for e in events.events if type(e).__name__ == "LLMCompletionStartEvent"]
    assert SelfRouteStrategy().retrieval_instruction in prompts[0]  # retrieval first, told how to decline
    if first.metadata["route"] == "retrieval":
        assert first.metadata["route_reason"] == "answered from the retrieved excerpts"
    else:
        assert "could not answer" in first.metadata["route_reason"]

    # every reply counts as "cannot answer": stands in for a model that declines, so HOMER answers
    declining = SelfRouteStrategy(refusal_patterns=[r"\S"])
    fallback = HomerRouterQueryEngine.from_documents([doc], llm, **SMALL, strategy=declining).query(FACT)
    assert_homer_route(fallback, doc)
    assert "could not answer" in fallback.metadata["route_reason"]


async def test_callable_strategy_async_both_routes(llm, doc):
    def choose(question: str):
        return ("homer", "asks about the whole text") if "whole" in question else "retrieval"

    router = HomerRouterQueryEngine.from_documents([doc], llm, **SMALL, strategy=choose)
    whole, fact = await asyncio.gather(router.aquery(WHOLE), router.aquery(FACT))
    assert_homer_route(whole, doc)
    assert whole.metadata["route_reason"] == "asks about the whole text"
    assert whole.metadata["route_strategy"] == "choose"
    assert_retrieval_route(fact, doc)
    assert fact.metadata["route_reason"] == "chosen by choose"


def test_selector_in_a_stock_router_query_engine(llm, doc):
    """Our selector drops into LlamaIndex's own RouterQueryEngine (first decision only)."""
    tools = [
        QueryEngineTool(
            query_engine=HomerQueryEngine([doc], llm), metadata=ToolMetadata(name="homer", description="h")
        ),
        QueryEngineTool(
            query_engine=bm25_query_engine([doc], llm, chunk_size=128, similarity_top_k=2),
            metadata=ToolMetadata(name="retrieval", description="r"),
        ),
    ]
    router = RouterQueryEngine(selector=HomerRouteSelector("rules"), query_engine_tools=tools, llm=llm)
    response = router.query(FACT)
    assert response.metadata["selector_result"].ind == 1
    assert "no rule matched" in response.metadata["selector_result"].reason
    assert all(n.node.ref_doc_id == doc.doc_id for n in response.source_nodes)
    assert str(response).strip()

    # nothing reached for LlamaIndex's global default LLM or embedding model (OpenAI)
    assert Settings._llm is None and Settings._embed_model is None

    with pytest.raises(ValueError, match="no choice named"):
        HomerRouteSelector("rules").select([ToolMetadata(name="a", description="x")], FACT)
