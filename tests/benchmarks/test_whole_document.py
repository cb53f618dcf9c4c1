"""The whole-document benchmark: the questions' offsets in the book with facts inserted, the oracle's
context, and a run of every method on a tiny random-weight engine over an
excerpt (its answers are noise; the rows, their re-run and the report are what count)."""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import whole_document as wd

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import Part, WholeQuestion
from tests.conftest import tiny_model

EXCERPT_START = "No one who had ever seen Catherine Morland"


@pytest.fixture(scope="module")
def excerpt() -> str:
    """About 3,000 tokens of Northanger Abbey's first chapters: past the tiny model's 2,048-token window."""
    text = bundled_text("northangerabbey")
    start = text.index(EXCERPT_START)
    return text[start : start + 12_000]


def quoted(text: str, quote: str) -> tuple[int, ...]:
    at = re.search(r"\s+".join(map(re.escape, quote.split())), text)
    assert at, quote
    return (at.start(),)


@pytest.fixture(scope="module")
def questions(excerpt: str) -> list[wd.Item]:
    def part(name: str, keyword: str, quote: str) -> Part:
        return Part(name, ((keyword,),), quoted(excerpt, quote), (quote,))

    family = WholeQuestion(
        "t-list",
        "What was Catherine's father, and how many children did the family have?",
        "list",
        "heldout",
        2,
        (
            part("a clergyman", "clergyman", "Her father was a clergyman"),
            part("ten", "ten", "A family of ten children"),
        ),
    )
    advice = WholeQuestion(
        "t-order",
        "What did Mrs. Morland advise before the journey, and who was Catherine's confidante?",
        "order",
        "heldout",
        2,
        (part("the throat", "throat", "very warm about the throat"), part("Sally", "Sally", "Sally, or rather Sarah")),
        ordered=True,
    )
    return [wd.Item(family, "story"), wd.Item(advice, "story")]


@pytest.fixture
def engine(tokenizer, calibration) -> HomerModel:
    """A fresh engine (its cache empty) over a tiny random-weight Llama."""
    return HomerModel(
        tiny_model(num_hidden_layers=8),  # a 2,048-token window; 8 layers: the excerpt's merge tree
        tokenizer,
        HomerConfig(max_chunk_len=512, warmup_layers=3, final_cache_len=256),  # questions: 128 tokens
        model_name="tiny",
        calibration_dir=calibration,
        progress=False,
        recipe=Recipe(calibration_segments=2),
    )


@pytest.mark.parametrize("book", wd.BOOKS)
def test_every_part_is_found_at_its_offsets_in_the_book_with_facts_inserted(book: str) -> None:
    text, items = wd.book_questions(book)
    assert Counter(i.source for i in items)["facts"] == 4
    for item in items:
        for part in item.question.parts:
            assert not part.unsupported(text), (item.question.id, part.name)
    # the facts moved the story's offsets: read unmoved, some late evidence is not where they point
    original = wd.whole_question_set(book).questions
    assert any(p.unsupported(text) for q in original for p in q.parts)


def test_questions_come_interleaved_by_kind_and_limit_keeps_a_spread() -> None:
    _, items = wd.book_questions("northangerabbey")
    chosen = wd.select(items, "heldout", limit=7)
    assert [i.question.kind for i in chosen] == list(wd.KINDS)
    assert {i.question.split for i in wd.select(items, "heldout")} == {"heldout"}
    assert [i.question.id for i in wd.select(items, "heldout", ids=["naw04", "na-whole03"])] == ["naw04", "na-whole03"]


def test_the_oracle_context_holds_every_parts_evidence_in_document_order() -> None:
    text, items = wd.book_questions("northangerabbey")
    for item in items:
        q = item.question
        spans = wd.evidence_spans(text, q, 600)
        assert all(a < b <= c for (a, b), (c, _) in itertools.pairwise(spans)), "ordered, disjoint"
        prompt = " ".join(wd.oracle_prompt(text, q, 600).split())
        for part in q.parts:
            for quote in part.evidence:
                assert " ".join(quote.split()) in prompt, (q.id, part.name)
        assert prompt.startswith("Text:") and wd.COMPLETE in prompt and prompt.endswith(wd.CLOSING)
        assert sum(b - a for a, b in spans) <= sum(2 * 600 + len(e) for p in q.parts for e in p.evidence)


def test_every_method_writes_a_row_that_a_rerun_skips_and_report_summarises(
    engine: HomerModel, excerpt: str, questions: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wd, "RESULTS", tmp_path)
    monkeypatch.setattr(wd, "ROWS", tmp_path / "rows.jsonl")
    monkeypatch.setattr(wd, "book_questions", lambda book: (excerpt, questions))
    argv = ["run", "--model", "tiny", "--methods", *wd.METHODS, "--read-tokens", "256", "--max-new-tokens", "3"]
    options = ["--chunk-tokens", "1024", "--note-tokens", "3", "--shared-tokens", "512", "--rows", str(wd.ROWS)]
    args = wd.parser().parse_args([*argv, *options])
    wd.run(args, engine=engine)
    rows = wd.load_rows()
    asked = {(m, q.question.id): 1 for m in wd.METHODS for q in questions}
    assert Counter((r["method"], r["id"]) for r in rows) == asked
    for r in rows:
        assert r["model"] == "tiny" and r["book"] == "northangerabbey" and r["split"] == "heldout"
        assert r["ttft_seconds"] > 0 and r["seconds"] >= r["ttft_seconds"] and r["tokens_read"] > 0
        assert r["peak_rss_mb"] > 0 and r["correct"] in (True, False) and isinstance(r["matched"], list)
    by = {(r["method"], r["id"]): r for r in rows}
    pieces = len(wd.MapReduce(engine, 1024).pieces(excerpt))
    mapped = by[("map_reduce", "t-list")]
    assert mapped["reads"] == pieces + 1 >= 3 and mapped["chunk_tokens"] == 1024, "every piece, then the notes"
    assert mapped["tokens_read"] >= engine.count_tokens(excerpt)
    assert by[("oracle", "t-list")]["tokens_read"] < by[("bm25", "t-list")]["tokens_read"] + 1024
    # the first question builds what the methods keep (map-reduce's chunks, the shared root, the leaf tier) ...
    for method in ("map_reduce", "shared", "tree"):
        first, later = by[(method, "t-list")], by[(method, "t-order")]
        assert "computed" in first["cache_source"] and first["document_seconds"] > 0, method
        assert later["cache_source"] == "memory" and later["document_seconds"] == 0, method
    # ... the default, past the window, re-reads its passages within the budget and keeps nothing
    default = by[("default", "t-list")]
    assert default["document_seconds"] == 0 and 64 < default["tokens_read"] <= 256 + 128
    wd.run(args, engine=engine)
    assert len(wd.load_rows()) == len(rows) == 2 * len(wd.METHODS), "a re-run skips what is done"
    wd.report(wd.parser().parse_args(["report"]))
    data = json.loads((tmp_path / "whole_document.json").read_text())
    assert {s["method"] for s in data["summary"]} == set(wd.METHODS)
    assert all(s["all"][1] == 2 and s["kinds"]["list"][1] == 1 for s in data["summary"])
    assert {c["method"] for c in data["against_bm25"]} == set(wd.METHODS) - {"bm25"}
    assert all(c["pairs"] == 2 for c in data["against_bm25"] if c["kind"] == "all")
    assert "| northangerabbey | map_reduce | heldout |" in (tmp_path / "whole_document.md").read_text()
    assert (tmp_path / "whole_document.png").stat().st_size > 0


def test_the_summary_counts_each_method_over_its_own_questions_and_keeps_the_one_time_cost_apart() -> None:
    def row(method: str, id: str, kind: str, correct: bool, seconds: float, built: float = 0.0) -> dict:
        return dict(
            model="m", book="b", dtype="bfloat16", budget=2048, split="heldout", method=method, id=id, kind=kind,
            source="story", correct=correct, seconds=seconds, ttft_seconds=seconds, document_seconds=built,
            tokens_read=100, peak_rss_mb=1, load_1m=1.0, matched=["a"] if correct else [], need=2,
        )  # fmt: skip

    rows = [row("bm25", "q1", "list", True, 10), row("bm25", "q2", "count", False, 20)]
    rows += [row("map_reduce", "q1", "list", True, 900, built=800), row("map_reduce", "q3", "list", False, 100)]
    summary = {s["method"]: s for s in wd.summarize(rows)}
    assert summary["bm25"]["kinds"]["list"] == [1, 1] and summary["bm25"]["all"] == [1, 2]
    assert summary["bm25"]["parts_named"] == 0.25, "one of two needed parts named, then none"
    assert summary["map_reduce"]["kinds"]["list"] == [1, 2] and summary["map_reduce"]["kinds"]["count"] == [0, 0]
    assert summary["map_reduce"]["one_time_seconds"] == 800 and summary["map_reduce"]["median_seconds"] == 100
    (pair,) = [c for c in wd.against_bm25(rows) if c["method"] == "map_reduce" and c["kind"] == "list"]
    assert pair["pairs"] == 1 and pair["right"] == pair["reference_right"] == 1


def test_the_report_scores_answers_again_by_the_rules_as_they_are_now() -> None:
    _, items = wd.book_questions("northangerabbey")
    count = next(i.question for i in items if i.question.id == "naw08")  # two drives ("two", "2", "twice")
    row = {"book": "northangerabbey", "id": count.id, "answer": "Three times:\n1. up\n2. down", "correct": True}
    gone = {"book": "northangerabbey", "id": "no-such-question", "answer": "2", "correct": True, "matched": ["x"]}
    fixed, kept = wd.rescored([{**row, "matched": ["two drives"]}, gone])
    assert fixed["correct"] is False and fixed["matched"] == [], "a list's '2.' is no longer a count of two"
    assert kept == gone
