"""Ablation: HOMER's question-aware selection over a larger BM25 candidate set (whole books, past the window).

The package's ``PassageReplay`` keeps the passages BM25 ranks best until the re-read budget (2,048
tokens) is full. BM25 keeps the asked fact more often as its budget grows (Northanger Abbey, tuning
split: the answer's words in 28 of 36 questions at 2k tokens, 32 at 8k; ``research/book_budget.py``),
but a re-read of 8k tokens costs four times as much. ``CandidateMerge`` takes BM25's passages up to
``candidates`` tokens (within the model's window), then lets HOMER choose among them with the question:
each leaf of the candidate text is scored by the question in its suffix, the best ``final_cache_len``
tokens across all leaves are kept and re-read by one plain prefill (``FlatSelection.compress_flat``
with ``recompute``: the per-question path the package uses within the window, from the candidate
text's tokens, no tier kept).

Measured (``whole_book.py run --book northangerabbey --methods merge bm25 --split tuning --limit 16
--read-tokens 2048 --budget 2048 --dtype bfloat16``, Qwen2.5-Coder-1.5B, 2026-12-02, a busy machine):
a question took 237-242 s to its first token against the retrieval route's 23 s in the same run: ten
times the route, where re-reading all 8k candidates plainly took about three times the route (135-274 s
against 52-102 s in an earlier run, ``query_aware`` at ``--read-tokens 8192``) and answered as the 2k
re-read did (8/9 tuning questions at either budget). The cost decided it after two questions (1/2
right), so the run stopped: the candidate text's leaves run the early layers with the question for
every question, and at book length nothing of that can be kept between questions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from homer_integrations.homer.layers.nodes import CompressionResult
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.reading.strategies import CompressorFor, PassageReplay, PassageRoom, Reread


@dataclass(frozen=True)
class CandidateMerge:
    """BM25's passages up to ``candidates`` tokens, narrowed by question attention to ``final_cache_len``
    tokens and re-read; ``unit``: the question scoring's unit (``Scoring.unit``), pooled over the candidates."""

    candidates: int = 8192
    unit: str = "token"
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
        """BM25's best ``candidates`` tokens of ``room``'s passages, narrowed by question attention, re-read."""
        inputs = room.inputs
        pool = self.passages.selection.select(inputs.question, None, room.passages, max(self.candidates, room.budget))
        units = inputs.document.units(self.unit)
        # the candidates' units, renumbered 0..U-1 in order (units cut by a passage's edge stay one unit)
        word_ids = None if units is None else torch.unique_consecutive(units[pool], return_inverse=True)[1]
        result = room.chosen.flat.compress_flat(
            inputs.prefix_ids, inputs.document_ids[pool], room.suffix_ids, word_ids=word_ids, recompute=True
        )
        origin = torch.where(result.origin >= 0, pool[result.origin.clamp(min=0)], -1)
        return replace(result, origin=origin, seconds=time.perf_counter() - room.started)
