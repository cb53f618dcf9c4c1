"""Passages: a document's statements grouped into passages, ranked by BM25 (and, on request, by question
attention too), kept whole.

At book length (100k tokens and more) the per-question selection of single statements by question
attention keeps the asked fact less often than BM25 over whole passages (Northanger Abbey, 102k
tokens, Qwen2.5-Coder-1.5B, a 2k budget, tuning split: the answer's words kept for 19 of 36 questions
against 28 of 36; ``research/book_selection.py``), and when it keeps the fact it keeps it without the
sentences around it that the model needs to read it (a sixth of the 600 characters around the answer,
against three fifths). ``PassageSelection`` keeps whole passages instead. Attention alone over passages
ranks far worse than BM25, and fusing it with BM25 (reciprocal-rank fusion, ``attention=1``) ties BM25
alone over the same passages (28 of 36 at 2k and 4k tokens; at 1k the fusion 26, BM25 25): at this
length whole passages, not attention, close the gap to the retrieval route. So BM25 alone is the
default (``attention=0``), and it needs no leaf tier: the selection reads the document's text only.
A kept passage also keeps the heading it falls under (a corpus's ``Document: <name>`` line), so the
model knows which document it read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from homer_integrations.homer.scoring.lexical import BM25Index, snowball


class Passages:
    """A document's passages: runs of whole statements of at most ``tokens`` tokens, each read with the
    ``overlap`` tokens before it (as a text splitter's chunks overlap, so a fact at a passage's start
    keeps the sentence that leads to it).

    ``starts``, ``stops`` [M]: each passage's document token span (overlap included); ``headings`` [M, 2]:
    the token span of the heading each passage falls under (``heading_spans``; [0, 0], empty, where none
    does); ``index``: BM25 over the passages' texts.
    """

    def __init__(
        self,
        starts: torch.Tensor,
        stops: torch.Tensor,
        texts: Sequence[str],
        headings: torch.Tensor | None = None,
        stemmer: str | None = "english",
    ) -> None:
        if not (len(texts) == starts.numel() == stops.numel()) or not bool((stops > starts).all()):
            raise ValueError(f"{len(texts)} passage texts for {starts.numel()} spans, or an empty span")
        self.starts, self.stops = starts, stops
        self.headings = torch.zeros(starts.numel(), 2, dtype=torch.long) if headings is None else headings
        if self.headings.shape != (starts.numel(), 2):
            raise ValueError(f"heading spans {tuple(self.headings.shape)} for {starts.numel()} passages")
        self.index = BM25Index([t if t.strip() else "-" for t in texts], stemmer=stemmer)

    def __len__(self) -> int:
        return self.starts.numel()

    @classmethod
    def of(
        cls,
        tokenizer,
        document_ids: torch.Tensor,
        statements: torch.Tensor,
        tokens: int,
        overlap: int = 0,
        heading: str | None = None,
        stemmer: str | None = "english",
    ) -> Passages:
        """The passages of a document's token ids [N] whose statement index per token is ``statements``
        [N] (``unit_ids(..., "statement")``); see ``spans``. A statement whose stripped text fullmatches
        the regex ``heading`` is a heading (None: there are none); see ``heading_spans``. BM25 stems the
        passages' words with ``stemmer`` (``BM25Index``)."""
        counts = torch.bincount(statements - statements.min())
        counts = counts[counts > 0]
        texts = tokenizer.batch_decode([p.tolist() for p in torch.split(document_ids, counts.tolist())])
        ends = [t.rstrip(" \t").endswith("\n\n") for t in texts]
        starts, stops = spans(counts, ends, tokens, overlap)
        pieces = [document_ids[a:b].tolist() for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
        # the statement splitter ends a statement at a line break, so a heading line is a statement of its own
        # (a corpus's header "Document: <name>\n\n" is followed by a blank line), unless the line itself holds
        # a sentence end followed by a space (a name such as "Notes. Draft"): such a heading is not found
        is_heading = [heading is not None and re.fullmatch(heading, t.strip()) is not None for t in texts]
        headings = heading_spans(counts, torch.tensor(is_heading, dtype=torch.bool), starts)
        return cls(starts, stops, tokenizer.batch_decode(pieces), headings, stemmer)

    @functools.cached_property
    def documents(self) -> int:
        """How many documents the text joins: the distinct headings its passages fall under (at least one)."""
        spans = self.headings[self.headings[:, 1] > self.headings[:, 0]]
        return max(1, len({tuple(span) for span in spans.tolist()}))

    def tokens(self, passage: int) -> torch.Tensor:
        """Document token indices of ``passage``."""
        return torch.arange(int(self.starts[passage]), int(self.stops[passage]))

    def heading(self, passage: int) -> torch.Tensor:
        """Document token indices of the heading ``passage`` falls under (none where it falls under none)."""
        return torch.arange(int(self.headings[passage, 0]), int(self.headings[passage, 1]))

    def best(self, scores: torch.Tensor) -> torch.Tensor:
        """Each passage's best token score [M] from the document's scores [N]."""
        scores = scores.float().cpu()
        return torch.stack([scores[a:b].max() for a, b in zip(self.starts.tolist(), self.stops.tolist(), strict=True)])


def spans(
    counts: torch.Tensor, paragraph_ends: Sequence[bool], tokens: int, overlap: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Passage token spans (starts [M], stops [M]) over statements of ``counts`` [U] tokens: a statement
    joins the current passage while it stays within ``tokens``; a passage at least half full ends at a
    paragraph's end; a statement longer than ``tokens`` is cut into pieces of ``tokens``; each passage
    then starts ``overlap`` tokens earlier."""
    if tokens < 1 or overlap < 0:
        raise ValueError(f"a passage needs at least one token and a non-negative overlap, not {tokens}, {overlap}")
    starts: list[int] = []
    at, filled = 0, tokens
    for size, paragraph_end in zip(counts.tolist(), paragraph_ends, strict=True):
        if filled + size > tokens:  # a new passage, and a statement longer than one cut into pieces
            starts.append(at)
            filled = 0
            while size > tokens:
                at, size = at + tokens, size - tokens
                starts.append(at)
        at, filled = at + size, filled + size
        if paragraph_end and filled * 2 >= tokens:
            filled = tokens  # the next statement starts a passage
    stops = torch.tensor([*starts[1:], at], dtype=torch.long)
    return (torch.tensor(starts, dtype=torch.long) - overlap).clamp(min=0), stops


def heading_spans(counts: torch.Tensor, is_heading: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The token span [M, 2] of the heading each passage starting at ``starts`` [M] falls under: the last
    statement (of ``counts`` [U] tokens) flagged by ``is_heading`` [U] that starts at or before the
    passage's start; [0, 0] where none does."""
    if not bool(is_heading.any()):
        return torch.zeros(starts.numel(), 2, dtype=torch.long)
    ends = counts.cumsum(0)
    spans = torch.stack([(ends - counts)[is_heading], ends[is_heading]], dim=1)  # [H, 2]
    found = torch.searchsorted(spans[:, 0].contiguous(), starts, right=True) - 1  # [M]
    return torch.where((found >= 0)[:, None], spans[found.clamp(min=0)], 0)


@dataclass(frozen=True)
class PassageSelection:
    """Keep whole passages of about ``tokens`` tokens (each with the ``overlap`` tokens before it), best
    first by BM25 over the passages (fused by reciprocal rank, constant ``fusion``, with question
    attention's ranking of each passage's best statement when ``attention`` > 0), until the budget is
    full; a passage that would overflow it is passed over for the next one. Each passage kept keeps the
    ``heading`` it falls under too, where that fits. Defaults: ``research/book_selection.py`` on the
    tuning split."""

    tokens: int = 128
    overlap: int = 48
    fusion: int = 60
    attention: float = 0.0
    """Weight of attention's reciprocal rank against BM25's (0: BM25 alone orders the passages, and no
    attention scores, hence no leaf tier, are needed)."""
    heading: str | None = r"Document: [^\n]+"
    """What a heading is: a regex a statement's stripped text fullmatches (None: no headings). The default
    is the corpus layout's header (``corpus.questions.HEADER``), so a passage from a document's middle is
    read with its document's name; a book has no such line. A heading kept costs budget like any token:
    it is taken with a passage where both fit, else the passage alone; once kept it costs nothing again."""
    stemmer: str | None = "english"
    """The Snowball stemmer BM25 reduces words with (a PyStemmer algorithm: ``"german"``, ``"french"``,
    ...; None: words as written). English kept the answer of more whole-book questions (``BM25Index``)."""

    def __post_init__(self) -> None:
        if self.tokens < 16:
            raise ValueError(f"PassageSelection.tokens must be at least 16, not {self.tokens}")
        if self.fusion < 1:
            raise ValueError(f"PassageSelection.fusion must be at least 1, not {self.fusion}")
        if self.attention < 0:
            raise ValueError(f"PassageSelection.attention must not be negative, not {self.attention}")
        snowball(self.stemmer)  # an unknown stemmer fails here, not at the first question

    def passages(self, tokenizer, document_ids: torch.Tensor, statements: torch.Tensor) -> Passages:
        """This selection's passages of a document (token ids [N], statement index per token [N])."""
        return Passages.of(tokenizer, document_ids, statements, self.tokens, self.overlap, self.heading, self.stemmer)

    def ranking(self, question: str, scores: torch.Tensor | None, passages: Passages) -> list[int]:
        """Passage indices, best first, from BM25 on ``question`` and the document's attention scores [N]
        (None when ``attention`` is 0)."""
        fused = torch.zeros(len(passages), dtype=torch.float64)
        if self.attention > 0:
            if scores is None:
                raise ValueError("this PassageSelection weighs question attention: pass the document's scores")
            by_attention = passages.best(scores).argsort(descending=True, stable=True)
            fused[by_attention] += self.attention / (self.fusion + torch.arange(len(passages), dtype=torch.float64))
        for place, hit in enumerate(passages.index.search(question, len(passages))):
            fused[hit.index] += 1.0 / (self.fusion + place)
        return fused.argsort(descending=True, stable=True).tolist()

    def select(self, question: str, scores: torch.Tensor | None, passages: Passages, budget: int) -> torch.Tensor:
        """Ascending document token indices [K] of the best passages, K <= ``budget``."""
        taken = self.taken(question, scores, passages, budget)
        if not taken:
            raise ValueError(f"no passage of {self.tokens} tokens fits a budget of {budget}")
        return torch.cat(taken).sort().values

    def taken(self, question: str, scores: torch.Tensor | None, passages: Passages, budget: int) -> list[torch.Tensor]:
        """The document token indices each kept passage adds (with its heading's, ascending), best passage
        first (``select``'s order of taking)."""
        room, runs = budget, []
        taken = torch.zeros(int(passages.stops.max()), dtype=torch.bool)
        for passage in self.ranking(question, scores, passages):
            span = passages.tokens(passage)
            if bool(taken[span].all()):
                continue  # kept already, by others' overlaps: nothing to take, its heading included
            headed = torch.cat([passages.heading(passage), span]).unique()  # a heading may reach into its passage
            for read in (headed, span):  # the heading where it fits, else the passage alone
                fresh = read[~taken[read]]  # an overlap (or a heading) already kept costs nothing again
                if 0 < fresh.numel() <= room:
                    taken[fresh] = True
                    room -= fresh.numel()
                    runs.append(fresh)
                    break
            if room < 16:
                break
        return runs
