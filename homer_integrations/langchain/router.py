"""``HomerRouter``: per question, HOMER over the whole document(s) or BM25 retrieval over chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import patch_config
from langchain_text_splitters import RecursiveCharacterTextSplitter

from homer_integrations.engine.model import HomerModel
from homer_integrations.homer.config import Mode, check_mode, first_mode
from homer_integrations.homer.scoring.lexical import BM25Index, Passage
from homer_integrations.langchain.chat_models import ChatHomer
from homer_integrations.routing import (
    Route,
    RouteDecision,
    StrategyLike,
    aroute_answer,
    make_strategy,
    retrieval_prompt,
    route_answer,
)

RouterInput = str | dict[str, Any]
_QUESTION_KEYS = ("question", "input", "query")


class HomerRouter(Runnable[RouterInput, AIMessage]):
    """Answers each question through HOMER over the whole document(s) or through retrieval.

    HOMER route: the question with the documents (joined by blank lines) as the explicit
    document of ``model``, compressed once and cached. Retrieval route: the ``k`` best BM25
    chunks (``RecursiveCharacterTextSplitter`` chunks of each document) in a short plain prompt
    to the same model. ``strategy`` is ``"rules"``, ``"self_route"``, a
    ``homer_integrations.routing.RoutingStrategy`` or a function ``question -> route`` /
    ``(route, reason)``; see ``homer_integrations.routing``.

    ``mode`` is the HOMER mode of the model's calls (None: the model's own); a call's
    ``invoke(..., mode=...)`` (or ``bind(mode=...)``) replaces it, and the mode that served is in
    ``response_metadata["homer"]["mode"]`` (None on the retrieval route's plain prompt).

    Input: a question, or a dict with ``question`` (or ``input`` / ``query``). Output: the
    model's ``AIMessage`` with ``route``, ``route_reason`` and ``route_strategy`` added to its
    ``response_metadata`` (and ``retrieved_chunks``, the chunk indices, on the retrieval route).
    """

    def __init__(
        self,
        model: ChatHomer | HomerModel,
        documents: str | Document | Sequence[str | Document],
        strategy: StrategyLike = "rules",
        *,
        k: int = 3,
        chunk_size: int = 800,
        chunk_overlap: int = 100,
        mode: Mode | None = None,
    ) -> None:
        self.model = model if isinstance(model, ChatHomer) else ChatHomer(engine=model)
        self.mode = check_mode(mode)
        items = [documents] if isinstance(documents, str | Document) else list(documents)
        texts = [d.page_content if isinstance(d, Document) else d for d in items]
        if not texts or not any(t.strip() for t in texts):
            raise ValueError("HomerRouter needs at least one non-empty document")
        self.document = "\n\n".join(t.strip() for t in texts if t.strip())
        self.strategy = make_strategy(strategy)
        self.k = k
        splitter = RecursiveCharacterTextSplitter(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        self.index = BM25Index([chunk for t in texts for chunk in splitter.split_text(t)])

    @staticmethod
    def question_of(value: RouterInput) -> str:
        if isinstance(value, str):
            return value
        for key in _QUESTION_KEYS:
            if isinstance(value.get(key), str):
                return value[key]
        raise ValueError(f"HomerRouter input must be a question or a dict with one of {_QUESTION_KEYS}")

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The model's call options from a router call's kwargs: ``mode`` (the call's, else the router's)."""
        mode = first_mode(kwargs.get("mode"), self.mode)
        return {} if mode is None else {"mode": mode}

    def _request(self, route: Route, question: str, instruction: str | None) -> tuple[list, dict, list[Passage]]:
        if route == "homer":
            return [HumanMessage(question)], {"document": self.document}, []
        passages = self.index.search(question, self.k)
        prompt = retrieval_prompt(question, [p.text for p in passages], instruction)
        return [HumanMessage(prompt)], {}, passages

    @staticmethod
    def _finish(message: AIMessage, decision: RouteDecision, passages: list[Passage]) -> AIMessage:
        meta = {**message.response_metadata, **decision.metadata()}
        if decision.route == "retrieval":
            meta["retrieved_chunks"] = [p.index for p in passages]
        return message.model_copy(update={"response_metadata": meta})

    def _route(
        self,
        value: RouterInput,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        options: dict[str, Any] | None = None,
    ) -> AIMessage:
        question = self.question_of(value)
        used: dict[Route, list[Passage]] = {}

        def answer(route: Route, instruction: str | None) -> AIMessage:
            messages, kwargs, used[route] = self._request(route, question, instruction)
            child = patch_config(config, callbacks=run_manager.get_child(route))
            return self.model.invoke(messages, child, **kwargs, **(options or {}))

        message, decision = route_answer(self.strategy, question, answer, lambda m: m.text)
        return self._finish(message, decision, used.get(decision.route, []))

    async def _aroute(
        self,
        value: RouterInput,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        options: dict[str, Any] | None = None,
    ) -> AIMessage:
        question = self.question_of(value)
        used: dict[Route, list[Passage]] = {}

        async def answer(route: Route, instruction: str | None) -> AIMessage:
            messages, kwargs, used[route] = self._request(route, question, instruction)
            child = patch_config(config, callbacks=run_manager.get_child(route))
            return await self.model.ainvoke(messages, child, **kwargs, **(options or {}))

        message, decision = await aroute_answer(self.strategy, question, answer, lambda m: m.text)
        return self._finish(message, decision, used.get(decision.route, []))

    def invoke(self, input: RouterInput, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        options = self._options(kwargs)
        return self._call_with_config(self._route, input, config, run_type="chain", options=options)

    async def ainvoke(self, input: RouterInput, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        options = self._options(kwargs)
        return await self._acall_with_config(self._aroute, input, config, run_type="chain", options=options)
