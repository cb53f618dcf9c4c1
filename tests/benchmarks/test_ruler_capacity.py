"""The niah_multikey_2 capacity bound: needles' key and value tokens, and how many fit a budget."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "research"))  # it puts benchmarks/ on the path itself
import ruler_capacity


def test_the_cheapest_needles_fill_the_budget_first() -> None:
    assert ruler_capacity.fit([5, 1, 3, 2], 6) == 3
    assert ruler_capacity.fit([5, 1, 3, 2], 0) == 0
    assert ruler_capacity.fit([5, 1, 3, 2], 11) == 4


def test_a_needle_costs_its_key_and_value_tokens_and_nothing_of_its_template(tokenizer) -> None:
    document = (
        "One of the special magic numbers for callous-share is: 2915369.\n"
        "Some essay text that is not a needle.\n"
        "One of the special magic numbers for wee-sourwood is: 7443916.\n"
    )
    costs = ruler_capacity.needle_costs(document, tokenizer)
    expected = [
        len(tokenizer(" callous-share", add_special_tokens=False)["input_ids"])
        + len(tokenizer(" 2915369", add_special_tokens=False)["input_ids"]),
        len(tokenizer(" wee-sourwood", add_special_tokens=False)["input_ids"])
        + len(tokenizer(" 7443916", add_special_tokens=False)["input_ids"]),
    ]
    assert costs == expected
    assert all(c < len(tokenizer(document, add_special_tokens=False)["input_ids"]) / 3 for c in costs)
