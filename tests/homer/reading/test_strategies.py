"""``homer.reading.strategies``: the research switches left ``HomerConfig`` for ``Recipe`` units, and what keys them."""

from dataclasses import replace

import pytest
from pydantic import ValidationError

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.config import REMOVED_FIELDS
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import (
    REPLAYS,
    SHARED_ROOTS,
    AutoReplay,
    AutoRoot,
    FlatReplay,
    PassageReplay,
    Recipe,
    TreeRoot,
    WindowRoot,
)
from homer_integrations.homer.scoring.chain import Scoring
from tests.conftest import tiny_model

CFG = HomerConfig(max_chunk_len=128, warmup_layers=3)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def keys(model, tokenizer, recipe: Recipe) -> tuple[str, str]:
    """The root and leaf-tier keys of one probe document under ``recipe``."""
    engine = HomerModel(model, tokenizer, CFG, progress=False, recipe=recipe)
    return engine.tiers.keys.root("p", "doc", "s"), engine.tiers.keys.tier("p", "doc")


@pytest.mark.parametrize(
    ("field", "value", "replacement"),
    [
        ("replay", "flat", "Recipe(replay=FlatReplay())"),
        ("shared_root", "tree", "Recipe(shared_root=TreeRoot())"),
        ("reask_question", False, "Recipe(reask_question=False)"),
        ("calibration_segments", 2, "Recipe(calibration_segments=2)"),
        ("shared_scorer", "last_token", "Recipe(scoring=Scoring.default(), question_scoring=Scoring.for_questions())"),
        ("score_pooling", 1, "Recipe(scoring=Scoring(...))"),
        ("pool_unit", "token", "Recipe(scoring=Scoring(...))"),
        ("score_memory", False, "Recipe(scoring=Scoring(...))"),
    ],
)
def test_a_removed_field_is_refused_with_what_replaces_it(field, value, replacement):
    with pytest.raises(ValidationError) as raised:
        HomerConfig(max_chunk_len=128, **{field: value})
    message = str(raised.value)
    assert f"{field} was removed from HomerConfig" in message
    assert f"HomerModel(recipe={replacement})" in message and "homer_integrations.homer.reading.strategies" in message
    assert set(REMOVED_FIELDS) == {
        "reask_question",
        "score_pooling",
        "pool_unit",
        "score_memory",
        "shared_scorer",
        "replay",
        "shared_root",
        "calibration_segments",
    }
    assert list(HomerConfig.model_fields) == [
        "max_chunk_len",
        "warmup_layers",
        "final_cache_len",
        "mode",
        "document_suffix",
        "system_prompt",
        "split",
    ]


def test_every_shared_root_and_scoring_has_its_own_root_key_and_the_replay_none(model, tokenizer):
    default_root, default_tier = keys(model, tokenizer, Recipe())
    roots = {name: keys(model, tokenizer, Recipe(shared_root=unit)) for name, unit in SHARED_ROOTS.items()}
    assert roots["auto"] == (default_root, default_tier), "AutoRoot is the default"
    assert len({root for root, _ in roots.values()}) == len(SHARED_ROOTS), "each builder its own root key"
    assert {tier for _, tier in roots.values()} == {default_tier}, "a leaf tier does not depend on the root's builder"
    assert keys(model, tokenizer, Recipe(scoring=Scoring.default()))[0] != default_root, "the last-token scorer"
    assert keys(model, tokenizer, Recipe(shared_root=WindowRoot(4096)))[0] != roots["window"][0], "its size"
    # a leaf tier serves every replay and a replayed root is never stored: no key names the replay
    for unit in REPLAYS.values():
        assert keys(model, tokenizer, Recipe(replay=unit)) == (default_root, default_tier)
    assert keys(model, tokenizer, Recipe(reask_question=False)) == (default_root, default_tier)


def test_units_are_named_by_their_repr_and_the_recipe_checks_its_parts():
    assert [repr(u) for u in SHARED_ROOTS.values()] == [
        "AutoRoot()",
        "HeadwiseRoot()",
        "FlatRoot()",
        "RecomputeRoot()",
        "TreeRoot()",
        "WindowRoot(tokens=16384)",
    ]
    selection = (
        r"PassageSelection(tokens=128, overlap=48, fusion=60, attention=0.0, heading='Document: [^\\n]+', "
        "stemmer='english')"
    )
    passages = (
        f"PassageReplay(selection={selection}, "
        "budget=ReadBudget(tokens=None, seconds=1.0, least=512, across=2048, share=0.5, step=512))"
    )
    assert [repr(u) for u in REPLAYS.values()] == [
        f"AutoReplay(passages={passages})",
        "RecomputeReplay()",
        passages,
        "FlatReplay()",
        "TreeReplay()",
    ]
    assert Recipe() == Recipe(shared_root=AutoRoot(), replay=AutoReplay(), calibration_segments=48)
    assert replace(Recipe(), replay=FlatReplay()) != Recipe()
    with pytest.raises(TypeError, match=r"Recipe\.shared_root must be a SharedRoot"):
        Recipe(shared_root="flat")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Recipe\.replay must be a Replay"):
        Recipe(replay=TreeRoot())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Recipe\.scoring must be"):
        Recipe(scoring="last_token")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calibration_segments"):
        Recipe(calibration_segments=0)


def test_only_the_replays_that_read_the_tier_ask_for_it():
    window, final = 1024, 128
    fused = PassageReplay(PassageSelection(attention=1.0))
    assert [u.reads_tier(4096, window, final) for u in REPLAYS.values()] == [False, True, False, True, True]
    assert AutoReplay().reads_tier(900, window, final), "within the window the token selection reads the tier"
    assert AutoReplay(fused).reads_tier(4096, window, final) and fused.reads_tier(4096, window, final)
    assert PassageReplay().reads_tier(100, window, final), "a document within the budget replays from its tier"


def test_a_window_root_keeps_more_than_a_chunk_read_by_one_prefill(tokenizer, calibration, novel) -> None:
    from tests.conftest import mode_engine

    book = novel[20_000:32_000]  # about 2,700 tokens: past the tiny model's 2,048-token window
    engine = mode_engine(tokenizer, calibration)  # max_chunk_len 128
    engine.tiers.recipe = Recipe(shared_root=WindowRoot(600), calibration_segments=2)
    root = engine.compress(book, mode="shared")
    kept = root.origin[root.origin >= 0]
    assert root.num_tokens > 128 and 400 <= kept.numel() <= 1.5 * 600, "about 600 tokens, not one chunk's 128"
    assert bool((kept[1:] > kept[:-1]).all()), "document order"
    assert root.position_ids.tolist() == list(range(root.num_tokens)), "one plain prefill: contiguous positions"
    assert engine.answer(book, "Who walked to Meryton?", mode="shared", max_new_tokens=3) is not None
    assert engine.stats().computations == 1, "the root is kept: the question read it"
    short = engine.compress(book[:1500], mode="shared")
    assert short.origin[short.origin >= 0].tolist() == list(range(engine.count_tokens(book[:1500]))), "kept whole"
    with pytest.raises(ValueError, match=r"WindowRoot\.tokens"):
        WindowRoot(8)


def test_a_stored_window_root_is_read_back_by_a_new_engine(tokenizer, calibration, novel, tmp_path) -> None:
    book = novel[20_000:32_000]

    recipe = Recipe(shared_root=WindowRoot(600), calibration_segments=2)

    def engine(recipe: Recipe | None) -> HomerModel:
        config = HomerConfig(max_chunk_len=128, warmup_layers=3)
        model = tiny_model()
        return HomerModel(
            model, tokenizer, config, model_name="tiny", calibration_dir=calibration, progress=False, recipe=recipe,
            store=tmp_path,
        )  # fmt: skip

    first = engine(recipe).run(book, "Who walked to Meryton?", mode="shared", max_new_tokens=2)
    first.text()
    reader = engine(None)  # the default root, then the window root set as benchmarks set it
    default_key = reader.tiers.keys.root("p", "d", "s")
    reader.tiers.recipe = recipe
    assert reader.tiers.keys.root("p", "d", "s") != default_key, "a root built another way is another entry"
    later = reader.run(book, "Who walked to Meryton?", mode="shared", max_new_tokens=2)
    later.text()
    assert first.info.cache_tokens > 128 and (first.info.cache_source, later.info.cache_source) == ("computed", "disk")
    assert later.info.cache_tokens == first.info.cache_tokens, "read back whole, not refused for its size"
