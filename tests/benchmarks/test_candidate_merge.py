"""The candidate-merge ablation: question attention narrows BM25's larger candidate set to the budget."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from candidate_merge import CandidateMerge

from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import PassageReplay, Recipe
from tests.conftest import mode_engine

QUESTION = "Who walked to Meryton with the sisters?"


def test_merge_keeps_the_budget_from_the_candidates_only(tokenizer, calibration, novel) -> None:
    book = novel[20_000:32_000]
    selection = PassageSelection(tokens=24, overlap=8)
    replay = PassageReplay(selection, ReadBudget(seconds=0, least=None))
    engine = mode_engine(tokenizer, calibration)
    engine.tiers.recipe = Recipe(replay=CandidateMerge(candidates=600, passages=replay), calibration_segments=2)
    doc = engine.compress(book, question=QUESTION, mode="query_aware")
    kept = doc.origin[doc.origin >= 0]
    budget = engine.config.final_cache_len
    passages = selection.passages(tokenizer, encode(tokenizer, book), unit_ids(tokenizer, book, "statement"))
    pool = selection.select(QUESTION, None, passages, 600)
    assert pool.numel() > budget, "the candidates outnumber the budget, so attention has to choose"
    assert bool(torch.isin(kept, pool).all()), "every kept token is a BM25 candidate"
    assert kept.numel() <= budget < pool.numel()
    assert bool((kept[1:] > kept[:-1]).all()), "re-read in document order, each token once"
