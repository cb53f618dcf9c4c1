"""Whole-document question sets and inserted multi-part facts: every part is stated where the set says,
each question's evidence is spread over the book, and the k-of-n and ordered scoring is strict."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from homer_integrations import question_sets
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import (
    EVIDENCE_WINDOW_CHARS,
    QUESTIONS_DIR,
    SPLITS,
    WHOLE_KINDS,
    Part,
    WholeQuestion,
    unlisted,
    whole_question_set,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import whole_facts

WHOLE_SETS = sorted(p.name.removesuffix("_whole.json") for p in QUESTIONS_DIR.glob("*_whole.json"))
BOOKS = ("prideprejudice", "northangerabbey")


def _words(text: str) -> list[str]:
    return re.sub(r"\W+", " ", text.lower()).split()


def _names(parts: tuple[Part, ...]) -> str:
    return "; ".join(p.name for p in parts)


def test_the_pride_and_prejudice_whole_set_is_bundled() -> None:
    assert "prideprejudice" in WHOLE_SETS


@pytest.mark.parametrize("name", WHOLE_SETS)
def test_every_part_is_stated_at_its_offsets_and_each_question_spans_a_fifth_of_the_book(name: str) -> None:
    qset = whole_question_set(name)
    text = qset.document.read_text(encoding="utf-8")
    assert len(qset) >= 40 and len({q.id for q in qset.questions}) == len(qset)
    for q in qset.questions:
        for part in q.parts:
            assert max(part.offsets) < len(text), (q.id, part.name)
            assert not part.unsupported(text), f"{q.id} {part.name!r}: not stated at {part.unsupported(text)}"
            assert all(len(quote) >= 15 for quote in part.evidence), (q.id, part.name)
        first, last = q.span
        assert last - first >= len(text) / 5, (
            f"{q.id}: evidence spans only {(last - first) / len(text):.2f} of the book"
        )


@pytest.mark.parametrize("name", WHOLE_SETS)
def test_every_kind_has_both_splits_about_evenly(name: str) -> None:
    qset = whole_question_set(name)
    for kind in WHOLE_KINDS:
        splits = [q.split for q in qset.questions if q.kind == kind]
        assert set(splits) == set(SPLITS), (kind, splits)
        assert abs(splits.count("tuning") - splits.count("heldout")) <= 1, (kind, splits)
    tuning, heldout = qset.split("tuning"), qset.split("heldout")
    assert len(tuning) + len(heldout) == len(qset) and {q.split for q in tuning.questions} == {"tuning"}


@pytest.mark.parametrize("name", WHOLE_SETS)
def test_part_names_are_right_answers_and_questions_give_nothing_away(name: str) -> None:
    qset = whole_question_set(name)
    for q in qset.questions:
        assert all(p.check(p.name) for p in q.parts), q.id
        assert q.check(_names(q.parts)), q.id
        assert not q.check(q.question), f"{q.id}: the question answers itself"
        if q.kind == "order":
            assert q.ordered and len(q.parts) >= 2, q.id
        if _independent(q):  # (a set may give every part of a count the number itself as keyword)
            assert not q.check(_names(q.parts[: q.need - 1])), f"{q.id}: fewer than need={q.need} parts pass"
            if q.ordered:
                assert not q.check(_names(q.parts[::-1])), f"{q.id}: the reversed order passes"
        # worded unlike the text: no run of six words from any evidence quote
        asked = " ".join(_words(q.question))
        for quote in (e for p in q.parts for e in p.evidence):
            words = _words(quote)
            runs = {" ".join(words[i : i + 6]) for i in range(len(words) - 5)}
            assert not any(run in asked for run in runs), f"{q.id} copies {quote!r}"


def _independent(q: WholeQuestion) -> bool:
    """Each part's name matches that part alone."""
    return all(q.matched(p.name) == [p.name] for p in q.parts)


def test_pride_and_prejudice_parts_are_told_apart_by_their_keywords() -> None:
    qset = whole_question_set("prideprejudice")
    assert [q.id for q in qset.questions if not _independent(q)] == []
    assert all(p.evidence for q in qset.questions for p in q.parts)


def _places(need: int, ordered: bool = False) -> WholeQuestion:
    parts = (
        Part("Netherfield", (("Netherfield",),), (10,)),
        Part("Hunsford", (("Hunsford", "Kent"),), (500,)),
        Part("Lambton", (("Lambton", "Pemberley"),), (200,)),
    )
    return WholeQuestion("t1", "Where did she stay?", "order" if ordered else "list", "tuning", need, parts, ordered)


def test_check_needs_k_of_n_parts_in_order_when_ordered() -> None:
    every = _places(3)
    assert every.check("Netherfield, then kent, then PEMBERLEY")
    assert not every.check("Netherfield and Kent") and every.matched("Netherfield and Kent") == [
        "Netherfield",
        "Hunsford",
    ]
    assert not every.check("Netherfield, Kentish lanes, Pemberley")  # whole words only
    two = _places(2)
    assert two.check("Pemberley and Netherfield") and two.matched("Pemberley and Netherfield") == [
        "Netherfield",
        "Lambton",
    ]
    assert not two.check("only Pemberley")
    ordered = _places(3, ordered=True)
    assert ordered.check("First Netherfield; later Hunsford; at last Lambton.")
    assert not ordered.check("Lambton, Hunsford, Netherfield")
    assert not ordered.check("Netherfield, Lambton, Kent")
    ordered_two = _places(2, ordered=True)
    assert ordered_two.check("Netherfield, then Lambton") and not ordered_two.check("Lambton, then Netherfield")
    assert ordered.expected() == "all of: Netherfield; Hunsford; Lambton (in this order)"
    assert two.expected() == "2 of: Netherfield; Hunsford; Lambton"
    assert every.offsets == (10, 200, 500) and every.span == (10, 500)


def test_a_part_with_several_groups_is_placed_where_its_last_group_first_appears() -> None:
    jane = Part("Jane marries Bingley", (("Jane",), ("Bingley",)), (0,))
    lydia = Part("Lydia marries Wickham", (("Lydia",), ("Wickham",)), (1,))
    assert jane.position("Bingley weds Jane") == len("Bingley weds ")
    assert jane.position("Bingley alone") is None and not jane.check("Jane alone")
    q = WholeQuestion("t2", "In what order?", "order", "heldout", 2, (lydia, jane), ordered=True)
    assert q.check("Lydia and Wickham first, then Jane and Bingley")
    assert not q.check("Jane and Bingley, then Lydia and Wickham")


def test_a_lists_numbering_is_not_a_count() -> None:
    drives = Part("two drives", (("two", "2", "twice"),), (0,))
    q = WholeQuestion("t3", "How many drives?", "count", "heldout", 1, (drives,))
    assert not q.check("Three times:\n1. to the church\n2. to the church again\n 3) once more")
    assert q.check("- twice") and not q.check("- once\n- again"), "a bullet is blanked, the words stay"
    assert (
        q.check("Twice.") and q.check("She drives 2 times:\n1. up the Down") and q.matched("1. twice") == ["two drives"]
    )
    assert unlisted("a\n2. b") == "a\n   b", "same length: an ordered check keeps its positions"


def test_unsupported_reports_offsets_without_their_evidence_or_keywords() -> None:
    text = "x" * 600 + "It is a truth\nuniversally acknowledged." + "y" * 1000 + " Meryton and Longbourn"
    quoted = Part("truth", (("truth",),), (590, 600, 1200), ("It is a truth universally acknowledged",) * 3)
    assert quoted.unsupported(text) == [1200]  # any whitespace in the text matches a space in the quote
    edge = 600 - EVIDENCE_WINDOW_CHARS
    assert Part("edge", (("truth",),), (edge, edge - 1), ("It is a truth",) * 2).unsupported(text) == [edge - 1]
    at = text.index("Meryton")
    assert Part("towns", (("Meryton",), ("Longbourn",)), (at - 50,)).unsupported(text) == []
    assert Part("towns", (("Meryton",), ("Pemberley",)), (at - 50, 0)).unsupported(text) == [at - 50, 0]


def _write(tmp_path: Path, name: str, questions: object, **extra: object) -> None:
    doc = {"document": "prideprejudice.txt", "title": "t", "about": "a", "questions": questions, **extra}
    (tmp_path / f"{name}_whole.json").write_text(json.dumps(doc), encoding="utf-8")


GOOD = {
    "id": "g1",
    "kind": "count",
    "split": "tuning",
    "question": "How many?",
    "need": 1,
    "parts": [{"name": "three", "keywords": [["three", "3"]], "offsets": [5, 9], "evidence": "a quote"}],
}


@pytest.mark.parametrize(
    "change",
    [
        {"parts": None},
        {"need": 2},
        {"need": 0},
        {"need": True},
        {"kind": "trivia"},
        {"split": "train"},
        {"ordered": "yes"},
        {"question": " "},
        {"parts": [{"name": "three", "keywords": [["three"]]}]},
        {"parts": [{"name": "three", "keywords": [["three"]], "offsets": ["5"]}]},
        {"parts": [{"name": "three", "keywords": [[]], "offsets": [5]}]},
        {"parts": [{"name": "three", "keywords": [["three"]], "offsets": [5, 9], "evidence": ["only one"]}]},
        {
            "parts": [
                {"name": "a", "keywords": [["a"]], "offsets": [1]},
                {"name": "a", "keywords": [["b"]], "offsets": [2]},
            ]
        },
    ],
)
def test_malformed_whole_sets_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict) -> None:
    monkeypatch.setattr(question_sets, "QUESTIONS_DIR", tmp_path)
    _write(tmp_path, "good", [GOOD])
    loaded = whole_question_set("good")
    assert loaded.questions[0].parts[0].evidence == ("a quote", "a quote") and loaded.about == "a"
    bad = {key: value for key, value in {**GOOD, **change}.items() if value is not None}
    _write(tmp_path, "bad", [bad])
    with pytest.raises(ValueError, match="malformed"):
        whole_question_set("bad")


def test_unknown_repeated_or_unreadable_whole_sets_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(question_sets, "QUESTIONS_DIR", tmp_path)
    _write(tmp_path, "twice", [GOOD, GOOD])
    with pytest.raises(ValueError, match="repeated"):
        whole_question_set("twice")
    (tmp_path / "broken_whole.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="malformed"):
        whole_question_set("broken")
    with pytest.raises(ValueError, match=r"no bundled whole-document question set 'nope'.*broken"):
        whole_question_set("nope")


@pytest.fixture(scope="module")
def inserted() -> dict[str, tuple[str, list[WholeQuestion]]]:
    return {book: whole_facts.book_with_whole_facts(book) for book in BOOKS}


def test_whole_facts_are_valid_questions_in_both_splits() -> None:
    facts = whole_facts.load_facts()
    assert len({f["id"] for f in facts}) == len(facts)
    for book in BOOKS:
        mine = [f for f in facts if f["book"] == book]
        assert len(mine) >= 4 and {f["split"] for f in mine} == set(SPLITS)
        assert {f["kind"] for f in mine} <= set(WHOLE_KINDS)


def test_inserted_facts_stand_at_their_offsets_spread_over_the_book(inserted) -> None:
    facts = whole_facts.load_facts()
    for book, (text, questions) in inserted.items():
        original = bundled_text(book)
        mine = [f for f in facts if f["book"] == book]
        assert [q.id for q in questions] == [f["id"] for f in mine]
        sentences = [p["sentence"] for f in mine for p in f["parts"] if "sentence" in p]
        assert len(text) == len(original) + sum(len(s) + 2 for s in sentences)
        for fact, q in zip(mine, questions, strict=True):
            stated = [p for p in fact["parts"] if "sentence" in p]
            assert max(p["depth"] for p in stated) - min(p["depth"] for p in stated) >= 0.2, q.id
            assert q.span[1] - q.span[0] >= len(text) / 5, q.id
            pairs = list(zip(fact["parts"], q.parts, strict=True))
            every = sorted(o for raw, part in pairs if "sentence" in raw for o in part.offsets)
            for raw, part in pairs:
                assert not part.unsupported(text), (q.id, part.name)
                for offset, sentence in zip(part.offsets, part.evidence, strict=True):
                    assert text[offset - 2 : offset + len(sentence)] == "\n\n" + sentence, (q.id, part.name)
                if "sentence" in raw:
                    assert abs(part.offsets[0] / len(text) - raw["depth"]) < 0.01, (q.id, part.name)
                    assert part.check(raw["sentence"]) and not part.check(original), f"{q.id} {part.name!r}: not new"
                else:
                    assert sorted(part.offsets) == every, (q.id, part.name)
            assert q.check(_names(q.parts)) and not q.check(q.question), q.id
            assert not q.check(_names(q.parts[: q.need - 1])), q.id
            if q.ordered:
                assert [p.offsets[0] for p in q.parts] == sorted(p.offsets[0] for p in q.parts), q.id
                assert not q.check(_names(q.parts[::-1])), q.id


def test_inserting_into_a_given_text_keeps_its_own_content() -> None:
    base = "\n\n".join(f"Paragraph {i} of a plain text." for i in range(400))
    text, questions = whole_facts.book_with_whole_facts("prideprejudice", text=base)
    assert questions and text.replace("\n\n", "").startswith("Paragraph 0")
    for q in questions:
        assert all(not p.unsupported(text) for p in q.parts)
