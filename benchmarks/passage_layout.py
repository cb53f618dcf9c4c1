"""Ablation: how the kept passages are laid out for the re-read (whole books, past the model's window).

The package's ``PassageReplay`` re-reads the passages BM25 keeps in document order, run into one
another, after the prompt's prefix and before its question. Half of the facts it keeps are misread
(whole-book benchmark, 2026-12-02), so three layouts a reader might expect to help were tried on the
tuning split (``whole_book.py run --methods sep rank qfirst --split tuning --limit 16``: Northanger
Abbey, 16 questions, Qwen2.5-Coder-1.5B in bfloat16, 2,048 tokens):

- ``sep``: an ``[...]`` line between passages that are not adjacent in the book: 8/16;
- ``rank``: the passages best first, as the retrieval route lays out its chunks, a blank line between: 7/16;
- ``qfirst``: the question also before the passages ("Question: ...\\n\\nText:\\n"), so the passages
  are read knowing it: 6/16;

against 8/16 for the package's layout. None helped, so they stay here. ``rank_last`` (2026-12-03, after
BM25 began to stem): ``rank`` reversed, the best passage next to the question: 8/15 story questions, as
the package's layout. Two more (2026-12-03, the same
16 questions, ``--methods route_prompt instructed query_aware bm25``) asked whether the retrieval
route's lead is its prompt (``frame``):

- ``route_prompt``: the route's own message (``retrieval.retrieval_prompt``: ``Text:``, the passages
  best first with blank lines between, ``Question:`` and its closing instruction): 8/15 story;
- ``instructed``: the engine's message with the route's closing instruction after the question: 9/15;

against 8/15 for the package and 6/15 for the route itself. Held out (43 questions of both books),
``instructed`` answered 17/33 story questions and 8/10 facts against the package's 18 and 10.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from homer_integrations.homer.config import DEFAULT_DOCUMENT_SUFFIX
from homer_integrations.homer.document.prompt import DOCUMENT_MARK, encode, render_chat
from homer_integrations.homer.layers.nodes import CompressionResult
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import Passages, PassageSelection
from homer_integrations.homer.reading.strategies import CompressorFor, PassageReplay, PassageRoom, Reread
from homer_integrations.homer.tree import recompute
from homer_integrations.routing import DEFAULT_RETRIEVAL_INSTRUCTION, retrieval_prompt


def taken_runs(
    selection: PassageSelection, question: str, passages: Passages, budget: int, rank: bool
) -> list[torch.Tensor]:
    """The document token indices ``selection.select`` keeps, as runs: each passage's new tokens in the
    order taken (``rank``), or each stretch of adjacent kept tokens in document order."""
    if rank:
        return selection.taken(question, None, passages, budget)
    kept = selection.select(question, None, passages, budget)
    breaks = (kept[1:] != kept[:-1] + 1).nonzero()[:, 0] + 1
    return list(torch.tensor_split(kept, breaks))


@dataclass(frozen=True)
class LaidOutPassages:
    """``PassageReplay``'s BM25 passages re-read in another layout: ``rank`` order or document order
    (``last``: that order reversed, so the best passage ends nearest the question),
    ``separator`` text between runs, ``question_first`` (a format with ``{question}``) before them;
    ``frame`` (a format with ``{text}`` and ``{question}``): the user message around them, in place of
    the engine's prompt."""

    rank: bool = False
    last: bool = False
    separator: str = ""
    question_first: str = ""
    frame: str = ""
    passages: PassageReplay = field(default_factory=PassageReplay)

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return document_tokens <= final_cache_len

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        return self.passages.read(leaf_tier, suffix_ids, compressor, reread, self.read)

    def read(self, room: PassageRoom) -> CompressionResult:
        """The passages ``room`` keeps, in this layout, re-read."""
        inputs = room.inputs
        runs = taken_runs(self.passages.selection, inputs.question, room.passages, room.budget, self.rank)
        runs = runs[::-1] if self.last else runs
        tokenizer = inputs.document.tokenizer
        gap = encode(tokenizer, self.separator)
        ids, origin = [], []
        for i, run in enumerate(runs):
            if i and gap.numel():
                ids.append(gap)
                origin.append(torch.full((gap.numel(),), -1))
            ids.append(inputs.document_ids[run])
            origin.append(run)
        joined, back = torch.cat(ids), torch.cat(origin)
        head = encode(tokenizer, self.question_first.format(question=inputs.question))
        every = torch.arange(joined.numel())
        prefix, suffix = torch.cat([inputs.prefix_ids, head]), room.suffix_ids
        if self.frame:
            message = self.frame.format(text=DOCUMENT_MARK, question=inputs.question)
            before, _, after = render_chat(tokenizer, [{"role": "user", "content": message}]).partition(DOCUMENT_MARK)
            prefix = encode(tokenizer, before, first=True, formatted=True)
            suffix = encode(tokenizer, after, formatted=True)
        result = recompute.reread(room.chosen.nodes, room.plan, prefix, joined, every, suffix, room.started)
        return replace(result, origin=torch.where(result.origin >= 0, back[result.origin.clamp(min=0)], -1))


ROUTE_FRAME = retrieval_prompt("{question}", ["{text}"])
"""The retrieval route's user message (``retrieval.retrieval_prompt``) around the passages."""
INSTRUCTED_FRAME = "{text}" + DEFAULT_DOCUMENT_SUFFIX + "{question}\n" + DEFAULT_RETRIEVAL_INSTRUCTION
"""The engine's own message with the route's closing instruction after the question."""


def layouts(budget: ReadBudget) -> dict[str, LaidOutPassages]:
    """The layouts measured, by the whole-book benchmark's method names, at ``budget``."""
    passages = PassageReplay(budget=budget)
    return {
        "sep": LaidOutPassages(separator="\n\n[...]\n\n", passages=passages),
        "rank": LaidOutPassages(rank=True, separator="\n\n", passages=passages),
        "rank_last": LaidOutPassages(rank=True, last=True, separator="\n\n", passages=passages),
        "qfirst": LaidOutPassages(question_first="Question: {question}\n\nText:\n", passages=passages),
        "route_prompt": LaidOutPassages(rank=True, separator="\n\n", frame=ROUTE_FRAME, passages=passages),
        "instructed": LaidOutPassages(frame=INSTRUCTED_FRAME, passages=passages),
    }
