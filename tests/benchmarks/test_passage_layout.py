"""The passage-layout ablation: the same kept tokens as the package's replay, laid out another way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from passage_layout import INSTRUCTED_FRAME, LaidOutPassages, taken_runs

from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay, Recipe
from tests.conftest import mode_engine

QUESTION = "Who walked to Meryton with the sisters?"


def test_runs_hold_the_selected_tokens_in_either_order(tokenizer, novel) -> None:
    book = novel[20_000:26_000]
    selection = PassageSelection(tokens=24, overlap=8)
    passages = selection.passages(tokenizer, encode(tokenizer, book), unit_ids(tokenizer, book, "statement"))
    kept = selection.select(QUESTION, None, passages, 200)
    by_place = taken_runs(selection, QUESTION, passages, 200, rank=False)
    by_rank = taken_runs(selection, QUESTION, passages, 200, rank=True)
    assert torch.equal(torch.cat(by_place), kept), "document order: the selection's tokens, in order"
    assert all(bool((r[1:] == r[:-1] + 1).all()) for r in by_place), "each run is one stretch"
    assert torch.equal(torch.cat(by_rank).sort().values, kept), "rank order: the same tokens"
    assert not torch.equal(torch.cat(by_rank), kept), "taken best first, not in document order"


@pytest.mark.parametrize(
    "layout",
    [
        dict(separator="\n\n[...]\n\n"),
        dict(rank=True, separator="\n\n"),
        dict(rank=True, last=True, separator="\n\n"),
        dict(question_first="Q: {question}\n"),
        dict(frame=INSTRUCTED_FRAME),
    ],
)
def test_a_layout_rereads_the_same_book_tokens_plus_its_own(tokenizer, calibration, novel, layout) -> None:
    book = novel[20_000:32_000]
    replay = PassageReplay(PassageSelection(tokens=24, overlap=8), ReadBudget(seconds=0, least=None))
    plain = mode_engine(tokenizer, calibration)
    plain.tiers.recipe = Recipe(replay=AutoReplay(replay), calibration_segments=2)
    laid = mode_engine(tokenizer, calibration)
    laid.tiers.recipe = Recipe(replay=LaidOutPassages(passages=replay, **layout), calibration_segments=2)
    reference = plain.compress(book, question=QUESTION, mode="query_aware").origin
    other = laid.compress(book, question=QUESTION, mode="query_aware").origin
    assert torch.equal(reference[reference >= 0].sort().values, other[other >= 0].sort().values)
    assert other.numel() > reference.numel(), "the layout's own tokens (separators, the question) are read too"
    if layout.get("rank"):
        assert not torch.equal(other[other >= 0], reference[reference >= 0])
    if layout.get("last"):
        passages = replay.selection.passages(tokenizer, encode(tokenizer, book), unit_ids(tokenizer, book, "statement"))
        best = taken_runs(replay.selection, QUESTION, passages, 200, rank=True)[0]
        assert torch.equal(other[other >= 0][-best.numel() :], best), "the best passage ends nearest the question"
