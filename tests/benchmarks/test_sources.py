"""The sources benchmark's bookkeeping: an evidence offset is cited when a span overlaps it; the summary."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from sources import covered, evidence, markdown, questions, summarize

from homer_integrations.question_sets import whole_question_set


def test_an_offset_is_cited_when_a_span_overlaps_its_evidence() -> None:
    spans = [{"start": 100, "end": 300, "score": 0.5}]
    assert covered(250, spans) and covered(0, spans)  # evidence from 0 runs past 100
    assert not covered(300, spans) and not covered(-250, spans)


def test_questions_and_their_evidence_come_from_the_bundled_sets() -> None:
    lookups = questions("northangerabbey", "book", "heldout", 40_000)
    assert lookups and all(q.offset + 200 <= 40_000 and q.split == "heldout" for q in lookups)
    assert evidence(lookups[0]) == [lookups[0].offset]
    whole = questions("northangerabbey", "whole", "all", None)
    assert len(whole) == len(whole_question_set("northangerabbey").questions)
    assert evidence(whole[0]) == sorted(whole[0].offsets) and len(evidence(whole[0])) >= 2


def test_the_summary_counts_evidence_cited_for_right_answers() -> None:
    row = {"book": "b", "set": "book", "chars": 0, "mode": "full", "method": "m", "split": "heldout"}
    rows = [
        {**row, "correct": True, "covered": [True, False], "sources": [{}, {}]},
        {**row, "correct": True, "covered": [True], "sources": [{}]},
        {**row, "correct": False, "covered": [False], "sources": [{}, {}, {}]},
    ]
    (s,) = summarize(rows)
    assert (s["answers"], s["right"], s["evidence_cited"], s["evidence_offsets"]) == (3, 2, round(2 / 3, 3), 3)
    assert s["all_answers_evidence_cited"] == 0.5 and s["mean_spans"] == 2.0 and s["most_spans"] == 3
    assert "| b | book | whole book | full | m | heldout | 2/3 | 0.67 (3 offsets) | 0.50 | 2.0 / 3 |" in markdown([s])
