"""``Scoring``: the package's recipe, unit order, and the engine's use of it."""

import pytest
import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.homer.scoring.chain import RECONSTRUCTION_UNITS, REPEAT_PROMPT, Scoring
from homer_integrations.homer.scoring.scorers import LastTokenScorer, RandomScorer
from homer_integrations.homer.scoring.units import MaxPool, ScoreMemory, SentenceBonus, WordUnits
from tests.conftest import tiny_model
from tests.homer.scoring.test_units import chunk


def test_the_package_recipe_and_the_papers():
    assert Scoring.default() == Scoring(LastTokenScorer(), (MaxPool(3), WordUnits(), ScoreMemory()))
    assert Scoring() == Scoring(LastTokenScorer(calibrated=True), ()), "the paper's: no units"
    assert Scoring.default().unit == "word" and Scoring().unit == "token"
    assert Scoring().needs_calibration and not Scoring(RandomScorer()).needs_calibration


def test_units_apply_in_order():
    scores = torch.tensor([0.0, 5.0, 0.0, 0.0, 1.0, 0.0])
    node = chunk([True] * 6)
    words = torch.tensor([0, 0, 1, 1, 2, 2])
    # pooling first spreads 5 to token 2, then word units spread it to token 3
    assert Scoring(units=(MaxPool(3), WordUnits())).rank(scores, node, words).tolist() == [5, 5, 5, 5, 1, 1]
    # word units first keep 5 inside word 0, then pooling reaches token 2 only
    assert Scoring(units=(WordUnits(), MaxPool(3))).rank(scores, node, words).tolist() == [5, 5, 5, 1, 1, 1]
    assert Scoring(units=(WordUnits(), MaxPool(3))).without(MaxPool).units == (WordUnits(),)


def test_engine_scoring_skips_calibration_and_enters_the_cache_key(tokenizer, tmp_path):
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    model = tiny_model("llama")
    random = HomerModel(
        model,
        tokenizer,
        config,
        calibration_dir=tmp_path,
        progress=False,
        recipe=Recipe(scoring=Scoring(RandomScorer())),
    )
    assert random.tiers.calibration.bias() is None and not list(tmp_path.iterdir()), "no calibration computed"
    seeded = Recipe(scoring=Scoring(RandomScorer(seed=1)))
    other = HomerModel(model, tokenizer, config, calibration_dir=tmp_path, progress=False, recipe=seeded)
    assert random.tiers.keys.root("p", "doc", "s") != other.tiers.keys.root("p", "doc", "s")
    doc = random.compress("word " * 400, question="", mode="query_aware")
    assert doc.stats.cache_tokens <= 128 and doc.stats.document_tokens > 128


def test_one_split_per_scoring_and_the_reconstruction_roots_units(tokenizer):
    with pytest.raises(ValueError, match="more than one way"):
        Scoring(units=(WordUnits("word"), SentenceBonus()))
    recipe = Scoring.default()
    root = recipe.with_reconstruction(encode(tokenizer, REPEAT_PROMPT))
    assert root.units == RECONSTRUCTION_UNITS and root.unit == "sentence"
    engine = HomerModel(tiny_model("llama"), tokenizer, HomerConfig(max_chunk_len=128, warmup_layers=3), progress=False)
    assert engine.tiers.scoring == root, "shared roots: reconstruction and sentence units"
    assert engine.tiers.question_scoring == Scoring.for_questions(), "questions: question attention"
    assert engine.tiers.question_scoring.unit == "statement", "a key and its value rank as one unit"
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    given = HomerModel(tiny_model("llama"), tokenizer, config, recipe=Recipe(scoring=recipe))
    assert given.tiers.question_scoring == recipe.with_question(), "a given recipe keeps its units for questions"
    both = Recipe(scoring=recipe, question_scoring=Scoring.for_questions())
    last_token = HomerModel(tiny_model("llama"), tokenizer, config, recipe=both)
    assert last_token.tiers.scoring == recipe and last_token.tiers.question_scoring == Scoring.for_questions()
