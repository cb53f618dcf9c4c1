"""``HomerRouteSelector``: a LlamaIndex selector over the shared routing strategies.

The strategies (``rules``, ``self_route``, a user callable) live in ``homer_integrations.routing``
and serve the LangChain router too; this class only maps a ``RouteDecision`` onto LlamaIndex's
choices, found by tool name (``homer``, ``retrieval``).
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.schema import QueryBundle
from llama_index.core.tools.types import ToolMetadata

from homer_integrations.routing import ROUTES, Route, RouteDecision, RoutingStrategy, StrategyLike, make_strategy


class HomerRouteSelector(BaseSelector):
    """Picks the ``homer`` or the ``retrieval`` choice with a routing strategy; never calls an LLM.

    Args:
        strategy: ``"rules"``, ``"self_route"``, a ``RoutingStrategy`` or a function
            ``question -> route | (route, reason)``.

    In a stock ``RouterQueryEngine`` this gives the strategy's first decision; self-route's
    review (fall back to HOMER when retrieval cannot answer) needs ``HomerRouterQueryEngine``.
    """

    def __init__(self, strategy: StrategyLike = "rules") -> None:
        self.strategy: RoutingStrategy = make_strategy(strategy)

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        """No prompts: the strategies are rules and functions."""

    @staticmethod
    def index_of(choices: Sequence[ToolMetadata], route: Route) -> int:
        """The position of the choice named ``route``."""
        for i, choice in enumerate(choices):
            if choice.name == route:
                return i
        names = [c.name for c in choices]
        raise ValueError(f"no choice named {route!r} among {names}: name the tools {ROUTES}")

    def decide(self, question: str) -> RouteDecision:
        return self.strategy.decide(question)

    def _select(self, choices: Sequence[ToolMetadata], query: QueryBundle) -> SelectorResult:
        decision = self.decide(query.query_str)
        return SelectorResult(
            selections=[SingleSelection(index=self.index_of(choices, decision.route), reason=decision.reason)]
        )

    async def _aselect(self, choices: Sequence[ToolMetadata], query: QueryBundle) -> SelectorResult:
        return self._select(choices, query)
