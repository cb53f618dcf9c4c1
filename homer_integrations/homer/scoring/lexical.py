"""Lexical evidence: BM25 over a document's statements, a second way to find what a question asks.

Question attention finds paraphrase and who-did-what, and misses what BM25 finds at once: the exact
name or number the question repeats, in a statement the leaves' attention ranked low. BM25 misses the
converse. ``LexicalEvidence`` runs BM25 (``bm25s``) over the document's statements (``unit_ids``'
``statement`` units, up to ``.!?`` or a line break) and hands the best statements' tokens to the
per-question selection, which keeps them beside its own choice before the re-read (a union of both
candidate sets within one budget: ``share`` of it for the lexical side at most).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Passage:
    """A retrieved text: its text, its index among the indexed texts, and its BM25 score."""

    text: str
    index: int
    score: float


_CJK_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]{2,}")
"""Two or more kana, CJK ideographs or hangul in a row: text written without spaces between words."""


def cjk_bigrams(text: str) -> str:
    """``text`` with each run of CJK characters spelled as its overlapping character pairs, spaced
    ("東京都" -> "東京 京都"): BM25's word pattern takes a whole unspaced run as one word, so a question
    never matched a passage unless it repeated the passage's run exactly. Pairs are the usual CJK unit
    for retrieval without a segmenter (Lucene's CJKBigramFilter)."""
    return _CJK_RUN.sub(lambda m: " " + " ".join(m[0][i : i + 2] for i in range(len(m[0]) - 1)) + " ", text)


def snowball(stemmer: str | None):
    """PyStemmer's Snowball stemmer of that name (None: no stemmer); a clear error for an unknown one."""
    if stemmer is None:
        return None
    import Stemmer

    if stemmer not in Stemmer.algorithms():
        raise ValueError(f"{stemmer!r} is not a Snowball stemmer; known: {', '.join(Stemmer.algorithms())}, or None")
    return Stemmer.Stemmer(stemmer)


class BM25Index:
    """BM25 (``bm25s``) over texts, built once; ``search`` returns the best ones.

    Words are stemmed (PyStemmer's Snowball ``stemmer``; None: matched as written), so a question that says
    "marry" finds a passage that says "married", as LlamaIndex's BM25 retriever does. Over both bundled
    novels whole (2,048 tokens kept, ``research/bm25_stemming.py``), stemming kept the answer's
    words for 53 of 63 tuning questions against 50, and for 102 of 126 held out against 96.
    """

    def __init__(self, texts: Sequence[str], *, stopwords: str | None = "en", stemmer: str | None = "english") -> None:
        import bm25s

        if not texts:
            raise ValueError("BM25Index needs at least one text")
        self.chunks = list(texts)
        self._stopwords = stopwords
        self._stemmer = snowball(stemmer)
        words = self._tokenize(self.chunks)
        # a text of no word BM25 knows (digits, emoji, one-letter words): bm25s cannot index an empty
        # vocabulary, and nothing would match anyway; every search then finds nothing (document order)
        self._bm25 = bm25s.BM25() if any(words) else None
        if self._bm25 is not None:
            self._bm25.index(words, show_progress=False)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        # strings, not ids: each tokenize() call numbers words its own way
        return bm25s.tokenize(
            [cjk_bigrams(t) for t in texts],
            stopwords=self._stopwords,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` best texts for ``query`` with a positive score, best first."""
        k = min(k, len(self.chunks))
        asked = self._tokenize([query])
        if k <= 0 or self._bm25 is None or not any(asked):
            return []
        ids, scores = self._bm25.retrieve(asked, k=k, show_progress=False)
        return [Passage(self.chunks[int(i)], int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


class Statements:
    """A document's statements as BM25 sees them: their texts and token spans.

    ``units`` [N]: each document token's statement index (non-decreasing); ``texts``: one per statement.
    """

    def __init__(self, units: torch.Tensor, texts: Sequence[str]) -> None:
        counts = torch.bincount(units - units.min())
        self.starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
        self.counts = counts
        if len(texts) != counts.numel():
            raise ValueError(f"{len(texts)} statement texts for {counts.numel()} statements")
        searchable = [t if t.strip() else "-" for t in texts]
        self.index = BM25Index(searchable)

    @classmethod
    def of(cls, tokenizer, document_ids: torch.Tensor, units: torch.Tensor) -> Statements:
        """The statements of a document's token ids [N] split by ``units`` [N] (``unit_ids(..., "statement")``)."""
        counts = torch.bincount(units - units.min()).tolist()
        pieces = torch.split(document_ids, counts)
        return cls(units, tokenizer.batch_decode([p.tolist() for p in pieces]))

    def tokens(self, statement: int) -> torch.Tensor:
        """Document token indices of ``statement``."""
        start = int(self.starts[statement])
        return torch.arange(start, start + int(self.counts[statement]))


@dataclass(frozen=True)
class LexicalEvidence:
    """The best BM25 statements for the question, up to ``share`` of the budget, kept whatever attention said.

    ``search``: statements BM25 ranks (best first); a statement that would overflow the lexical
    share is passed over for the next one.
    """

    share: float = 0.25
    search: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"LexicalEvidence.share must be in (0, 1), not {self.share}")

    def tokens(self, question: str, statements: Statements, budget: int) -> torch.Tensor:
        """Ascending document token indices [E] of the best statements, E <= ``share`` x ``budget``."""
        room = int(self.share * budget)
        chosen: list[torch.Tensor] = []
        for hit in statements.index.search(question, self.search):
            size = int(statements.counts[hit.index])
            if size <= room:
                chosen.append(statements.tokens(hit.index))
                room -= size
        if not chosen:
            return torch.zeros(0, dtype=torch.long)
        return torch.cat(chosen).sort().values
