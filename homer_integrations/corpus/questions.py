"""Questions across a corpus: one question over many documents, answered with the text it was read from.

    corpus = Corpus.from_paths(["contracts/"])  # or Corpus({"lease.txt": lease, "deed.txt": deed})
    answer = ask_corpus(engine, corpus, "Which contract lets the tenant sublet?", max_new_tokens=64)
    answer.text, [(s.name, s.start, s.end) for s in answer.sources]

The documents are laid out as one text (``Corpus.text``: each introduced by a ``Document: <name>`` line and
a blank line, separated by blank lines) and answered by the engine's per-question path (``query_aware``),
so the selection is global: past the model's window one BM25 ranking of every document's passages, each
re-read with its document's header (``PassageSelection.heading``) so the model can name the document it
read; within it HOMER's question-aware pruning; one re-read, one answer. The kept tokens' origins map,
through the tokenizer's offsets, to character ranges of that text, then to ``Source``s: (document, start,
end) in the document's own text, ranges merged where they touch, headers left out.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from homer_integrations.corpus.compress import collect_files
from homer_integrations.documents import DEFAULT_MAX_BYTES, read_document
from homer_integrations.homer.decoding.generation import GenerationOptions

if TYPE_CHECKING:
    from homer_integrations.engine.model import AnswerInfo, AnswerStream, HomerModel

HEADER = "Document: {name}\n\n"
"""What introduces each document in ``Corpus.text``."""
SEPARATOR = "\n\n"
"""What separates one document from the next header."""


@dataclass(frozen=True)
class NamedText:
    """One document of a corpus: its ``name`` (one line, unique in the corpus), ``text`` and ``metadata``."""

    name: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    """Text an answer was read from: ``text == corpus[name].text[start:end]``; ``metadata`` is the document's."""

    name: str
    start: int
    end: int
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


def document_name(metadata: Mapping[str, Any], index: int, keys: Sequence[str] = ("source",)) -> str:
    """The name of a corpus's ``index``-th document (from 0): the first of ``keys`` set in its ``metadata``,
    else ``document <index + 1>``."""
    return next((str(metadata[k]) for k in keys if metadata.get(k)), f"document {index + 1}")


class Corpus:
    """Named documents in order, laid out as one text (``text``) with each document's place in it (``spans``).

    ``documents``: a mapping name -> text, or ``NamedText``s / (name, text) pairs. Refused with a
    ``ValueError``: no documents, a name that is empty, spans lines or is given twice, an empty text."""

    def __init__(self, documents: Mapping[str, str] | Iterable[NamedText | tuple[str, str]]) -> None:
        items = documents.items() if isinstance(documents, Mapping) else documents
        self.documents = tuple(d if isinstance(d, NamedText) else NamedText(*d) for d in items)
        if not self.documents:
            raise ValueError("the corpus has no documents")
        self._by_name: dict[str, NamedText] = {}
        for doc in self.documents:
            if not isinstance(doc.name, str) or not doc.name.strip() or "\n" in doc.name:
                raise ValueError(f"a document's name must be one non-empty line, not {doc.name!r}")
            if doc.name in self._by_name:
                raise ValueError(f"two documents are named {doc.name!r}: give each document its own name")
            if not isinstance(doc.text, str):
                raise TypeError(f"document {doc.name!r} must be text (str), not {type(doc.text).__name__}")
            if not doc.text.strip():
                raise ValueError(f"document {doc.name!r} is empty")
            self._by_name[doc.name] = doc
        parts, spans, at = [], [], 0
        for i, doc in enumerate(self.documents):
            header = (SEPARATOR if i else "") + HEADER.format(name=doc.name)
            parts += [header, doc.text]
            at += len(header)
            spans.append((at, at + len(doc.text)))
            at += len(doc.text)
        self.text = "".join(parts)
        """The documents as one text: what a question is answered from (built once: the engine remembers its tokens)."""
        self.spans: tuple[tuple[int, int], ...] = tuple(spans)
        """Where each document's text lies in ``text``: ``text[start:end] == documents[i].text``."""

    @classmethod
    def from_paths(cls, paths: str | Path | Iterable[str | Path], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Corpus:
        """The files named and the supported files under the folders named (``collect_files``), each read whole
        (``read_document``: txt, md, rst, pdf, html) and named by its path from the files' common folder, with
        the reader's metadata. A file that cannot be read raises its ``DocumentError``; none found, ``ValueError``."""
        files = collect_files([paths] if isinstance(paths, str | Path) else paths)
        if not files:
            raise ValueError("no supported documents under the paths given")
        parsed = [read_document(path, max_bytes=max_bytes) for path in files]
        resolved = [path.resolve() for path in files]
        root = os.path.commonpath([path.parent for path in resolved])
        names = [path.relative_to(root).as_posix() for path in resolved]
        return cls(NamedText(n, p.text, p.metadata) for n, p in zip(names, parsed, strict=True))

    def __len__(self) -> int:
        return len(self.documents)

    def __iter__(self) -> Iterator[NamedText]:
        return iter(self.documents)

    def __getitem__(self, name: str) -> NamedText:
        return self._by_name[name]

    def cite(self, ranges: Iterable[tuple[int, int]]) -> list[Source]:
        """The ``Source``s of character ranges [start, end) of ``text``: each cut to the documents it overlaps
        (headers and separators left out), ranges of one document that touch merged, trimmed of whitespace
        (whitespace alone is no source); in corpus order."""
        starts = [start for start, _ in self.spans]
        pieces = []
        for start, end in ranges:
            for i in range(max(0, bisect_right(starts, start) - 1), len(self.spans)):
                low, high = self.spans[i]
                if low >= end:
                    break
                if max(start, low) < min(end, high):
                    pieces.append((i, max(start, low) - low, min(end, high) - low))
        merged: list[list[int]] = []
        for i, start, end in sorted(pieces):
            if merged and merged[-1][0] == i and start <= merged[-1][2]:
                merged[-1][2] = max(merged[-1][2], end)
            else:
                merged.append([i, start, end])
        sources = []
        for i, start, end in merged:
            doc = self.documents[i]
            piece = doc.text[start:end]
            lead, kept = len(piece) - len(piece.lstrip()), piece.strip()
            if kept:
                sources.append(Source(doc.name, start + lead, start + lead + len(kept), kept, doc.metadata))
        return sources


def kept_ranges(origin: torch.Tensor, offsets: torch.Tensor) -> list[tuple[int, int]]:
    """Character ranges [start, end) of the runs of consecutive document tokens in ``origin`` [K] (a
    ``CompressedDocument``'s; -1: not a document token), by the document's token ``offsets`` [N, 2]."""
    kept = origin[origin >= 0].cpu().unique()  # sorted
    if kept.numel() == 0:
        return []
    breaks = (kept[1:] != kept[:-1] + 1).nonzero()[:, 0]
    firsts, lasts = torch.cat([kept[:1], kept[breaks + 1]]), torch.cat([kept[breaks], kept[-1:]])
    return list(zip(offsets[firsts, 0].tolist(), offsets[lasts, 1].tolist(), strict=True))


@dataclass
class CorpusAnswer:
    """An answer across a corpus: its ``text``, the ``sources`` it was read from, and ``info`` (``AnswerInfo``)."""

    text: str
    sources: list[Source]
    info: AnswerInfo


class CorpusStream(Iterator[str]):
    """Text pieces of an answer across a corpus; ``sources`` are known before the first piece, ``info`` is
    complete once the stream ends (its ``total_seconds`` counts the selection too); ``answer()`` consumes it."""

    def __init__(self, stream: AnswerStream, sources: list[Source], started: float) -> None:
        self._stream, self.sources, self._started = stream, sources, started
        self.info = stream.info

    def __next__(self) -> str:
        try:
            return next(self._stream)
        except StopIteration:
            self.info.total_seconds = time.perf_counter() - self._started
            raise

    def answer(self) -> CorpusAnswer:
        """The whole answer (what is left of it), with its sources."""
        return CorpusAnswer("".join(self), self.sources, self.info)


def stream_corpus(engine: HomerModel, corpus: Corpus, question: str, **generation: Any) -> CorpusStream:
    """Answer ``question`` across ``corpus`` in ``query_aware`` mode, streaming (``generation``:
    ``GenerationOptions`` fields). Refused before any work: an empty or too long question, a joined text
    longer than the engine takes, bad options, a tokenizer without character offsets (a slow one).

    Cost: one question about ``corpus.text`` (``HomerModel.run``), no more. The text is built once per
    ``Corpus`` and the engine remembers its token ids, offsets and passages (its last few documents), so a
    later question tokenizes nothing again; as any question, it hashes the text once for its leaf tier's key.
    """
    started = time.perf_counter()
    engine.check_question(question)
    GenerationOptions(**generation)  # bad options fail before the corpus is read
    engine.check_document(corpus.text)
    offsets = engine.token_offsets(corpus.text)  # tokenizes once, for the compression below too
    if offsets is None:
        raise ValueError("citing the sources needs a fast tokenizer (character offsets); this one is slow")
    layout = engine.layout(question, "query_aware")
    found = engine.compress_span(layout.prefix, corpus.text, layout.suffix, question=question, mode="query_aware")
    stream = engine.run(found.document, question, mode="query_aware", **generation)
    stream.info.cache_source, stream.info.document_seconds = found.source, found.seconds
    stream.info.compress_seconds = time.perf_counter() - started
    return CorpusStream(stream, corpus.cite(kept_ranges(found.document.origin, offsets)), started)


def ask_corpus(engine: HomerModel, corpus: Corpus, question: str, **generation: Any) -> CorpusAnswer:
    """The whole answer to ``question`` across ``corpus``, with its sources (see ``stream_corpus``)."""
    return stream_corpus(engine, corpus, question, **generation).answer()
