"""Invented multi-part facts for the whole-book benchmark: only reading several places of the book answers them.

``whole_facts.json`` is a list of facts, each a whole-document question about one bundled novel:
``{"id", "book", "kind", "split", "question", "need", "ordered"?, "parts": [{"name", "keywords",
"depth", "sentence"}]}``. Every part's ``sentence`` is inserted into the book as a paragraph of its own
at its ``depth`` (0-1) with ``corpus_qa.insert_paragraph``: a code given in three pieces, the items of a
list, the visits of a count. A part without ``depth`` and ``sentence`` (the count itself) is stated by
the fact's other parts together. The facts are scored as ``question_sets.WholeQuestion``: right when at
least ``need`` parts match, in the listed order when ``ordered``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import Part, WholeQuestion

HERE = Path(__file__).parent
FACTS = HERE / "whole_facts.json"


def load_facts(path: Path = FACTS) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


def book_with_whole_facts(
    book: str, facts: list[dict[str, Any]] | None = None, text: str | None = None
) -> tuple[str, list[WholeQuestion]]:
    """``text`` (by default the bundled ``book``) with the sentences of ``book``'s facts inserted at their
    depths, and each fact as a ``WholeQuestion`` whose parts' offsets are where their sentences stand in
    the returned text (a part without a sentence: where all the fact's sentences stand)."""
    sys.path.insert(0, str(HERE))
    from corpus_qa import insert_paragraph  # here: corpus_qa imports the whole-book benchmark

    text = bundled_text(book) if text is None else text
    facts = [f for f in (load_facts() if facts is None else facts) if f["book"] == book]
    stated = [p for f in facts for p in f["parts"] if "sentence" in p]
    # deepest first, so each depth is measured on the text before the insertions above it
    for part in sorted(stated, key=lambda p: -p["depth"]):
        text = insert_paragraph(text, part["depth"], part["sentence"])
    offsets: dict[str, int] = {}
    for part in stated:
        paragraph = "\n\n" + part["sentence"]
        at = text.find(paragraph)
        if at < 0 or text.find(paragraph, at + 1) >= 0:
            raise ValueError(f"{book}: the sentence of part {part['name']!r} is not in the text exactly once")
        offsets[part["sentence"]] = at + 2
    return text, [_question(fact, offsets) for fact in facts]


def _question(fact: dict[str, Any], offsets: dict[str, int]) -> WholeQuestion:
    sentences = [p["sentence"] for p in fact["parts"] if "sentence" in p]
    parts = []
    for p in fact["parts"]:
        own = [p["sentence"]] if "sentence" in p else sentences
        keywords = tuple(tuple(group) for group in p["keywords"])
        parts.append(Part(p["name"], keywords, tuple(offsets[s] for s in own), tuple(own)))
    return WholeQuestion(
        fact["id"],
        fact["question"],
        fact["kind"],
        fact["split"],
        fact["need"],
        tuple(parts),
        fact.get("ordered", False),
    )
