"""Score units: short steps that reshape a node's scores after its scorer, applied in order.

Each unit maps scores [T] of one node to new scores [T]; ``Scoring`` chains them. They exist
because a fact spans several tokens (a number written digit by digit, a name in pieces) and
because a token that mattered in its leaf should not be lost to a noisier merged judgement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.scoring.pruning import standardise


class ScoreUnit:
    """Base of every unit: ``unit(scores [T], chunk, words [T] | None) -> scores [T]``.

    ``words`` holds the document unit index of each token of ``chunk`` (negative on prefix and
    suffix tokens), None when the document has no unit ids.
    """

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class MaxPool(ScoreUnit):
    """Max-pool document scores over ``width`` neighbours, so the tokens around a salient one survive
    with it. Prefix and suffix scores are left out of the pool: they cannot lift their neighbours."""

    width: int = 3

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        if self.width <= 1:
            return scores
        masked = scores.float().masked_fill(~chunk.reducible.to(scores.device), float("-inf"))
        pooled = torch.nn.functional.max_pool1d(masked[None, None], self.width, stride=1, padding=self.width // 2)
        return pooled[0, 0, : scores.numel()]


@dataclass(frozen=True)
class WordUnits(ScoreUnit):
    """Give every document token the best score of its unit, so units survive or go whole.

    ``unit`` names how the engine splits the document into units (``homer.document.prompt.unit_ids``):
    ``word`` (no whitespace inside; numbers and names stay whole), ``statement`` (up to ``.!?`` or a
    line break: the ablation ``question_statement_max``) or, as an ablation, ``sentence``.
    """

    unit: str = "word"

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        if words is None:
            return scores
        return pool_words(scores.cpu(), chunk.reducible, words)


@dataclass(frozen=True)
class SentenceBonus(ScoreUnit):
    """Add ``weight`` times the mean score of each document token's sentence (both standardised), so a
    sentence that matters as a whole survives whole, with the words that tie its value to a question.

    Used by the flat shared root: a single token's reconstruction score keeps scattered words whose
    sentence is gone; at 16k (8x) the sentence mean keeps 11 of 12 inserted facts' values whole where
    the max-pooled words keep 6 (``research/selection_sim.py``).
    """

    weight: float = 4.0
    unit: str = "sentence"

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        if words is None:
            return scores
        scores = scores.cpu().float()
        doc = chunk.reducible & (words >= 0)
        if not bool(doc.any()):
            return scores
        means = pool_words(scores, chunk.reducible, words, reduce="mean")
        return standardise(self._own(scores, chunk, words), doc) + self.weight * standardise(means, doc)

    def _own(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor) -> torch.Tensor:
        """The part of a token's score that is not its unit's mean: its own score [T]."""
        return scores


@dataclass(frozen=True)
class UnitBestAndMean(SentenceBonus):
    """Every document token of a unit scores the unit's best score plus ``weight`` times its mean (both
    standardised): a unit is kept or dropped whole, ranked by its sharpest token and by how much of it
    matters (a question's recipe over statements, ``scoring.QUESTION_UNITS``). ``SentenceBonus`` keeps
    each token's own score in place of the unit's best."""

    unit: str = "statement"

    def _own(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor) -> torch.Tensor:
        return pool_words(scores, chunk.reducible, words)


@dataclass(frozen=True)
class ScoreMemory(ScoreUnit):
    """Score a token by the best standardised score it got at any node so far (kept on the chunk).

    Scores of different layers live on different scales, so each node's document scores are
    standardised first (zero mean, unit variance).
    """

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        chunk.memory = torch.maximum(chunk.memory, standardise(scores.cpu(), chunk.reducible))
        return chunk.memory.clone()


def pool_words(
    scores: torch.Tensor, reducible: torch.Tensor, words: torch.Tensor, reduce: str = "amax"
) -> torch.Tensor:
    """Each document token's unit's best (``reduce="amax"``) or mean (``"mean"``) score [..., T], pooled
    along the last axis within each row (one row per layer and head when batched); ``words`` [T] is
    negative on prefix/suffix tokens, which keep their own scores."""
    doc = reducible.to(scores.device) & (words >= 0).to(scores.device)
    if not bool(doc.any()):
        return scores
    _, inverse = torch.unique(words.to(scores.device)[doc], return_inverse=True)
    own = scores[..., doc].float()
    index = inverse.expand_as(own)
    units = torch.zeros((*own.shape[:-1], int(inverse.max()) + 1), device=scores.device)
    units = units.scatter_reduce(-1, index, own, reduce=reduce, include_self=False)
    pooled = scores.clone().float()
    pooled[..., doc] = units.gather(-1, index)
    return pooled
