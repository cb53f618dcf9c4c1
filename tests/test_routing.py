"""The shared routing strategies, the routing protocol and BM25 retrieval (no model needed)."""

from __future__ import annotations

import pytest

from homer_integrations.homer.scoring.lexical import BM25Index
from homer_integrations.routing import (
    DEFAULT_RETRIEVAL_INSTRUCTION,
    CallableStrategy,
    RouteDecision,
    RulesStrategy,
    SelfRouteStrategy,
    aroute_answer,
    make_strategy,
    retrieval_prompt,
    route_answer,
)


@pytest.mark.parametrize(
    "question",
    [
        "Summarize the book.",
        "What are the main themes?",
        "Give me an overview of the whole document.",
        "How does Elizabeth's opinion of Darcy change throughout the novel?",
        "Compare the first and the last chapters.",
        "What is this book about?",
        "List all the characters.",
    ],
)
def test_default_rules_send_whole_document_questions_to_homer(question):
    decision = RulesStrategy().decide(question)
    assert decision.route == "homer" and decision.strategy == "rules" and "matched" in decision.reason


@pytest.mark.parametrize("question", ["Who is Mr. Collins?", "When did the ball take place?", "What is Netherfield?"])
def test_default_rules_send_lookups_to_retrieval(question):
    assert RulesStrategy().decide(question) == RouteDecision(
        "retrieval", "no rule matched; default route retrieval", "rules"
    )


def test_reverse_default_rules():
    rules = RulesStrategy(homer_patterns=(), retrieval_patterns=[r"\bquote\b", r"\bwhich page\b"], default="homer")
    assert rules.decide("Quote the first sentence.").route == "retrieval"
    assert rules.decide("Who is Mr. Collins?").route == "homer"
    with pytest.raises(ValueError, match="default route"):
        RulesStrategy(default="web")  # type: ignore[arg-type]


def test_self_route_reads_the_verdict():
    s = SelfRouteStrategy()
    first = s.decide("Who?")
    assert first.route == "retrieval" and '"unanswerable"' in s.retrieval_instruction
    refusals = ("unanswerable", "The answer is: UNANSWERABLE.", "The text does not mention it.", "I cannot answer", "")
    for said in refusals:
        assert s.review(first, said).route == "homer", said
    assert s.review(first, "Mr. Bingley, a rich young man.") == RouteDecision(
        "retrieval", "answered from the retrieved excerpts", "self_route"
    )
    assert s.review(RouteDecision("homer", "x", "self_route"), "unanswerable") is None


def test_callable_strategies_return_a_route_or_a_route_and_reason():
    def pick(question: str) -> str:
        return "homer" if "book" in question else "retrieval"

    assert CallableStrategy(pick).decide("the book") == RouteDecision("homer", "chosen by pick", "pick")
    assert make_strategy(lambda q: ("retrieval", "short")).decide("q").reason == "short"
    with pytest.raises(ValueError, match="expected one of"):
        make_strategy(lambda q: "web").decide("q")
    with pytest.raises(ValueError, match="unknown routing strategy"):
        make_strategy("nearest")  # type: ignore[arg-type]
    assert isinstance(make_strategy("self_route"), SelfRouteStrategy)


def test_route_answer_runs_the_fallback_with_the_right_instructions():
    calls: list[tuple[str, str | None]] = []

    def answer(route: str, instruction: str | None) -> str:
        calls.append((route, instruction))
        return "unanswerable" if route == "retrieval" else "the whole story"

    strategy = SelfRouteStrategy()
    result, decision = route_answer(strategy, "Who?", answer)
    assert (result, decision.route) == ("the whole story", "homer")
    assert calls == [("retrieval", strategy.retrieval_instruction), ("homer", None)]

    calls.clear()
    result, decision = route_answer(RulesStrategy(), "Who is Mr. Collins?", answer)
    assert calls == [("retrieval", None)] and decision.route == "retrieval"


async def test_aroute_answer_matches_route_answer():
    async def answer(route: str, instruction: str | None) -> str:
        return "Longbourn" if route == "retrieval" else "never"

    result, decision = await aroute_answer(SelfRouteStrategy(), "Where?", answer)
    assert (result, decision.route) == ("Longbourn", "retrieval")
    assert decision.reason == "answered from the retrieved excerpts"


def test_bm25_index_finds_the_best_chunks():
    chunks = [
        "Elizabeth walked three miles to Netherfield through the mud.",
        "Mr. Darcy proposed to Elizabeth at Hunsford and was refused.",
        "The Bennets live at Longbourn, near Meryton.",
    ]
    index = BM25Index(chunks)
    hits = index.search("Where did Darcy propose?", k=2)
    assert [h.index for h in hits] == [1] and hits[0].text == chunks[1] and hits[0].score > 0
    assert index.search("zebra", k=5) == []
    with pytest.raises(ValueError):
        BM25Index([])


def test_retrieval_prompt_layout():
    prompt = retrieval_prompt("Who?", ["  one  ", "two"])
    assert prompt == f"Text:\none\n\ntwo\n\nQuestion: Who?\n{DEFAULT_RETRIEVAL_INSTRUCTION}"
    assert retrieval_prompt("Who?", [], "Say unanswerable.").endswith("Question: Who?\nSay unanswerable.")


def test_the_default_rules_tell_whole_document_questions_from_lookups_on_held_out_questions() -> None:
    """The rules were chosen on the tuning split of the bundled sets; on the held-out split they still send
    most whole-document questions (lists, counts, order, a course, comparisons) to HOMER and few lookups."""
    from homer_integrations.question_sets import question_set, whole_question_set

    rules = RulesStrategy()
    books = ("northangerabbey", "prideprejudice")
    whole = [q for b in books for q in whole_question_set(b).questions if q.split == "heldout"]
    lookups = [q for b in books for q in question_set(f"{b}_book").questions if q.split == "heldout"]
    to_homer = [rules.decide(q.question).route == "homer" for q in whole]
    misrouted = [rules.decide(q.question).route == "homer" for q in lookups]
    assert len(whole) >= 40 and len(lookups) >= 100
    assert sum(to_homer) / len(whole) >= 0.8
    assert sum(misrouted) / len(lookups) <= 0.05
