"""The bundled question sets: every answer is where the set says, and the keyword check is strict."""

import json
import re
from pathlib import Path

import pytest

from homer_integrations import question_sets
from homer_integrations.question_sets import ANSWER_MARGIN_CHARS, KeywordQuestion, question_set


def test_the_bundled_set_is_large_and_every_answer_is_in_the_text_at_its_offset() -> None:
    qset = question_set()
    assert len(qset) >= 20 and len({q.id for q in qset.questions}) == len(qset)
    text = qset.document.read_text(encoding="utf-8")
    for q in qset.questions:
        window = text[max(0, q.offset - 300) : q.offset + ANSWER_MARGIN_CHARS]
        assert q.check(window), f"{q.id}: {q.expected()} not near offset {q.offset}"
    # spread over the excerpts the benchmark uses: >= 20 within 8k tokens (~31k chars), all within ~16k (67k)
    assert len(qset.within(31_000)) >= 20 and len(qset.within(67_000)) == len(qset)


def test_keywords_match_whole_words_case_and_spacing_free_and_every_group() -> None:
    q = KeywordQuestion("x", "Where and how far?", (("one mile", "1 mile"), ("Meryton",)), 0)
    assert q.check("About ONE\nmile from meryton.")
    assert not q.check("one miles from Meryton")  # not a whole word
    assert not q.check("one mile from London") and q.missing("one mile from London") == [("Meryton",)]
    assert q.expected() == "one mile / 1 mile + Meryton"
    with pytest.raises(ValueError, match="keyword"):
        KeywordQuestion("y", "Why?", ((),), 0)


def test_within_and_spread_pick_from_the_excerpt_in_document_order() -> None:
    qset = question_set()
    short = qset.within(6000)
    assert short.questions and all(q.offset + ANSWER_MARGIN_CHARS <= 6000 for q in short.questions)
    picked = qset.spread(4)
    assert len(picked) == 4 and picked[0] == qset.questions[0] and picked[-1] == qset.questions[-1]
    assert [q.offset for q in picked] == sorted(q.offset for q in picked)
    assert short.spread(100) == short.questions


def test_unknown_or_malformed_sets_are_refused(tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"no bundled question set 'nope'.*prideprejudice"):
        question_set("nope")
    (tmp_path / "bad.json").write_text(json.dumps({"document": "x.txt", "questions": [{"id": "a"}]}))
    monkeypatch.setattr(question_sets, "QUESTIONS_DIR", tmp_path)
    with pytest.raises(ValueError, match="malformed"):
        question_set("bad")


BOOK_SETS = ("prideprejudice_book", "northangerabbey_book")
KINDS = {"who", "what", "where", "when", "why"}
SPLITS = {"tuning", "heldout"}
BOOK_FACTS = Path(__file__).parent.parent / "benchmarks" / "book_facts.json"


def _word(text: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, text.split())) + r"(?!\w)", re.IGNORECASE)


def _words(text: str) -> str:
    return " ".join(re.sub(r"\W+", " ", text.lower()).split())


@pytest.mark.parametrize("name", BOOK_SETS)
def test_book_sets_cover_every_tenth_of_the_text_with_valid_kinds_and_splits(name: str) -> None:
    qset = question_set(name)
    text = qset.document.read_text(encoding="utf-8")
    assert len(qset) >= 64 and len({q.id for q in qset.questions}) == len(qset)
    tenths = [sum(1 for q in qset.questions if q.offset * 10 // len(text) == i) for i in range(10)]
    assert min(tenths) >= 5, tenths
    assert {q.kind for q in qset.questions} <= KINDS and {q.split for q in qset.questions} == SPLITS
    tuning, heldout = qset.split("tuning"), qset.split("heldout")
    assert 0 < len(tuning) < len(heldout) and len(tuning) + len(heldout) == len(qset)
    assert all(q.split == "tuning" for q in tuning.questions) and tuning.document == qset.document


@pytest.mark.parametrize("name", BOOK_SETS)
def test_book_set_answers_are_near_their_offsets_and_not_given_away_by_the_question(name: str) -> None:
    qset = question_set(name)
    text = qset.document.read_text(encoding="utf-8")
    for q in qset.questions:
        window = text[max(0, q.offset - 2000) : q.offset + 2000]
        assert any(_word(alt).search(window) for alt in q.keywords[0]), f"{q.id}: {q.keywords[0]} not near {q.offset}"
        leaked = [alt for alt in q.keywords[0] if len(alt) >= 4 and _word(alt).search(q.question)]
        assert not leaked, f"{q.id}: the question holds its answer {leaked}"


def test_the_original_set_has_no_kinds_or_splits() -> None:
    qset = question_set()
    assert all(q.kind == "" and q.split == "" for q in qset.questions) and len(qset.split("tuning")) == 0


def test_book_facts_are_new_to_their_book_and_spread_over_it() -> None:
    facts = json.loads(BOOK_FACTS.read_text(encoding="utf-8"))
    assert len(facts) == 24 and len({f["id"] for f in facts}) == 24
    words: dict[str, str] = {}  # each book as its lower-case words between single spaces: a fast whole-word search
    for book in ("prideprejudice", "northangerabbey"):
        text = (question_sets.QUESTIONS_DIR.parent / f"{book}.txt").read_text(encoding="utf-8")
        words[book] = f" {_words(text)} "
        splits = [f["split"] for f in facts if f["book"] == book]
        depths = [f["depth"] for f in facts if f["book"] == book]
        assert splits.count("tuning") == 4 and splits.count("heldout") == 8
        assert min(depths) == pytest.approx(0.05) and max(depths) == pytest.approx(0.95)
    for f in facts:
        assert 0.05 <= f["depth"] <= 0.95 and f["kind"] in {"number", "name", "colour"}
        q = KeywordQuestion(f["id"], f["question"], tuple(map(tuple, f["keywords"])), 0)
        assert q.check(f["sentence"]) and not q.check(f["question"]), f["id"]
        for alt in (alt for group in f["keywords"] for alt in group):
            assert f" {_words(alt)} " not in words[f["book"]], f"{f['id']}: {alt!r} is already in {f['book']}"
