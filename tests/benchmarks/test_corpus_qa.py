"""The corpus benchmark's documents and questions (chapters that rejoin to the books, questions mapped to
the chapter of their evidence, two-hop facts in two chapters each), and a run of every method on a tiny
random-weight engine that ``report`` summarises (its answers are noise; the rows' shape is what counts)."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import corpus_qa

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import question_set
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def built():
    return corpus_qa.build()


def whole_word(word: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, word.split())) + r"(?!\w)", re.IGNORECASE)


@pytest.mark.parametrize(("book", "count"), [("northangerabbey", 31), ("prideprejudice", 61)])
def test_each_book_splits_into_its_chapters_which_rejoin_to_it(book: str, count: int) -> None:
    docs = corpus_qa.chapters(book)
    assert len(docs) == count
    assert "".join(d.text for d in docs) == bundled_text(book)
    assert [d.name for d in docs] == [f"{book}/chapter-{n:02d}" for n in range(1, count + 1)]
    assert all(re.match(r"(CHAPTER|Chapter) \d+\n", d.text) for d in docs[1:]), "each starts at its heading"


def test_the_corpus_has_every_chapter_and_every_question_maps_to_the_chapter_of_its_evidence(built) -> None:
    corpus, items = built
    assert len(corpus) == 92 >= 30
    one_doc = {i.id: i for i in items if i.kind == "one_doc"}
    for book in corpus_qa.BOOKS:
        text = bundled_text(book)
        for q in question_set(f"{book}_book").questions:
            (name,) = one_doc[q.id].evidence
            evidence = text[q.offset : q.offset + 60]
            assert name.startswith(book + "/") and evidence in corpus[name].text, q.id
            assert one_doc[q.id].split == q.split and one_doc[q.id].question_kind == q.kind
            holding = [d.name for d in corpus_qa.chapters(book) if evidence in d.text]
            assert holding == [name], f"{q.id}: its evidence is in {holding}"
    assert len(one_doc) == sum(len(question_set(f"{b}_book")) for b in corpus_qa.BOOKS)


def test_each_two_hop_fact_lies_in_two_documents_and_its_words_nowhere_else(built) -> None:
    corpus, items = built
    facts = corpus_qa.load_facts()
    assert len(facts) >= 12 and Counter(f["split"] for f in facts) == {"tuning": 8, "heldout": 8}
    books = "".join(bundled_text(b) for b in corpus_qa.BOOKS)
    two_doc = {i.id: i for i in items if i.kind == "two_doc"}
    for fact in facts:
        first, second = fact["hops"]
        assert first["document"] != second["document"]
        assert two_doc[fact["id"]].evidence == (first["document"], second["document"])
        for hop in fact["hops"]:
            assert corpus.text.count(hop["sentence"]) == 1
            assert f"\n\n{hop['sentence']}\n\n" in corpus[hop["document"]].text, "a paragraph of its own"
        bridge = whole_word(fact["bridge"])
        assert not bridge.search(fact["question"]), "the question must not name the bridge"
        assert all(bridge.search(hop["sentence"]) for hop in fact["hops"])
        for word in [fact["bridge"], *(k for group in fact["keywords"] for k in group)]:
            assert not whole_word(word).search(books), f"{word!r} is in a book"
            holders = {d.name for d in corpus if whole_word(word).search(d.text)}
            assert holders <= {first["document"], second["document"]}, word
        assert not any(whole_word(k).search(first["sentence"]) for group in fact["keywords"] for k in group)
        assert two_doc[fact["id"]].check(fact["keywords"][0][0]) and not two_doc[fact["id"]].check(first["sentence"])


def test_select_keeps_each_kind_spread_and_chunks_name_their_documents(built) -> None:
    corpus, items = built
    chosen = corpus_qa.select(items, "heldout", limit=5, stride=1)
    assert Counter(i.kind for i in chosen) == {"one_doc": 5, "two_doc": 5}
    assert {i.split for i in chosen} == {"heldout"} and [i for i in items if i in chosen] == chosen
    assert Counter(i.kind for i in corpus_qa.select(items, "all", 0, 2)) == {"one_doc": 95, "two_doc": 8}
    start, end = corpus.spans[3]
    chunks = [corpus.text[start + 10 : start + 50], corpus.text[end - 200 : end + 120]]  # past the next header
    first, across = corpus_qa.chunk_documents(corpus, chunks)
    assert first == {corpus.documents[3].name} and across == {corpus.documents[3].name, corpus.documents[4].name}
    assert corpus_qa.cited_share(("a", "b"), {"b", "c"}) == 0.5


def test_a_run_of_every_method_writes_rows_that_report_summarises(
    built, tokenizer, calibration, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus_qa, "RESULTS", tmp_path)
    monkeypatch.setattr(corpus_qa, "ROWS", tmp_path / "rows.jsonl")
    monkeypatch.setattr(corpus_qa, "build", lambda: built)
    engine = HomerModel(
        # a chapter (at most ~7k tokens) within the window; the corpus (~275k) within the merge tree (524k)
        tiny_model(max_position_embeddings=16384, num_hidden_layers=12),
        tokenizer,
        HomerConfig(max_chunk_len=256, warmup_layers=3, final_cache_len=256),
        model_name="tiny",
        calibration_dir=calibration,
        progress=False,
        recipe=Recipe(calibration_segments=2),
    )
    argv = ["run", "--model", "tiny", "--methods", *corpus_qa.METHODS, "--split", "heldout", "--limit", "1"]
    args = corpus_qa.parser().parse_args([*argv, "--read-tokens", "256", "--max-new-tokens", "2"])
    corpus_qa.run(args, engine=engine)
    rows = corpus_qa.load_rows()
    methods_kinds = {(m, k) for m in corpus_qa.METHODS for k in corpus_qa.KINDS}
    assert Counter((r["method"], r["kind"]) for r in rows) == dict.fromkeys(methods_kinds, 1)
    assert all(r["budget"] == 256 and 0 <= r["cited_evidence"] <= 1 and r["ttft_seconds"] > 0 for r in rows)
    per_document = [r for r in rows if r["method"] == "per_document"]
    assert all(r["cited_documents"] == 1 and r["cache_source"] == "computed" for r in per_document)
    corpus_qa.run(args, engine=engine)
    assert len(corpus_qa.load_rows()) == len(rows) == 2 * len(corpus_qa.METHODS), "a re-run skips what is done"
    corpus_qa.report(args)
    summary = json.loads((tmp_path / "corpus_qa.json").read_text())["summary"]
    assert {s["method"] for s in summary} == set(corpus_qa.METHODS)
    assert all(s["one_doc"][1] == s["two_doc"][1] == 1 for s in summary)
    assert (tmp_path / "corpus_qa.png").stat().st_size > 0 and "| tiny |" in (tmp_path / "corpus_qa.md").read_text()


def test_the_summary_counts_each_method_over_the_questions_it_shares_with_the_corpus_path() -> None:
    def row(method: str, id: str, correct: bool) -> dict:
        return dict(
            model="m", dtype="bfloat16", budget=2048, split="heldout", method=method, id=id, kind="one_doc",
            correct=correct, cited_evidence=1.0, document_seconds=0.0, ttft_seconds=1.0, peak_rss_mb=1,
        )  # fmt: skip

    rows = [row(m, i, ok) for m in ("corpus", "bm25") for i, ok in (("q1", True), ("q2", False), ("q3", True))]
    rows += [row("corpus_noheading", "q1", False), row("bm25", "q4", True)]
    summary = {s["method"]: s["one_doc"] for s in corpus_qa.summarize(rows)}
    assert summary == {"corpus": [2, 3], "bm25": [2, 3], "corpus_noheading": [0, 1]}, "an ablation shrinks no row"
