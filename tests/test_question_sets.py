"""The bundled question sets: every answer is where the set says, and the keyword check is strict."""

import json

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
