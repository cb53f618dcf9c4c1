"""ReadBudget: what a question re-reads past the window grows with the machine, within its bounds."""

from __future__ import annotations

import pytest

from homer_integrations.homer.reading.budget import ReadBudget, read_rate
from tests.conftest import tiny_model


def test_the_budget_is_what_the_machine_rereads_in_its_seconds_within_its_least_and_the_window() -> None:
    budget = ReadBudget(seconds=1.0, least=512, share=0.5, step=512)
    assert budget.kept(2048, 32768, 100_000, rate=130.0) == 512, "a slow machine keeps the least"
    assert budget.kept(2048, 32768, 100_000, rate=1_300.0) == 1024, "rounded down to whole steps"
    assert budget.kept(2048, 32768, 100_000, rate=100_000.0) == 16384, "at most half the window"
    assert budget.kept(2048, 32768, 9_000, rate=100_000.0) == 9_000, "never more than the document"
    assert ReadBudget(tokens=3000).kept(2048, 32768, 100_000, rate=0.0) == 3000, "a fixed budget is kept as set"
    assert ReadBudget(seconds=0).kept(2048, 32768, 100_000, rate=1e9) == 512
    assert ReadBudget(seconds=0, least=64).kept(2048, 32768, 100_000, rate=1e9) == 64
    assert ReadBudget(seconds=0, least=None).kept(2048, 32768, 100_000, rate=1e9) == 2048, "the configured floor"
    assert budget.kept(2048, 32768, 100_000, rate=130.0, documents=2) == 2048, "across documents: at least 2,048"
    assert budget.kept(2048, 32768, 100_000, rate=100_000.0, documents=9) == 16384


@pytest.mark.parametrize(
    "bad", [{"tokens": 8}, {"seconds": -1.0}, {"least": 8}, {"across": 8}, {"share": 0.0}, {"share": 1.5}, {"step": 0}]
)
def test_invalid_budgets_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="ReadBudget"):
        ReadBudget(**bad)


def test_the_read_rate_is_measured_once_per_model_through_its_own_layers() -> None:
    import gc
    import math

    from homer_integrations.homer.model.decoder import DecoderStack
    from homer_integrations.homer.reading import budget

    stack = DecoderStack(tiny_model("qwen2", vocab_size=256).eval())
    rate = read_rate(stack, tokens=64)
    assert math.isfinite(rate) and rate > 64, "a tiny model re-reads 64 tokens in well under a second"
    assert read_rate(stack, tokens=64) == rate, "measured once, then kept"
    assert stack in budget._RATES
    del stack
    gc.collect()
    assert not budget._RATES, "kept only while the model lives"
