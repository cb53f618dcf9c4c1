"""The kept-forms benchmark: excerpts that hold their questions' evidence, and what its rows record."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import kept_forms
import whole_book


class _Engine:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer


def test_excerpts_are_consecutive_paragraph_cut_spans_that_hold_every_chosen_question(tokenizer) -> None:
    text, items = whole_book.book_with_facts("northangerabbey")
    held = [i for i in items if i.split == "heldout"]
    spans = kept_forms.excerpts(_Engine(tokenizer), text, 8192)
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "consecutive"
    assert all(text[e : e + 2] == "\n\n" for _, e in spans), "cut at paragraph breaks"
    lengths = [len(tokenizer(text[s:e], add_special_tokens=False)["input_ids"]) for s, e in spans]
    assert all(7000 < n <= 8192 for n in lengths), lengths
    picked = kept_forms.chosen(spans, held, text, 12)
    asked = [i for _, its in picked for i in its]
    assert len(asked) >= 12 and len({i.id for i in asked}) == len(asked), "at least 12, none twice"
    assert all(i.split == "heldout" for i in asked)
    for (start, end), its in picked:
        for item in its:
            assert start + kept_forms.MARGIN <= item.depth * len(text) <= end - kept_forms.MARGIN
    inside = [(s + kept_forms.MARGIN, e - kept_forms.MARGIN) for (s, e), _ in picked]
    facts = [i for s, e in inside for i in held if i.kind.startswith("fact") and s <= i.depth * len(text) <= e]
    assert {i.id for i in facts} <= {i.id for i in asked}, "every fact inside a chosen excerpt is asked"


def test_a_build_row_counts_the_entry_and_an_answer_row_its_later_question(tokenizer, calibration, novel) -> None:
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe
    from tests.conftest import tiny_model

    document = novel[:3_000]
    config = HomerConfig(max_chunk_len=1024, final_cache_len=128, warmup_layers=3)  # a question of 256 tokens
    recipe = Recipe(calibration_segments=2)
    engine = HomerModel(tiny_model(), tokenizer, config, calibration_dir=calibration, progress=False, recipe=recipe)
    item = whole_book.Item("q1", "Who walked to Meryton?", lambda a: bool(a), "who", "heldout", 0.5)
    for method in ("full", "shared"):
        built = kept_forms.build_row(engine, document, method)
        assert built["source"] == "computed" and built["nbytes"] > 0, method
        row = kept_forms.answer_row(engine, document, item, method, 4)
        assert row["document_seconds"] == 0.0, "the entry is read, not built again"
        assert row["output_tokens"] >= 1 and row["read_tokens"] >= built["kept_tokens"]
    assert kept_forms.build_row(engine, document, "shared")["kept_tokens"] <= 128 + 64 < built["document_tokens"]
    full = kept_forms.build_row(engine, document, "full")
    after = kept_forms.answer_row(engine, document, item, "full_passages", 4, passage_tokens=200)
    assert after["read_tokens"] > full["kept_tokens"] + 16, "the question's passages are read after the whole prefill"
    plain = kept_forms.answer_row(engine, document, item, "full_plain", 4)
    assert engine.tiers.recipe.echo is None and plain["document_seconds"] == 0.0, "the full entry, without the echo"
    kept_forms.mode_of(engine, "full")
    assert engine.tiers.recipe.echo is not None, "full echoes the question's passages again"
