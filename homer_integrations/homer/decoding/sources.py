"""Sources: the spans of a document an answer was read from, by the attention its tokens paid the cache.

While a question and its answer are decoded over a kept cache, the attention each stored token receives
in the upper half of the layers is summed (``kv.kept.KeptLayer``'s ``attended``), less what a read without
the question attends to (the document's start and the text just before the question draw attention
whatever is asked: ``research/sources_bias.py``). The document is cut into units a reader can check
(paragraphs, a long one at sentence ends), each unit scores the attention its kept tokens received, and
the best few units are cited as character spans; neighbouring cited units join. The cache
keeps only some of a long document's tokens (the passages a question re-reads, a root's survivors), so
only the units it kept can be cited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

MOST_SOURCES = 5
"""Most spans an answer cites."""
SHARE_OF_BEST = 0.25
"""A unit is cited when its attention is at least this share of the best unit's."""
FROM_DEPTH = 0.5
"""Sources count the attention of the layers from this share of the model's depth up: the lower layers attend
mostly to the text just before the question, whatever it asks (``research/sources_bias.py``)."""
UNIT_CHARS = 1200
"""A paragraph longer than this is cut at sentence ends into units of about this many characters."""

_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


@dataclass(frozen=True)
class CitedSpan:
    """A span of the document, ``text[start:end]``; ``score``: its share of the attention the answer paid
    the document (0-1)."""

    start: int
    end: int
    score: float

    def as_dict(self) -> dict[str, float | int]:
        return {"start": self.start, "end": self.end, "score": round(self.score, 4)}


def units(text: str, longest: int = UNIT_CHARS) -> torch.Tensor:
    """[U, 2] character spans that cover ``text``'s non-blank parts: its paragraphs, each longer than
    ``longest`` cut at the sentence end nearest past every ``longest`` characters."""
    spans: list[tuple[int, int]] = []
    start = 0
    for gap in [*_PARAGRAPH.finditer(text), None]:
        end = len(text) if gap is None else gap.start()
        while end - start > longest:
            cut = _SENTENCE_END.search(text, start + longest, end)
            if cut is None:
                break
            spans.append((start, cut.end()))
            start = cut.end()
        if text[start:end].strip():
            spans.append((start, end))
        start = end if gap is None else gap.end()
    return torch.tensor(spans, dtype=torch.long).reshape(-1, 2)


def cite(
    attended: torch.Tensor,
    origin: torch.Tensor,
    offsets: torch.Tensor,
    text: str,
    most: int = MOST_SOURCES,
    share: float = SHARE_OF_BEST,
    baseline: torch.Tensor | None = None,
) -> list[CitedSpan]:
    """The spans of ``text`` an answer was read from, in document order.

    ``attended`` [K]: attention each cache token received; ``origin`` [K]: its document token (-1 for the
    prompt around the document); ``offsets`` [N, 2]: each document token's character span. The units
    (``units``) holding the most attention are cited, at most ``most``, each at least ``share`` of the best;
    touching cited units become one span. ``baseline`` [K]: what a read without the question attends to (the
    start of the document, the text just before the question); each is taken as shares of its total and
    only what the question adds counts. Empty when the document received no attention."""
    if baseline is not None:
        attended = (attended / attended.sum().clamp(min=1e-9) - baseline / baseline.sum().clamp(min=1e-9)).clamp(min=0)
    doc = (origin >= 0) & (origin < offsets.shape[0])
    if not bool(doc.any()):
        return []
    mass = attended[doc].float()
    starts = offsets[origin[doc], 0]
    spans = units(text)
    if spans.numel() == 0:
        return []
    unit = (torch.searchsorted(spans[:, 0].contiguous(), starts, right=True) - 1).clamp(min=0)
    per_unit = torch.zeros(spans.shape[0], dtype=torch.float32).index_add_(0, unit, mass)
    total = float(per_unit.sum())
    if total <= 0:
        return []
    best = per_unit.topk(min(most, per_unit.numel()))
    chosen = sorted(
        int(i) for i, s in zip(best.indices, best.values, strict=True) if float(s) >= share * float(best.values[0])
    )
    cited: list[CitedSpan] = []
    for i in chosen:
        start, end = int(spans[i, 0]), int(spans[i, 1])
        score = float(per_unit[i]) / total
        if cited and i - 1 in chosen and _touching(text, cited[-1].end, start):
            last = cited[-1]
            cited[-1] = CitedSpan(last.start, end, last.score + score)
        else:
            cited.append(CitedSpan(start, end, score))
    return cited


def _touching(text: str, end: int, start: int) -> bool:
    """Whether only whitespace lies between a span ending at ``end`` and one starting at ``start``."""
    return not text[end:start].strip()
