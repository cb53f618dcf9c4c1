"""ReadBudget: what a question re-reads past the window grows with the machine, within its bounds."""

from __future__ import annotations

import pytest
import torch

from homer_integrations.homer.reading.budget import ReadBudget, matmul_flops, read_rate
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


def test_the_read_rate_is_the_machine_s_flops_over_two_per_weight() -> None:
    model = tiny_model("qwen2", vocab_size=256)
    layers = model.model.layers
    weights = sum(p.numel() for p in layers.parameters())
    flops = matmul_flops(torch.float32, "cpu")
    assert flops > 1e8, "any CPU multiplies faster than 0.1 GFLOP/s"
    assert read_rate(layers, torch.float32, torch.device("cpu")) == pytest.approx(flops / (2 * weights))
