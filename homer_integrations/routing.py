"""Per-query routing between HOMER (the whole document) and retrieval (the best chunks).

One implementation for every adapter. A strategy ``decide``\\ s a route for a question; after
the first answer it may ``review`` the decision and ask for the other route. ``route_answer``
(and ``aroute_answer``) run that protocol over an adapter's own ``answer(route, instruction)``
callable, so adapters only say how to answer on each route.

Strategies:

- ``rules`` (``RulesStrategy``): regular expressions, first match wins. By default questions
  about the document as a whole (summaries, main themes, the whole book, throughout, comparing
  chapters, how something changes, ...) go to HOMER and everything else to retrieval. Pass
  your own ``homer_patterns`` / ``retrieval_patterns`` and ``default``; e.g. the reverse
  default, ``RulesStrategy(homer_patterns=(), retrieval_patterns=[r"\\bquote\\b"], default="homer")``,
  sends everything to HOMER except what the retrieval patterns catch.
- ``self_route`` (``SelfRouteStrategy``), after Li et al. 2024, "Retrieval Augmented
  Generation or Long-Context LLMs? A Comprehensive Study and Hybrid Approach": retrieval
  first, with an instruction to reply a fixed word ("unanswerable") when the excerpts cannot
  answer; when the model says so (or refuses in other common words), fall back to HOMER.
- any callable ``(question) -> route`` or ``(route, reason)`` (``CallableStrategy``).

Every answer comes with a ``RouteDecision`` (route, reason, strategy) for the output metadata.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

Route = Literal["homer", "retrieval"]
ROUTES: tuple[Route, ...] = get_args(Route)

T = TypeVar("T")


@dataclass(frozen=True)
class RouteDecision:
    """Where a question went and why."""

    route: Route
    reason: str
    strategy: str

    def metadata(self) -> dict[str, str]:
        """``route``, ``route_reason`` and ``route_strategy`` for an answer's metadata."""
        return {"route": self.route, "route_reason": self.reason, "route_strategy": self.strategy}


class RoutingStrategy:
    """Base of the strategies: ``decide`` before answering, optionally ``review`` after."""

    name: str = "strategy"
    retrieval_instruction: str | None = None
    """Closes the retrieval prompt instead of the default rule (self-route's "write unanswerable")."""

    def decide(self, question: str) -> RouteDecision:
        raise NotImplementedError

    def review(self, decision: RouteDecision, answer: str) -> RouteDecision | None:
        """Given the answer on ``decision.route``, the final decision (None: keep ``decision``)."""
        return None


# ------------------------------------------------------------------------------------- rules
DEFAULT_HOMER_PATTERNS: tuple[str, ...] = (
    r"\bsummar(y|ies|i[sz]e|i[sz]ing)\b",
    r"\boverall\b",
    r"\bmain (theme|idea|point|character|argument|topic|plot|message|conflict|event)s?\b",
    r"\bthemes?\b",
    r"\b(whole|entire|full) (book|document|text|story|novel|report|contract|paper|manual|article)\b",
    r"\bthroughout\b",
    r"\b(across|in) (all|every|each) (the )?(chapter|section|part)s?\b",
    r"\bcompar(e|ing|ison)\b.*\b(chapter|section|part|beginning|end)s?\b",
    r"\bhow does .+ (change|develop|evolve|grow)\b",
    r"\b(character )?(arc|development)\b",
    r"\b(tl;?dr|gist|outline|big picture|in general)\b",
    r"\bwhat is (this|the) (book|document|text|story|novel|report|paper) about\b",
    r"\b(list|name) (all|every)\b",
    r"\bhow many times\b",
    # chosen on the tuning split of the bundled whole-document and lookup question sets (issue 81):
    # order, a course from one point to another, the end of the book, comparisons, multi-part questions
    r"\bin (the |what |their |its )?(order|sequence)\b",
    r"\bput .*\bin (order|sequence)\b",
    r"\bfirst\b.*\bsecond\b.*\b(last|third)\b",
    r"\b(over|throughout|across|during|in) the (course of the |whole |entire )?"
    r"(novel|book|story|document|text|report|contract|manual)\b",
    r"\bin the course of\b",
    r"\bfrom (the |his |her |their |its )?(time|evening|day|moment|start|beginning|first|opening|arrival|outset)\b"
    r".*\b(to|until|till)\b",
    r"\b(until|to|by|at|up to|near) the (very )?(end|close|last chapter|final chapter|closing|finish)\b",
    r"\bthe (book|novel|story|document)'s (end|close|closing)\b",
    r"\bby the (end|last|final)\b",
    r"\b(last|final|early|earlier|later|opening|closing) chapters?\b",
    r"\bhow does .+ (change|develop|evolve|grow|unfold|end|turn out|progress)\b",
    r"\bwhat (becomes of|happens to)\b",
    r"\b(trace|describe|add up|altogether|counting)\b",
    r"\b(compar(e|ed|es|ing|ison)|contrast)\b",
    r"\b(who|whom|what|which|how|where|when|why)\b[^?]*,\s*(and\s+)?(who|whom|what|which|how|where|when|why)"
    r"(\s+\w+){0,2}\s+(is|was|are|were|does|did|do|has|had|happens|happened)\b",
)
"""Whole-document questions: these go to HOMER by default. On the bundled question sets' held-out split the
rules catch 37 of 43 whole-document questions and 2 of 126 lookups (tuning: 42 of 45 and none of 63)."""


class RulesStrategy(RoutingStrategy):
    """Regex rules, first match wins: ``homer_patterns`` first, then ``retrieval_patterns``;
    no match gives ``default``. Patterns match case-insensitively."""

    name = "rules"

    def __init__(
        self,
        homer_patterns: Iterable[str] | None = None,
        retrieval_patterns: Iterable[str] = (),
        default: Route = "retrieval",
    ) -> None:
        if default not in ROUTES:
            raise ValueError(f"default route must be one of {ROUTES}, not {default!r}")
        patterns = DEFAULT_HOMER_PATTERNS if homer_patterns is None else tuple(homer_patterns)
        self.rules: list[tuple[re.Pattern[str], Route]] = [(re.compile(p, re.IGNORECASE), "homer") for p in patterns]
        self.rules += [(re.compile(p, re.IGNORECASE), "retrieval") for p in retrieval_patterns]
        self.default: Route = default

    def decide(self, question: str) -> RouteDecision:
        for pattern, route in self.rules:
            match = pattern.search(question)
            if match:
                return RouteDecision(route, f"matched {match.group(0)!r} (a {route} rule)", self.name)
        return RouteDecision(self.default, f"no rule matched; default route {self.default}", self.name)


# ------------------------------------------------------------------------------------- self-route
UNANSWERABLE = "unanswerable"

DEFAULT_REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\b(cannot|can't|can ?not|unable to|could not|couldn't) (be )?(answer|determine|find|tell|say)",
    r"\b(is|are|was|were) not (mentioned|provided|stated|given|specified|included)\b",
    r"\bno (information|mention|details?)\b",
    r"\b(does|do|did)(n't| not) (say|mention|provide|contain|specify|include|state|answer)\b",
    r"\bnot enough (information|context)\b",
)
"""Other ways a model says the excerpts cannot answer (the fixed word always counts)."""


class SelfRouteStrategy(RoutingStrategy):
    """Retrieval first; when the model declares the excerpts insufficient, HOMER over the whole document."""

    name = "self_route"

    def __init__(self, token: str = UNANSWERABLE, refusal_patterns: Iterable[str] | None = None) -> None:
        self.token = token
        self.retrieval_instruction = (
            f'If the text does not answer the question, write "{token}". Otherwise answer in a few words.'
        )
        patterns = DEFAULT_REFUSAL_PATTERNS if refusal_patterns is None else tuple(refusal_patterns)
        self._refusals = [re.compile(re.escape(token), re.IGNORECASE)]
        self._refusals += [re.compile(p, re.IGNORECASE) for p in patterns]

    def decide(self, question: str) -> RouteDecision:
        return RouteDecision("retrieval", "self-route: try the retrieved excerpts first", self.name)

    def is_unanswerable(self, answer: str) -> bool:
        """Whether ``answer`` says the retrieved excerpts cannot answer (an empty answer does too)."""
        text = answer.strip()
        return not text or any(p.search(text) for p in self._refusals)

    def review(self, decision: RouteDecision, answer: str) -> RouteDecision | None:
        if decision.route != "retrieval":
            return None
        if self.is_unanswerable(answer):
            said = " ".join(answer.split())[:80]
            return RouteDecision("homer", f"retrieved excerpts could not answer (model said {said!r})", self.name)
        return RouteDecision("retrieval", "answered from the retrieved excerpts", self.name)


# ------------------------------------------------------------------------------------- callables
RouteFunction = Callable[[str], Route | tuple[Route, str] | RouteDecision]


class CallableStrategy(RoutingStrategy):
    """A user function ``question -> route`` or ``(route, reason)`` (or a ``RouteDecision``)."""

    def __init__(self, function: RouteFunction, name: str | None = None) -> None:
        self.function = function
        self.name = name or getattr(function, "__name__", None) or "callable"

    def decide(self, question: str) -> RouteDecision:
        out = self.function(question)
        if isinstance(out, RouteDecision):
            return out
        route, reason = out if isinstance(out, tuple) else (out, f"chosen by {self.name}")
        if route not in ROUTES:
            raise ValueError(f"routing function {self.name} returned {route!r}; expected one of {ROUTES}")
        return RouteDecision(route, reason, self.name)


StrategyLike = Literal["rules", "self_route"] | RoutingStrategy | RouteFunction


def make_strategy(strategy: StrategyLike) -> RoutingStrategy:
    """A strategy from its name (``rules``, ``self_route``), an instance, or a function."""
    if isinstance(strategy, RoutingStrategy):
        return strategy
    if strategy == "rules":
        return RulesStrategy()
    if strategy == "self_route":
        return SelfRouteStrategy()
    if callable(strategy):
        return CallableStrategy(strategy)
    raise ValueError(f"unknown routing strategy {strategy!r}: use 'rules', 'self_route', a strategy or a function")


# ------------------------------------------------------------------------------------- running
def route_answer(
    strategy: RoutingStrategy,
    question: str,
    answer: Callable[[Route, str | None], T],
    text_of: Callable[[T], str] = str,
) -> tuple[T, RouteDecision]:
    """Decide, answer on that route, let the strategy review, and answer again if it switches.

    ``answer(route, instruction)`` answers ``question`` on ``route``; ``instruction`` is the
    strategy's retrieval instruction on the retrieval route, else None.
    """
    decision = strategy.decide(question)
    result = answer(decision.route, _instruction(strategy, decision.route))
    final = strategy.review(decision, text_of(result)) or decision
    if final.route != decision.route:
        result = answer(final.route, _instruction(strategy, final.route))
    return result, final


async def aroute_answer(
    strategy: RoutingStrategy,
    question: str,
    answer: Callable[[Route, str | None], Awaitable[T]],
    text_of: Callable[[T], str] = str,
) -> tuple[T, RouteDecision]:
    """``route_answer`` with an async ``answer``."""
    decision = strategy.decide(question)
    result = await answer(decision.route, _instruction(strategy, decision.route))
    final = strategy.review(decision, text_of(result)) or decision
    if final.route != decision.route:
        result = await answer(final.route, _instruction(strategy, final.route))
    return result, final


def _instruction(strategy: RoutingStrategy, route: Route) -> str | None:
    return strategy.retrieval_instruction if route == "retrieval" else None


# ------------------------------------------------------------------- the retrieval route's prompt
DEFAULT_RETRIEVAL_INSTRUCTION = "Answer in a few words, using only the text."


def retrieval_prompt(question: str, passages: Sequence[str], instruction: str | None = None) -> str:
    """The user message that answers ``question`` from retrieved ``passages`` only.

    ``instruction`` closes the prompt instead of ``DEFAULT_RETRIEVAL_INSTRUCTION`` (self-route
    puts its "write unanswerable" rule there). The layout (text, question, one closing rule)
    is the one small instruct models followed best in a trial on SmolLM2-135M.
    """
    text = "\n\n".join(p.strip() for p in passages) if passages else "(nothing relevant was found)"
    return f"Text:\n{text}\n\nQuestion: {question}\n{instruction or DEFAULT_RETRIEVAL_INSTRUCTION}"
