"""The whole-book benchmark's document and questions: facts inserted where they say, every question asked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import whole_book

from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import question_set


@pytest.mark.parametrize("book", ["northangerabbey", "prideprejudice"])
def test_each_fact_is_one_paragraph_at_its_depth_and_every_question_is_asked(book: str) -> None:
    text, items = whole_book.book_with_facts(book)
    facts = [f for f in json.loads(whole_book.FACTS.read_text(encoding="utf-8")) if f["book"] == book]
    original = bundled_text(book)
    assert len(text) == len(original) + sum(len(f["sentence"]) + 2 for f in facts)
    for fact in facts:
        at = text.index("\n\n" + fact["sentence"])
        assert text.count(fact["sentence"]) == 1
        assert abs(at / len(text) - fact["depth"]) < 0.01, "inserted near its depth"
        assert text[at + 2 + len(fact["sentence"]) :].startswith("\n\n"), "a paragraph of its own"
    ids = [i.id for i in items]
    assert len(ids) == len(set(ids)) == len(facts) + len(question_set(f"{book}_book"))
    assert [i.depth for i in items] == sorted(i.depth for i in items)
    assert {i.split for i in items} == {"tuning", "heldout"}
    fact_items = [i for i in items if i.kind.startswith("fact_")]
    assert len(fact_items) == len(facts) and all(
        i.check(f["keywords"][0][0])
        for i, f in zip(sorted(fact_items, key=lambda i: i.id), sorted(facts, key=lambda f: f["id"]), strict=True)
    )


def test_the_summary_pairs_methods_counts_story_and_facts_apart_and_times_only_later_questions() -> None:
    base = {"model": "m", "book": "b", "dtype": "bfloat16", "budget": 2048, "split": "heldout", "peak_rss_mb": 10}
    homer = {**base, "method": "query_aware"}
    rows = [
        {**homer, "id": "q1", "kind": "who", "correct": True, "ttft_seconds": 900.0, "document_seconds": 800.0},
        {**homer, "id": "q2", "kind": "why", "correct": False, "ttft_seconds": 20.0, "document_seconds": 0.0},
        {**homer, "id": "f1", "kind": "fact_name", "correct": True, "ttft_seconds": 30.0, "document_seconds": 0.0},
        {**homer, "id": "q3", "kind": "who", "correct": True, "ttft_seconds": 99.0, "document_seconds": 0.0},
        {
            **base,
            "method": "bm25",
            "id": "q1",
            "kind": "who",
            "correct": False,
            "ttft_seconds": 5.0,
            "document_seconds": 0.0,
            "peak_rss_mb": 12,
        },
        {
            **base,
            "method": "bm25",
            "id": "q2",
            "kind": "why",
            "correct": True,
            "ttft_seconds": 7.0,
            "document_seconds": 0.0,
        },
        {
            **base,
            "method": "bm25",
            "id": "f1",
            "kind": "fact_name",
            "correct": True,
            "ttft_seconds": 6.0,
            "document_seconds": 0.0,
        },
    ]
    few = {**base, "method": "merge", "id": "q1", "kind": "who", "correct": True, "ttft_seconds": 1.0}
    bm25, merge, query_aware = whole_book.summarize([*rows, few | {"document_seconds": 0.0}])
    assert merge["story"] == [1, 1], "an ablation asked one question: counted on that one"
    assert query_aware["story"] == [1, 2] and query_aware["facts"] == [1, 1], "q3 only one method asked"
    assert query_aware["build_seconds"] == 800.0 and query_aware["median_ttft_seconds"] == 25.0
    assert bm25["story"] == [1, 2] and bm25["median_ttft_seconds"] == 6.0 and bm25["peak_rss_mb"] == 12
    assert "| 1/2 | 1/1 | 800 | 25.0 | 10 |" in whole_book.markdown([query_aware])


def test_each_per_question_method_asks_its_own_replay_at_the_budget_given() -> None:
    fixed, grown = whole_book.replays(4096), whole_book.replays(0)
    assert fixed["query_aware"].passages.budget.tokens == 4096, "every method reads the same tokens"
    assert grown["query_aware"].passages.budget.tokens is None, "0: the package's budget, which grows with the machine"
    assert fixed["query_aware"].passages.selection.attention == 0, "the default ranks passages by BM25 alone"
    assert fixed["fused"].passages.selection.attention == 1.0
    assert fixed["query_aware"].passages.selection.stemmer == "english"
    assert fixed["query_aware_unstemmed"].passages.selection.stemmer is None, "the ablation: words as written"
    assert fixed["query_aware_unstemmed"].passages.budget == fixed["query_aware"].passages.budget
    routes_and_roots = {"shared", "window", "window_passages", "kept", "bm25", "bm25_unstemmed"}
    assert set(fixed) == set(whole_book.METHODS) - routes_and_roots


def test_paired_compares_only_the_questions_both_methods_answered() -> None:
    def row(method: str, qid: str, kind: str, correct: bool, book: str = "northangerabbey") -> dict:
        keys = {"model": "m", "book": book, "dtype": "bfloat16", "budget": 2048}
        return keys | {"method": method, "id": qid, "kind": kind, "correct": correct}

    rows = [
        row("a", "q1", "who", True),
        row("b", "q1", "who", False),
        row("a", "q2", "why", True),
        row("b", "q2", "why", True),
        row("a", "q1", "who", False, book="prideprejudice"),  # another book's q1: its own pair
        row("b", "q1", "who", False, book="prideprejudice"),
        row("a", "q3", "who", True),  # b never answered q3: left out
        row("a", "f1", "fact_number", True),
        row("b", "f1", "fact_number", False),
    ]
    story, facts, both = whole_book.paired(rows, "a", "b")
    assert (story["kind"], story["pairs"], story["right"], story["reference_right"]) == ("story", 3, 2, 1)
    assert story["difference"] == pytest.approx(1 / 3)
    low, high = story["interval_90"]
    assert 0.0 <= low <= story["difference"] <= high <= 1.0
    assert (facts["kind"], facts["pairs"], facts["difference"]) == ("facts", 1, 1.0)
    assert (both["kind"], both["pairs"], both["right"]) == ("all", 4, 3)
    assert "| a | b | story | 3 | 2 | 1 | +0.33 |" in whole_book.paired_markdown([story])


def test_the_budget_curve_counts_every_budget_on_the_questions_all_of_them_answered(tmp_path: Path) -> None:
    def row(method: str, budget: int, qid: str, correct: bool, seconds: float, **other: object) -> dict:
        keys = {"model": "m", "book": "northangerabbey", "dtype": "bfloat16", "split": "tuning", "kind": "who"}
        asked = {"depth": 0.5, "method": method, "budget": budget, "id": qid}
        return keys | asked | {"correct": correct, "ttft_seconds": seconds} | other

    rows = [
        *(row(m, 1024, q, q == "q1", 5.0) for m in ("query_aware", "bm25") for q in ("q1", "q2", "q3")),
        *(row(m, 4096, q, True, 20.0 + (m == "bm25")) for m in ("query_aware", "bm25") for q in ("q1", "q2")),
        row("query_aware", 8192, "q1", True, 80.0),  # the route never ran at 8k: no point there
        row("shared", 4096, "q3", True, 1.0),  # not a method of the curve
        row("bm25", 4096, "q3", True, 1.0, split="heldout"),  # another split
    ]
    curve = whole_book.budget_curve(rows)
    assert [(c["budget"], c["method"]) for c in curve] == [
        (1024, "query_aware"),
        (1024, "bm25"),
        (4096, "query_aware"),
        (4096, "bm25"),
    ]
    assert all(c["asked"] == 2 for c in curve), "q3 was not asked at 4k: left out at 1k too"
    assert [c["right"] for c in curve] == [1, 1, 2, 2]
    assert [c["median_ttft_seconds"] for c in curve] == [5.0, 5.0, 20.0, 21.0]
    assert "| 4,096 | bm25 | 2/2 | 21.0 |" in whole_book.curve_markdown(curve)
    assert whole_book.budget_curve(rows, split="heldout") == []
    held = [r | {"split": "heldout", "budget": 2048} for r in rows if r["budget"] == 4096]
    plot = tmp_path / "plot.png"
    whole_book.plot(held, curve, plot)
    assert plot.read_bytes().startswith(b"\x89PNG")
    (story,) = [c for c in whole_book.headline(held) if c["reference"] == "bm25"]
    assert (story["pairs"], story["right"], story["reference_right"]) == (2, 2, 2), "q3: the route's alone"


def test_a_question_after_the_kept_root_reads_its_own_passages_and_builds_the_root_once(
    tokenizer, calibration, novel
) -> None:
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe, WindowRoot
    from tests.conftest import tiny_model

    book = novel[20_000:32_000]  # past the tiny model's 2,048-token window
    config = HomerConfig(max_chunk_len=1024, warmup_layers=3)  # a question of passages: up to 256 tokens
    recipe = Recipe(shared_root=WindowRoot(600), calibration_segments=2)
    engine = HomerModel(tiny_model(), tokenizer, config, calibration_dir=calibration, progress=False, recipe=recipe)
    route = whole_book.Bm25Route(engine, book, 64)
    first = whole_book.after_root(engine, book, route, "Who walked to Meryton?", 2)
    first.text()
    built = engine.stats().computations
    again = whole_book.after_root(engine, book, route, "Where is Netherfield?", 2)
    again.text()
    passages = [p.text for p in route.index.search("Where is Netherfield?", route.k)]
    root = engine.compress(book, mode="shared")
    assert built == 1 and engine.stats().computations == 1, "the root is built once, then read"
    assert again.info.cache_tokens == root.num_tokens >= 400, "the question is read after the kept root"
    assert again.info.input_tokens >= engine.count_tokens("\n\n".join(passages)), "with its own passages"


def test_the_kept_ablation_reads_the_defaults_passages_that_bm25_ranks_best_in_document_order(
    tokenizer, calibration, novel
) -> None:
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe
    from tests.conftest import tiny_model

    book = novel[20_000:32_000]
    config = HomerConfig(max_chunk_len=1024, warmup_layers=3)  # a question of passages: up to 256 tokens
    recipe = Recipe(calibration_segments=2)
    engine = HomerModel(tiny_model(), tokenizer, config, calibration_dir=calibration, progress=False, recipe=recipe)
    runs = whole_book.passage_runs(engine, book, "Meryton", 200)
    assert any("Meryton" in r for r in runs) and engine.count_tokens("\n\n".join(runs)) <= 200 + 4 * len(runs)
    starts = [book.index(r[:40]) for r in runs]
    assert starts == sorted(starts), "document order"
    stream = whole_book.after_root_passages(engine, book, "Who walked to Meryton?", 2, tokens=200)
    stream.text()
    assert stream.info.input_tokens >= engine.count_tokens("\n\n".join(runs)), "the passages are read after the root"
