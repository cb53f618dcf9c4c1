"""Bundled question sets: questions about a bundled novel with keyword answers, to check a model end to end.

A set lives in ``data/questions/<name>.json``. Each question names the character offset in the
bundled text where its answer is stated, so an excerpt asks only what it contains
(``QuestionSet.within``), and its expected answer as keyword groups: an answer is right when it
holds one alternative of every group (case-insensitive, whole words, any whitespace between words).
The whole-book sets (``*_book.json``) also give each question a ``kind`` and a ``split`` (``tuning`` or
``heldout``, ``QuestionSet.split``): tune on the tuning split only.
``homer-qa ask --demo`` and ``benchmarks/novel_qa.py`` both read them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

QUESTIONS_DIR = Path(__file__).parent / "data" / "questions"
ANSWER_MARGIN_CHARS = 200
"""Characters after a question's offset that an excerpt must also hold (the rest of the answer's sentence)."""


@dataclass(frozen=True)
class KeywordQuestion:
    """One question; ``keywords``: groups of alternatives, every group must match."""

    id: str
    question: str
    keywords: tuple[tuple[str, ...], ...]
    offset: int
    kind: str = ""
    """who, what, where, when or why; empty when the set does not say."""
    split: str = ""
    """``tuning`` or ``heldout``; empty when the set does not say."""
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.question.strip() or not self.keywords or not all(self.keywords):
            raise ValueError(f"question {self.id!r} needs text and at least one keyword in every group")
        patterns = tuple(re.compile("|".join(map(_whole_words, group)), re.IGNORECASE) for group in self.keywords)
        object.__setattr__(self, "_patterns", patterns)

    def check(self, answer: str) -> bool:
        """True when ``answer`` holds an alternative of every keyword group."""
        return not self.missing(answer)

    def missing(self, answer: str) -> list[tuple[str, ...]]:
        """The keyword groups ``answer`` does not match (empty when it is right)."""
        return [group for group, p in zip(self.keywords, self._patterns, strict=True) if not p.search(answer)]

    def expected(self) -> str:
        """The keywords as a reader would write them: ``a / b`` within a group, ``+`` between groups."""
        return " + ".join(" / ".join(group) for group in self.keywords)


@dataclass(frozen=True)
class QuestionSet:
    """Questions about one bundled document, in document order."""

    name: str
    document: Path
    title: str
    questions: tuple[KeywordQuestion, ...]

    def __len__(self) -> int:
        return len(self.questions)

    def within(self, chars: int) -> QuestionSet:
        """Only the questions whose answer lies in the first ``chars`` characters of the document."""
        kept = tuple(q for q in self.questions if q.offset + ANSWER_MARGIN_CHARS <= chars)
        return QuestionSet(self.name, self.document, self.title, kept)

    def spread(self, count: int) -> tuple[KeywordQuestion, ...]:
        """``count`` questions evenly spaced through the set (all of them when it has no more)."""
        n = len(self.questions)
        if count >= n:
            return self.questions
        return tuple(self.questions[round(i * (n - 1) / max(count - 1, 1))] for i in range(count))

    def split(self, name: str) -> QuestionSet:
        """Only the questions of split ``name`` (``tuning`` or ``heldout``)."""
        return QuestionSet(self.name, self.document, self.title, tuple(q for q in self.questions if q.split == name))


def _whole_words(keyword: str) -> str:
    words = map(re.escape, keyword.split())
    return r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)"


def question_set(name: str = "prideprejudice") -> QuestionSet:
    """The bundled set ``name``; raises ``ValueError`` for an unknown name or a malformed file."""
    path = QUESTIONS_DIR / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in QUESTIONS_DIR.glob("*.json")))
        raise ValueError(f"no bundled question set {name!r}; bundled: {known}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    try:
        questions = tuple(
            KeywordQuestion(
                id=str(q["id"]),
                question=str(q["question"]),
                keywords=tuple(tuple(str(k) for k in group) for group in q["keywords"]),
                offset=int(q["offset"]),
                kind=str(q.get("kind", "")),
                split=str(q.get("split", "")),
            )
            for q in raw["questions"]
        )
        document = Path(__file__).parent / "data" / str(raw["document"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed question set {path}: {exc!r}") from exc
    return QuestionSet(name, document, str(raw.get("title", name)), tuple(sorted(questions, key=lambda q: q.offset)))
