"""``HomerRouterQueryEngine``: per query, HOMER over the whole documents or BM25 retrieval.

A ``RouterQueryEngine`` over two tools, ``homer`` (``HomerQueryEngine``) and ``retrieval``
(a BM25 ``RetrieverQueryEngine``), that runs the shared routing protocol
(``homer_integrations.routing.route_answer``): the selector decides, the chosen engine answers,
and the strategy may review the answer and switch (self-route falls back to HOMER when the
retrieved excerpts cannot answer). The final route and the reason land in
``response.metadata`` (``route``, ``route_reason``, ``route_strategy``, ``selector_result``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection
from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.query_engine import RouterQueryEngine
from llama_index.core.response_synthesizers import TreeSummarize
from llama_index.core.schema import Document, QueryBundle
from llama_index.core.tools import QueryEngineTool, ToolMetadata
from llama_index.retrievers.bm25 import BM25Retriever

from homer_integrations.homer.config import Mode
from homer_integrations.llama_index.llm import HomerLLM
from homer_integrations.llama_index.query_engine import HomerQueryEngine, query_text
from homer_integrations.llama_index.retrieval import bm25_query_engine, chunk_nodes
from homer_integrations.llama_index.selector import HomerRouteSelector
from homer_integrations.routing import (
    ROUTES,
    Route,
    RouteDecision,
    RoutingStrategy,
    StrategyLike,
    aroute_answer,
    route_answer,
)

HOMER_DESCRIPTION = (
    "Reads each whole document (compressed once by HOMER): for questions about a document as a "
    "whole, such as summaries, themes, or how things change over its course."
)
RETRIEVAL_DESCRIPTION = "Answers from the few best-matching excerpts (BM25): for specific facts and quotes."


class _SelectorStrategy(RoutingStrategy):
    """A router's selector as a routing strategy: its choice decides; a ``HomerRouteSelector``'s
    own strategy reviews the answer and supplies the retrieval instruction."""

    def __init__(self, selector: BaseSelector, choices: Sequence[ToolMetadata]) -> None:
        self._selector = selector
        self._choices = choices
        self._inner = selector.strategy if isinstance(selector, HomerRouteSelector) else None
        self.name = self._inner.name if self._inner else type(selector).__name__
        self.retrieval_instruction = self._inner.retrieval_instruction if self._inner else None

    @property
    def reviews(self) -> bool:
        """Whether answers are reviewed (so a streamed answer must be read whole first)."""
        return self._inner is not None and type(self._inner).review is not RoutingStrategy.review

    def decide(self, question: str) -> RouteDecision:
        result = self._selector.select(self._choices, question)
        route = self._choices[result.ind].name
        if route not in ROUTES:
            raise ValueError(f"the selector chose the tool {route!r}; the router's tools are {ROUTES}")
        return RouteDecision(route, result.reason, self.name)  # type: ignore[arg-type]

    def review(self, decision: RouteDecision, answer: str) -> RouteDecision | None:
        return self._inner.review(decision, answer) if self._inner else None


def _response_text(response: RESPONSE_TYPE) -> str:
    if isinstance(response, AsyncStreamingResponse):
        return response.response_txt or ""  # read whole by the async path before review
    return str(response)  # a StreamingResponse keeps the text it read for print_response_stream()


class HomerRouterQueryEngine(RouterQueryEngine):
    """Routes each query to HOMER over the whole documents or to BM25 retrieval over chunks.

    Build it with ``from_documents``; or pass two engines (tools named ``homer`` and
    ``retrieval``). ``selector`` defaults to ``HomerRouteSelector(strategy)``; any LlamaIndex
    selector works for a single decision (then no review). ``instructed_retrieval(instruction)``
    builds the retrieval engine with a strategy's extra instruction (self-route's "reply
    unanswerable"); without it the plain retrieval engine answers. With ``self_route`` a
    streamed retrieval answer is read whole before the review; the HOMER fallback streams.
    """

    def __init__(
        self,
        homer_engine: BaseQueryEngine,
        retrieval_engine: BaseQueryEngine,
        llm: HomerLLM,
        *,
        strategy: StrategyLike = "rules",
        selector: BaseSelector | None = None,
        instructed_retrieval: Callable[[str], BaseQueryEngine] | None = None,
        verbose: bool = False,
    ) -> None:
        tools = [
            QueryEngineTool(
                query_engine=homer_engine, metadata=ToolMetadata(name="homer", description=HOMER_DESCRIPTION)
            ),
            QueryEngineTool(
                query_engine=retrieval_engine,
                metadata=ToolMetadata(name="retrieval", description=RETRIEVAL_DESCRIPTION),
            ),
        ]
        # only used to merge several selections, which our selector never makes; explicit so
        # nothing reaches for global Settings or tiktoken
        helper = PromptHelper.from_llm_metadata(llm.metadata, tokenizer=llm.engine.token_ids)
        summarizer = TreeSummarize(llm=llm, prompt_helper=helper)
        super().__init__(
            selector or HomerRouteSelector(strategy), tools, llm=llm, summarizer=summarizer, verbose=verbose
        )
        self._instructed = instructed_retrieval
        self._instructed_engines: dict[str, BaseQueryEngine] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        llm: HomerLLM | None = None,
        *,
        strategy: StrategyLike = "rules",
        selector: BaseSelector | None = None,
        streaming: bool = False,
        max_documents: int | None = 2,
        chunk_size: int = 256,
        similarity_top_k: int = 3,
        mode: Mode | None = None,
    ) -> HomerRouterQueryEngine:
        """HOMER over ``documents`` whole (in ``mode``, see ``HomerQueryEngine``), and BM25 over chunks
        of ``chunk_size`` model tokens."""
        llm = llm if llm is not None else HomerLLM()
        homer = HomerQueryEngine(documents, llm, streaming=streaming, max_documents=max_documents, mode=mode)
        nodes = chunk_nodes(documents, llm, chunk_size)
        retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=similarity_top_k)

        def retrieval(instruction: str | None) -> BaseQueryEngine:
            return bm25_query_engine(documents, llm, instruction=instruction, streaming=streaming, retriever=retriever)

        return cls(homer, retrieval(None), llm, strategy=strategy, selector=selector, instructed_retrieval=retrieval)

    def _engine_for(self, route: Route, instruction: str | None) -> BaseQueryEngine:
        engine = self._query_engines[HomerRouteSelector.index_of(self._metadatas, route)]
        if route != "retrieval" or instruction is None or self._instructed is None:
            return engine
        with self._lock:
            if instruction not in self._instructed_engines:
                self._instructed_engines[instruction] = self._instructed(instruction)
            return self._instructed_engines[instruction]

    def _annotate(self, response: RESPONSE_TYPE, decision: RouteDecision) -> RESPONSE_TYPE:
        selection = SingleSelection(
            index=HomerRouteSelector.index_of(self._metadatas, decision.route), reason=decision.reason
        )
        response.metadata = {
            **(response.metadata or {}),
            **decision.metadata(),
            "selector_result": SelectorResult(selections=[selection]),
        }
        return response

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        query_text(query_bundle)
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            strategy = _SelectorStrategy(self._selector, self._metadatas)

            def answer(route: Route, instruction: str | None) -> RESPONSE_TYPE:
                return self._engine_for(route, instruction).query(query_bundle)

            text_of: Callable[[Any], str] = _response_text if strategy.reviews else (lambda _: "")
            response, decision = route_answer(strategy, query_bundle.query_str, answer, text_of)
            self._annotate(response, decision)
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        query_text(query_bundle)
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as event:
            strategy = _SelectorStrategy(self._selector, self._metadatas)

            async def answer(route: Route, instruction: str | None) -> RESPONSE_TYPE:
                response = await self._engine_for(route, instruction).aquery(query_bundle)
                if strategy.reviews and isinstance(response, AsyncStreamingResponse):
                    await response.get_response()
                return response

            text_of: Callable[[Any], str] = _response_text if strategy.reviews else (lambda _: "")
            response, decision = await aroute_answer(strategy, query_bundle.query_str, answer, text_of)
            self._annotate(response, decision)
            event.on_end(payload={EventPayload.RESPONSE: response})
        return response
