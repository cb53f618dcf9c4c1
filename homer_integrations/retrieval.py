"""The retrieval side of routing: BM25 over a document's chunks, and the short prompt over the hits.

Framework-free: chunks come from the caller (LangChain's text splitters, LlamaIndex's node
parsers), and the prompt is plain text for the same model that answers through HOMER.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk: its text, its index among the chunks, and its BM25 score."""

    text: str
    index: int
    score: float


class BM25Index:
    """BM25 (``bm25s``) over text chunks, built once; ``search`` returns the best chunks."""

    def __init__(self, chunks: Sequence[str], *, stopwords: str | None = "en") -> None:
        import bm25s

        if not chunks:
            raise ValueError("BM25Index needs at least one chunk")
        self.chunks = list(chunks)
        self._stopwords = stopwords
        self._bm25 = bm25s.BM25()
        self._bm25.index(self._tokenize(self.chunks), show_progress=False)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        # strings, not ids: each tokenize() call numbers words its own way
        return bm25s.tokenize(texts, stopwords=self._stopwords, return_ids=False, show_progress=False)

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` best chunks for ``query`` with a positive score, best first."""
        k = min(k, len(self.chunks))
        if k <= 0:
            return []
        ids, scores = self._bm25.retrieve(self._tokenize([query]), k=k, show_progress=False)
        return [Passage(self.chunks[int(i)], int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


DEFAULT_RETRIEVAL_INSTRUCTION = "Answer in a few words, using only the text."


def retrieval_prompt(question: str, passages: Sequence[str], instruction: str | None = None) -> str:
    """The user message that answers ``question`` from retrieved ``passages`` only.

    ``instruction`` closes the prompt instead of ``DEFAULT_RETRIEVAL_INSTRUCTION`` (self-route
    puts its "write unanswerable" rule there). The layout (text, question, one closing rule)
    is the one small instruct models followed best in a trial on SmolLM2-135M.
    """
    text = "\n\n".join(p.strip() for p in passages) if passages else "(nothing relevant was found)"
    return f"Text:\n{text}\n\nQuestion: {question}\n{instruction or DEFAULT_RETRIEVAL_INSTRUCTION}"
