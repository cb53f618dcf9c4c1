"""Bundled question sets: questions about a bundled novel with keyword answers, to check a model end to end.

A set lives in ``data/questions/<name>.json``. Each question names the character offset in the
bundled text where its answer is stated, so an excerpt asks only what it contains
(``QuestionSet.within``), and its expected answer as keyword groups: an answer is right when it
holds one alternative of every group (case-insensitive, whole words, any whitespace between words).
The whole-book sets (``*_book.json``) also give each question a ``kind`` and a ``split`` (``tuning`` or
``heldout``, ``QuestionSet.split``): tune on the tuning split only.
``homer-qa ask --demo`` and ``benchmarks/novel_qa.py`` both read them.

The whole-document sets (``<novel>_whole.json``, ``whole_question_set``) ask what only the whole text
answers (lists, counts, order, a thread's course, comparisons, multi-hop, summary): an answer names
``parts`` (``Part``: keyword groups as above, and the offsets and verbatim ``evidence`` where the text
states it) and is right when at least ``need`` of them match, in the listed order when ``ordered``.
"""

from __future__ import annotations

import itertools
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
        object.__setattr__(self, "_patterns", _keyword_patterns(self.keywords))

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


def _keyword_patterns(keywords: tuple[tuple[str, ...], ...]) -> tuple[re.Pattern[str], ...]:
    """One case-insensitive whole-word pattern per keyword group, matching any of its alternatives."""
    return tuple(re.compile("|".join(map(_whole_words, group)), re.IGNORECASE) for group in keywords)


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


WHOLE_KINDS = ("list", "count", "order", "course", "comparison", "multihop", "summary")
"""What a whole-document question asks: a list, a count, an order of events, a thread's course and end,
a comparison across the text, a multi-hop chain over distant parts, or a summary."""
SPLITS = ("tuning", "heldout")
EVIDENCE_WINDOW_CHARS = 400
"""A part's evidence starts at most this many characters after its offset."""


@dataclass(frozen=True)
class Part:
    """One named piece of a whole-document answer: ``keywords`` as in ``KeywordQuestion`` (every group
    must match), the ``offsets`` where the text states it and, optionally, one verbatim ``evidence``
    quote per offset."""

    name: str
    keywords: tuple[tuple[str, ...], ...]
    offsets: tuple[int, ...]
    evidence: tuple[str, ...] = ()
    """Empty: the keywords themselves are the text's words at each offset."""
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name.strip() or not self.keywords or not all(self.keywords):
            raise ValueError(f"part {self.name!r} needs a name and at least one keyword in every group")
        if not self.offsets or min(self.offsets) < 0:
            raise ValueError(f"part {self.name!r} needs at least one offset, none negative")
        if self.evidence and (len(self.evidence) != len(self.offsets) or not all(q.strip() for q in self.evidence)):
            raise ValueError(f"part {self.name!r}: give one non-empty evidence quote per offset")
        object.__setattr__(self, "_patterns", _keyword_patterns(self.keywords))

    def position(self, answer: str) -> int | None:
        """Where ``answer`` has named the whole part (the latest of its groups' first matches), or ``None``."""
        found = [p.search(answer) for p in self._patterns]
        return None if None in found else max(m.start() for m in found if m)

    def check(self, answer: str) -> bool:
        """True when ``answer`` holds an alternative of every keyword group."""
        return self.position(answer) is not None

    def unsupported(self, text: str) -> list[int]:
        """The offsets whose evidence (or, without evidence, every keyword group) does not start within
        ``EVIDENCE_WINDOW_CHARS`` after them in ``text``; whitespace in a quote matches any whitespace."""
        missing = []
        for i, offset in enumerate(self.offsets):
            if self.evidence:
                quote = self.evidence[i]
                window = text[offset : offset + EVIDENCE_WINDOW_CHARS + 2 * len(quote)]
                m = re.search(r"\s+".join(map(re.escape, quote.split())), window)
                ok = m is not None and m.start() <= EVIDENCE_WINDOW_CHARS
            else:
                window = text[offset : offset + EVIDENCE_WINDOW_CHARS]
                ok = all(p.search(window) for p in self._patterns)
            if not ok:
                missing.append(offset)
        return missing


_LIST_MARKER = re.compile(r"(?m)^([ \t]*)(\d+[.)]|[-*\u2022])(?=\s)")


def unlisted(answer: str) -> str:
    """``answer`` with its list markers ("2.", "3)", "-") at line starts blanked (same length): a list's
    numbering is not a count ("three times: 1. ... 2. ..." does not say "2")."""
    return _LIST_MARKER.sub(lambda m: m.group(1) + " " * len(m.group(2)), answer)


@dataclass(frozen=True)
class WholeQuestion:
    """A question only the whole document answers: right when at least ``need`` of its ``parts`` match
    (and, when ``ordered``, the matched parts first appear in the answer in the listed order)."""

    id: str
    question: str
    kind: str
    split: str
    need: int
    parts: tuple[Part, ...]
    ordered: bool = False

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError(f"question {self.id!r} has no text")
        if self.kind not in WHOLE_KINDS:
            raise ValueError(f"question {self.id!r}: kind {self.kind!r} is none of {', '.join(WHOLE_KINDS)}")
        if self.split not in SPLITS:
            raise ValueError(f"question {self.id!r}: split {self.split!r} is none of {', '.join(SPLITS)}")
        if not self.parts or len({p.name for p in self.parts}) != len(self.parts):
            raise ValueError(f"question {self.id!r} needs parts with distinct names")
        if isinstance(self.need, bool) or not isinstance(self.need, int) or not 1 <= self.need <= len(self.parts):
            raise ValueError(f"question {self.id!r}: need {self.need!r} is not between 1 and {len(self.parts)}")
        if not isinstance(self.ordered, bool):
            raise ValueError(f"question {self.id!r}: ordered must be true or false")

    def matched(self, answer: str) -> list[str]:
        """The names of the parts ``answer`` matches, in the listed order."""
        answer = unlisted(answer)
        return [p.name for p in self.parts if p.check(answer)]

    def check(self, answer: str) -> bool:
        """True when ``answer`` matches at least ``need`` parts (in the listed order when ``ordered``)."""
        answer = unlisted(answer)
        found = [at for at in (p.position(answer) for p in self.parts) if at is not None]
        if len(found) < self.need:
            return False
        return not self.ordered or all(a < b for a, b in itertools.pairwise(found))

    def expected(self) -> str:
        """The parts as a reader would write them, e.g. ``2 of: a; b; c (in this order)``."""
        names = "; ".join(p.name for p in self.parts)
        head = "all of" if self.need == len(self.parts) else f"{self.need} of"
        return f"{head}: {names}" + (" (in this order)" if self.ordered else "")

    @property
    def offsets(self) -> tuple[int, ...]:
        """Every part's evidence offsets, in text order."""
        return tuple(sorted(o for p in self.parts for o in p.offsets))

    @property
    def span(self) -> tuple[int, int]:
        """The first and last evidence offsets."""
        return self.offsets[0], self.offsets[-1]


@dataclass(frozen=True)
class WholeQuestionSet:
    """Whole-document questions about one bundled document, in the file's order."""

    name: str
    document: Path
    title: str
    about: str
    questions: tuple[WholeQuestion, ...]

    def __len__(self) -> int:
        return len(self.questions)

    def split(self, name: str) -> WholeQuestionSet:
        """Only the questions of split ``name`` (``tuning`` or ``heldout``)."""
        kept = tuple(q for q in self.questions if q.split == name)
        return WholeQuestionSet(self.name, self.document, self.title, self.about, kept)


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a list of strings, not {value!r}")
    return tuple(value)


def _part(raw: dict) -> Part:
    evidence = raw.get("evidence", [])
    offsets = raw["offsets"]
    if not isinstance(offsets, list) or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise TypeError(f"offsets must be a list of integers, not {offsets!r}")
    if isinstance(evidence, str):  # one quote for every offset
        evidence = [evidence] * len(offsets)
    if not isinstance(raw["keywords"], list):
        raise TypeError(f"keywords must be a list of groups, not {raw['keywords']!r}")
    return Part(
        name=str(raw["name"]),
        keywords=tuple(_strings(group, "a keyword group") for group in raw["keywords"]),
        offsets=tuple(offsets),
        evidence=_strings(evidence, "evidence"),
    )


def whole_question_set(name: str = "prideprejudice") -> WholeQuestionSet:
    """The bundled whole-document set of novel ``name`` (``data/questions/<name>_whole.json``); raises
    ``ValueError`` for an unknown name or a malformed file."""
    path = QUESTIONS_DIR / f"{name}_whole.json"
    if not path.is_file():
        known = ", ".join(sorted(p.name.removesuffix("_whole.json") for p in QUESTIONS_DIR.glob("*_whole.json")))
        raise ValueError(f"no bundled whole-document question set {name!r}; bundled: {known or 'none'}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        questions = tuple(
            WholeQuestion(
                id=str(q["id"]),
                question=str(q["question"]),
                kind=str(q["kind"]),
                split=str(q["split"]),
                need=q["need"],
                parts=tuple(_part(p) for p in q["parts"]),
                ordered=q.get("ordered", False),
            )
            for q in raw["questions"]
        )
        document = Path(__file__).parent / "data" / str(raw["document"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"malformed whole-document question set {path}: {exc}") from exc
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"malformed whole-document question set {path}: repeated question ids")
    return WholeQuestionSet(name, document, str(raw.get("title", name)), str(raw.get("about", "")), questions)
