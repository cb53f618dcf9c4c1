"""``HomerRouter`` on the embedded model: both routes of every strategy (rules, self_route, a callable).

One excerpt of the novel (about 2,000 tokens) serves every test, so the HOMER route compresses
it once for the module and later HOMER answers read the cache.
"""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage

from homer_integrations.langchain import ChatHomer, HomerRouter
from homer_integrations.routing import RouteDecision, RulesStrategy


@pytest.fixture(scope="module")
def book(novel_excerpt) -> str:
    return novel_excerpt(2000)


@pytest.fixture(scope="module")
def chat(smol_engine) -> ChatHomer:
    return ChatHomer(engine=smol_engine, max_tokens=12)


def check(message: AIMessage, route: str, strategy: str) -> None:
    meta = message.response_metadata
    assert (meta["route"], meta["route_strategy"]) == (route, strategy)
    assert meta["route_reason"]
    assert message.text.strip()
    if route == "homer":
        assert meta["homer"]["cache_source"] in ("computed", "memory", "disk")
        assert meta["homer"]["document_tokens"] > 1500
        assert "retrieved_chunks" not in meta
    else:
        assert meta["homer"]["cache_source"] is None and meta["homer"]["document_found_by"] == "plain"
        assert meta["retrieved_chunks"]


def test_rules_send_whole_document_questions_to_homer_and_others_to_retrieval(chat, book):
    router = HomerRouter(chat, book, "rules")
    summary = router.invoke("Summarize the story so far.")
    check(summary, "homer", "rules")
    assert "Summarize" in summary.response_metadata["route_reason"]
    lookup = router.invoke({"question": "Who is Lady Lucas?"})
    check(lookup, "retrieval", "rules")
    assert "no rule matched" in lookup.response_metadata["route_reason"]


def test_rules_with_the_reverse_default(chat, book):
    strategy = RulesStrategy(homer_patterns=(), retrieval_patterns=[r"\bquote\b"], default="homer")
    router = HomerRouter(chat, [Document(page_content=book)], strategy)
    check(router.invoke("Quote what Mrs. Bennet says about Netherfield."), "retrieval", "rules")
    check(router.invoke("Who is Lady Lucas?"), "homer", "rules")


def test_self_route_keeps_answered_questions_on_retrieval(chat, book):
    message = HomerRouter(chat, book, "self_route").invoke("Who is Lady Lucas?")
    check(message, "retrieval", "self_route")
    assert message.response_metadata["route_reason"] == "answered from the retrieved excerpts"


def test_self_route_falls_back_to_homer_when_the_model_says_unanswerable(chat, book):
    message = HomerRouter(chat, book, "self_route").invoke("Who won the football match?")
    check(message, "homer", "self_route")
    assert "could not answer" in message.response_metadata["route_reason"]


async def test_a_callable_strategy_picks_each_route_and_gives_its_reason(chat, book):
    def by_keyword(question: str) -> tuple[str, str] | str:
        return ("homer", "asks about the whole book") if "whole" in question else "retrieval"

    router = HomerRouter(chat, book, by_keyword)
    whole, part = await router.abatch(["What happens in the whole book?", "Who is Lady Lucas?"])
    check(whole, "homer", "by_keyword")
    assert whole.response_metadata["route_reason"] == "asks about the whole book"
    check(part, "retrieval", "by_keyword")
    assert part.response_metadata["route_reason"] == "chosen by by_keyword"


def test_route_decisions_come_from_the_shared_strategies(chat, book):
    router = HomerRouter(chat, book, lambda q: RouteDecision("homer", "always", "mine"))
    assert router.strategy.decide("x") == RouteDecision("homer", "always", "mine")
    with pytest.raises(ValueError, match="question"):
        router.invoke({"text": "no question key"})
