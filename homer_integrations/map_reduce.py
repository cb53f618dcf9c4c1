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
    from homer_integrations.engine.model import HomerModel

PIECE_TOKENS = 8192
"""Most tokens of one piece (fewer where the model's window is smaller)."""
AFFIX_TOKENS = 128
"""Tokens kept for the chat template around a piece."""
NOTE_TOKENS = 96
"""Most tokens of one piece's notes."""
NOTHING = "NONE"
MAP_QUESTION = (
    "{question}\n\nThe text above is one part of a longer document. Write down, briefly, everything in this "
    f"part that helps answer the question. If nothing in this part helps, write only: {NOTHING}"
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


class MapReduce:
    """Map-reduce over ``engine``'s kept ``full`` pieces of a document (see the module docstring)."""

    def __init__(
        self,
        engine: HomerModel,
        piece_tokens: int = PIECE_TOKENS,
        note_tokens: int = NOTE_TOKENS,
        progress: bool | None = None,
    ) -> None:
        room = engine.context_window - WHOLE_PROMPT_ROOM - AFFIX_TOKENS  # a piece kept whole leaves the question room
        if room < 256:
            raise ValueError(f"a {engine.context_window}-token window leaves no room for pieces and notes")
        self.engine = engine
        self.piece_tokens = min(piece_tokens, room)
        self.note_tokens = note_tokens
        self.progress = progress

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
        for a, b in self._bar(spans, "reading pieces"):
            piece = text[a:b]
            stream = self.engine.run(
                piece, MAP_QUESTION.format(question=question), mode="full", max_new_tokens=self.note_tokens
            )
            said = stream.text().strip()
            if not said or said.upper().startswith(NOTHING):
                empty += 1
                continue
            cited = tuple(CitedSpan(a + s.start, a + s.end, s.score) for s in stream.info.sources)
            notes.append(Note(a, b, said, cited))
        mapped = time.perf_counter()
        final = self._reduce(question, notes, generation)
        best = sorted((s for n in notes for s in n.sources), key=lambda s: -s.score)[:5]
        return MapReduceAnswer(
            text=final,
            notes=notes,
            sources=sorted(best, key=lambda s: s.start),
            map_seconds=mapped - started,
            reduce_seconds=time.perf_counter() - mapped,
            pieces=len(spans),
            empty=empty,
        )

    def _reduce(self, question: str, notes: list[Note], generation: dict) -> str:
        """One read of the notes (grouped and combined first while they overflow the window)."""
        texts = [f"[part {i + 1}] {n.text}" for i, n in enumerate(notes)] or ["(no part held anything relevant)"]
        limit = self.engine.context_window - int(generation.get("max_new_tokens", 256)) - 256
        while True:
            prompt = self._prompt(question, texts)
            if self.engine.count_tokens(prompt) <= limit or len(texts) == 1:
                return self.engine.generate(prompt, **generation).text().strip()
            half = (len(texts) + 1) // 2  # too long: combine each half into one note, then read again
            groups = [texts[:half], texts[half:]]
            texts = [
                self.engine.generate(self._prompt(question, g), max_new_tokens=self.note_tokens * 2).text().strip()
                for g in groups
            ]

    def _prompt(self, question: str, notes: list[str]) -> str:
        content = REDUCE_PROMPT.format(notes="\n\n".join(notes), question=question)
        return self.engine.chat_prompt([{"role": "user", "content": content}])

    def _bar(self, spans: list[tuple[int, int]], what: str) -> Iterable[tuple[int, int]]:
        disable = None if self.progress is None else not self.progress
        return tqdm(spans, desc=what, unit="piece", disable=disable, leave=False)
