"""The edit benchmark on a tiny model: each edit recomputes a few leaves, the verified one equals a fresh build."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import leaf_edits

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.homer.reading.strategies import Recipe, RecomputeReplay
from tests.conftest import tiny_model


def test_edits_recompute_few_leaves_and_the_verified_one_equals_a_fresh_build(
    tokenizer, calibration, novel, tmp_path
) -> None:
    start = novel.index("It is a truth universally acknowledged")
    book = novel[start : start + 6000]
    model = tiny_model()

    def make(split: str, store: Path | None) -> HomerModel:
        config = HomerConfig(max_chunk_len=256, warmup_layers=2, split=split)
        recipe = Recipe(replay=RecomputeReplay(), calibration_segments=2)
        cache = DocumentCache(store)
        return HomerModel(
            model, tokenizer, config, calibration_dir=calibration, progress=False, document_cache=cache, recipe=recipe
        )

    rows = leaf_edits.measure(make, book, tmp_path, edits=3, verify=1, question="Who is Mr. Bingley?", max_new_tokens=3)
    v1, *edits, even = rows
    assert (v1["split"], v1["computed"], even["split"], even["computed"]) == (
        "content",
        v1["leaves"],
        "even",
        even["leaves"],
    )
    assert [e["depth"] for e in edits] == [0.25, 0.5, 0.75]
    assert all(1 <= e["computed"] <= 3 and e["copied"] == e["leaves"] - e["computed"] for e in edits), edits
    verified = edits[0]["verify"]
    assert verified["same_plan"] and verified["max_abs_diff"] < 1e-5
    assert verified["same_kept_tokens"] and verified["same_answer"]
    assert "| content | edit 1 | 0.25 |" in leaf_edits.markdown(
        {"book": "b", "book_tokens": 1, "model": "tiny", "dtype": "float32", "threads": 1, "rows": rows}
    )
    excerpt = {"book": "b", "characters": 6000, "book_tokens": 1, "model": "tiny", "dtype": "bf16", "threads": 1}
    assert "Leaf tier of b (its first 6,000 characters)" in leaf_edits.markdown({**excerpt, "rows": rows})


def test_an_edit_appends_one_sentence_to_a_paragraph_at_its_depth(novel) -> None:
    for edit in leaf_edits.paragraph_edits(novel, 3):
        added = len(edit.text) - len(novel)
        assert edit.text[: edit.at] == novel[: edit.at] and edit.text[edit.at + added :] == novel[edit.at :]
        assert edit.text[edit.at + added :].startswith("\n\n") and abs(edit.at / len(novel) - edit.depth) < 0.02
