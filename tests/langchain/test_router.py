"""``HomerRouter``: both routes of every strategy (rules, self_route, a callable).

One excerpt of the novel (about 2,000 tokens) serves every test. Routing by rules or by a function
is plumbing, so those tests run on ``chat``, a tiny random-weight Llama with the real SmolLM2
tokenizer at SmolLM2's ``max_chunk_len``: its HOMER route compresses the excerpt (two leaves and a
root) once for the module and later HOMER answers read the cache. ``self_route`` routes by what
the model answers, so its tests run on SmolLM2 (``smol_chat``), with the paper's merge-tree root
(``TreeRoot``, a third of the default head-wise root's time): the root is not what they test.
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
def book_tokens(smol_engine, book) -> int:
    return smol_engine.prompting.count_tokens(book)


@pytest.fixture(scope="module")
def chat(tokenizer, calibration) -> ChatHomer:
    """A tiny random-weight model (arbitrary but deterministic answers) at SmolLM2's ``max_chunk_len``
    (1024: the excerpt is two leaves and a root; a shorter chunk would compress the retrieval route's
    plain prompt of three excerpts as a document)."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe
    from tests.conftest import tiny_model

    config = HomerConfig(max_chunk_len=1024, warmup_layers=3, mode="shared")
    engine = HomerModel(
        tiny_model(),
        tokenizer,
        config,
        model_name="tiny",
        calibration_dir=calibration,
        progress=False,
        recipe=Recipe(calibration_segments=2),
    )
    return ChatHomer(engine=engine, max_tokens=12)


@pytest.fixture(scope="module")
def smol_chat(smol_parts) -> ChatHomer:
    """SmolLM2 (it must say "unanswerable" when it cannot answer) on a fresh engine with the tree root."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.engine.loading import SMOLLM2
    from homer_integrations.homer.config import ModelDefaults
    from homer_integrations.homer.reading.strategies import Recipe, TreeRoot

    model, tokenizer = smol_parts
    defaults = ModelDefaults(max_chunk_len=SMOLLM2.max_chunk_len, warmup_layers=SMOLLM2.warmup_layers)
    engine = HomerModel(
        model,
        tokenizer,
        HomerConfig(mode="shared"),
        model_name=SMOLLM2.name,
        defaults=defaults,
        progress=False,
        recipe=Recipe(shared_root=TreeRoot()),
    )
    return ChatHomer(engine=engine, max_tokens=12)


def check(message: AIMessage, route: str, strategy: str, book_tokens: int) -> None:
    meta = message.response_metadata
    assert (meta["route"], meta["route_strategy"]) == (route, strategy)
    assert meta["route_reason"]
    assert message.text.strip() and message.usage_metadata["output_tokens"] > 0
    if route == "homer":
        assert meta["homer"]["cache_source"] in ("computed", "memory", "disk")
        assert meta["homer"]["document_tokens"] > 0.95 * book_tokens
        assert "retrieved_chunks" not in meta
    else:
        assert meta["homer"]["cache_source"] is None and meta["homer"]["document_found_by"] == "plain"
        assert meta["retrieved_chunks"]


def test_rules_send_whole_document_questions_to_homer_and_others_to_retrieval(chat, book, book_tokens):
    router = HomerRouter(chat, book, "rules")
    summary = router.invoke("Summarize the story so far.")
    check(summary, "homer", "rules", book_tokens)
    assert "Summarize" in summary.response_metadata["route_reason"]
    lookup = router.invoke({"question": "Who is Lady Lucas?"})
    check(lookup, "retrieval", "rules", book_tokens)
    assert "no rule matched" in lookup.response_metadata["route_reason"]


def test_rules_with_the_reverse_default(chat, book, book_tokens):
    strategy = RulesStrategy(homer_patterns=(), retrieval_patterns=[r"\bquote\b"], default="homer")
    router = HomerRouter(chat, [Document(page_content=book)], strategy)
    check(router.invoke("Quote what Mrs. Bennet says about Netherfield."), "retrieval", "rules", book_tokens)
    check(router.invoke("Who is Lady Lucas?"), "homer", "rules", book_tokens)


def test_self_route_keeps_answered_questions_on_retrieval(smol_chat, book, book_tokens):
    message = HomerRouter(smol_chat, book, "self_route").invoke("Who is Lady Lucas?")
    check(message, "retrieval", "self_route", book_tokens)
    assert message.response_metadata["route_reason"] == "answered from the retrieved excerpts"


def test_self_route_falls_back_to_homer_when_the_model_says_unanswerable(smol_chat, book, book_tokens):
    message = HomerRouter(smol_chat, book, "self_route").invoke("Who won the football match?")
    check(message, "homer", "self_route", book_tokens)
    assert "could not answer" in message.response_metadata["route_reason"]


async def test_a_callable_strategy_picks_each_route_and_gives_its_reason(chat, book, book_tokens):
    def by_keyword(question: str) -> tuple[str, str] | str:
        return ("homer", "asks about the whole book") if "whole" in question else "retrieval"

    router = HomerRouter(chat, book, by_keyword)
    whole, part = await router.abatch(["What happens in the whole book?", "Who is Lady Lucas?"])
    check(whole, "homer", "by_keyword", book_tokens)
    assert whole.response_metadata["route_reason"] == "asks about the whole book"
    check(part, "retrieval", "by_keyword", book_tokens)
    assert part.response_metadata["route_reason"] == "chosen by by_keyword"


def test_route_decisions_come_from_the_shared_strategies(chat, book):
    router = HomerRouter(chat, book, lambda q: RouteDecision("homer", "always", "mine"))
    assert router.strategy.decide("x") == RouteDecision("homer", "always", "mine")
    with pytest.raises(ValueError, match="question"):
        router.invoke({"text": "no question key"})
