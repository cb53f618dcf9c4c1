"""Map-reduce over kept pieces: every part of a long document read for a question, each part prefilled once.

LangChain's map-reduce chain and LlamaIndex's ``tree_summarize`` read every chunk of a document with the
question and combine the notes: what a question about the whole document (every X, how many, in what order,
how it ends) needs, and what retrieval of a few passages cannot give. Done plainly, each question pays a
prefill of the whole document. Here the document is cut into pieces that fit the model's window, each
kept as a ``full`` entry (prefilled once, kept in memory and on disk like any document), and the question
comes after a piece's kept cache: a question pays only its own tokens and its notes per piece (a fraction
of the prefill), then one short combining read. Same answers as the plain chain whose question follows
each chunk: the pieces' caches do not depend on the question.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from homer_integrations.engine.prompting import WHOLE_PROMPT_ROOM
from homer_integrations.homer.decoding.sources import CitedSpan, units

if TYPE_CHECKING:
    from homer_integrations.engine.answering import AnswerStream
    from homer_integrations.engine.model import HomerModel

PIECE_TOKENS = 8192
"""Most tokens of one piece (fewer where the model's window is smaller)."""
AFFIX_TOKENS = 128
"""Tokens kept for the chat template around a piece."""
NOTE_TOKENS = 96
"""Most tokens of one piece's notes."""
NOTHING = "NONE"
# Chosen on three tuning questions of Northanger Abbey's whole-document set over 8k-token pieces, against
# four wordings that offered NONE or asked for quotes or a partial answer: with the 1.5B those wrote NONE or
# repeated the question for pieces that held the evidence; asked for notes it wrote names and events.
MAP_QUESTION = (
    "The text above is one part of a longer document. Question about the whole document: {question}\n\n"
    "Write short notes of what this part says about the question (names, events, numbers)."
)
REDUCE_PROMPT = (
    "Notes taken from each part of a document, in the document's order:\n\n{notes}\n\n"
    "Question: {question}\nAnswer the question from the notes, completely."
)


@dataclass(frozen=True)
class Note:
    """What one piece, ``text[start:end]``, says for the question; ``sources``: its cited spans (document offsets)."""

    start: int
    end: int
    text: str
    sources: tuple[CitedSpan, ...] = ()


@dataclass
class MapReduceAnswer:
    """An answer read from every piece: its ``text``, the pieces' ``notes`` (those that found something),
    the spans it cites (the notes' best, at most five) and the seconds spent mapping and reducing."""

    text: str
    notes: list[Note]
    sources: list[CitedSpan]
    map_seconds: float
    reduce_seconds: float
    pieces: int = 0
    empty: int = field(default=0)
    """Pieces that held nothing for the question."""
    reads: int = 0
    """Reads of the model: one per piece, one per combining of notes, the final one."""
    tokens_read: int = 0
    """Tokens every read was read from (kept pieces, questions, notes)."""
    built_seconds: float = 0.0
    """The part of ``map_seconds`` spent computing pieces not yet kept (0 once all are)."""
    first_token_seconds: float | None = None
    """From the call to the final answer's first token."""
    cache_sources: tuple[str, ...] = ()
    """Where the pieces' caches came from (``computed``, ``memory``, ``disk``)."""


@dataclass
class Read:
    """What the reads of one answer cost, added up as their streams finish."""

    reads: int = 0
    tokens: int = 0
    built_seconds: float = 0.0
    first_token: float | None = None
    sources: set[str] = field(default_factory=set)

    def add(self, stream: AnswerStream, final: bool = False) -> None:
        """Count one exhausted ``stream``; ``final``: the answer's own read (its first token is the answer's)."""
        info = stream.info
        self.reads += 1
        self.tokens += info.cache_tokens + info.input_tokens
        self.built_seconds += info.document_seconds
        if info.cache_source:
            self.sources.add(info.cache_source)
        if final:
            self.first_token = info.time_to_first_token


class MapReduce:
    """Map-reduce over ``engine``'s kept ``full`` pieces of a document (see the module docstring)."""

    def __init__(
        self,
        engine: HomerModel,
        piece_tokens: int = PIECE_TOKENS,
        note_tokens: int = NOTE_TOKENS,
        progress: bool | None = None,
        reduce_tokens: int | None = None,
    ) -> None:
        room = engine.context_window - WHOLE_PROMPT_ROOM - AFFIX_TOKENS  # a piece kept whole leaves the question room
        if room < 256:
            raise ValueError(f"a {engine.context_window}-token window leaves no room for pieces and notes")
        self.engine = engine
        self.piece_tokens = min(piece_tokens, room)
        self.note_tokens = note_tokens
        self.progress = progress
        self.reduce_tokens = reduce_tokens
        """The most tokens a read of notes may have (default: the window less the answer's room)."""

    def pieces(self, text: str) -> list[tuple[int, int]]:
        """Character spans cutting ``text`` into pieces of at most ``piece_tokens`` tokens, at paragraph ends
        (or sentence ends inside a long paragraph, ``sources.units``), covering it in order."""
        spans = units(text).tolist()
        counted = [self.engine.count_tokens(text[a:b]) for a, b in spans]
        pieces: list[list[int]] = []  # [start, end] of each piece
        used = 0
        for (a, b), tokens in zip(spans, counted, strict=True):
            if pieces and used + tokens <= self.piece_tokens:
                pieces[-1][1] = b
                used += tokens
            else:  # a unit longer than a piece (no sentence end to cut at) is a piece of its own
                pieces.append([a, b])
                used = tokens
        return [(a, b) for a, b in pieces]

    def prepare(self, text: str) -> int:
        """Prefill and keep every piece of ``text`` (once; later calls find them): the number of pieces."""
        spans = self.pieces(text)
        for a, b in self._bar(spans, "keeping pieces"):
            self.engine.cache_document(text[a:b], "full")
        return len(spans)

    def answer(self, text: str, question: str, **generation: object) -> MapReduceAnswer:
        """``question`` answered from every piece of ``text``: each piece's notes, read after its kept cache
        (prepared now where missing), then one combining read of the notes. ``generation``: the final
        answer's options (``max_new_tokens`` ...)."""
        started = time.perf_counter()
        spans = self.pieces(text)
        notes, empty = [], 0
        read = Read()
        for a, b in self._bar(spans, "reading pieces"):
            piece = text[a:b]
            stream = self.engine.run(
                piece, MAP_QUESTION.format(question=question), mode="full", max_new_tokens=self.note_tokens
            )
            said = stream.text().strip()
            read.add(stream)
            if not said or said.upper().startswith(NOTHING):
                empty += 1
                continue
            cited = tuple(CitedSpan(a + s.start, a + s.end, s.score) for s in stream.info.sources)
            notes.append(Note(a, b, said, cited))
        mapped = time.perf_counter()
        final = self._reduce(question, notes, generation, read)
        best = sorted((s for n in notes for s in n.sources), key=lambda s: -s.score)[:5]
        return MapReduceAnswer(
            text=final,
            notes=notes,
            sources=sorted(best, key=lambda s: s.start),
            map_seconds=mapped - started,
            reduce_seconds=time.perf_counter() - mapped,
            pieces=len(spans),
            empty=empty,
            reads=read.reads,
            tokens_read=read.tokens,
            built_seconds=read.built_seconds,
            first_token_seconds=None if read.first_token is None else mapped - started + read.first_token,
            cache_sources=tuple(sorted(read.sources)),
        )

    def _reduce(self, question: str, notes: list[Note], generation: dict, read: Read) -> str:
        """One read of the notes (grouped and combined first while they overflow the window)."""
        texts = [f"[part {i + 1}] {n.text}" for i, n in enumerate(notes)] or ["(no part held anything relevant)"]
        room = int(generation.get("max_new_tokens", 256)) + 256  # the answer and the chat template's markup
        limit = self.reduce_tokens or self.engine.context_window - room
        while True:
            prompt = self._prompt(question, texts)
            if self.engine.count_tokens(prompt) <= limit or len(texts) == 1:
                stream = self.engine.generate(prompt, **generation)
                answer = stream.text().strip()
                read.add(stream, final=True)
                return answer
            # too long: combine each half into one note (two notes into one: every round has fewer), read again
            half = (len(texts) + 1) // 2
            groups = [texts[:half], texts[half:]] if len(texts) > 2 else [texts]
            texts = [self._combine(question, group, read) for group in groups]

    def _combine(self, question: str, notes: list[str], read: Read) -> str:
        stream = self.engine.generate(self._prompt(question, notes), max_new_tokens=self.note_tokens * 2)
        combined = stream.text().strip()
        read.add(stream)
        return combined

    def _prompt(self, question: str, notes: list[str]) -> str:
        content = REDUCE_PROMPT.format(notes="\n\n".join(notes), question=question)
        return self.engine.chat_prompt([{"role": "user", "content": content}])

    def _bar(self, spans: list[tuple[int, int]], what: str) -> Iterable[tuple[int, int]]:
        disable = None if self.progress is None else not self.progress
        return tqdm(spans, desc=what, unit="piece", disable=disable, leave=False)
