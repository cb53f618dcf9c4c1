"""The retrieval side of routing: BM25 over a document's chunks, and the short prompt over the hits.

Framework-free: chunks come from the caller (LangChain's text splitters, LlamaIndex's node
parsers), and the prompt is plain text for the same model that answers through HOMER.
"""

from __future__ import annotations

from collections.abc import Sequence

from homer_integrations.homer.lexical import BM25Index, Passage

__all__ = ["DEFAULT_RETRIEVAL_INSTRUCTION", "BM25Index", "Passage", "retrieval_prompt"]


DEFAULT_RETRIEVAL_INSTRUCTION = "Answer in a few words, using only the text."


def retrieval_prompt(question: str, passages: Sequence[str], instruction: str | None = None) -> str:
    """The user message that answers ``question`` from retrieved ``passages`` only.

    ``instruction`` closes the prompt instead of ``DEFAULT_RETRIEVAL_INSTRUCTION`` (self-route
    puts its "write unanswerable" rule there). The layout (text, question, one closing rule)
    is the one small instruct models followed best in a trial on SmolLM2-135M.
    """
    text = "\n\n".join(p.strip() for p in passages) if passages else "(nothing relevant was found)"
    return f"Text:\n{text}\n\nQuestion: {question}\n{instruction or DEFAULT_RETRIEVAL_INSTRUCTION}"
