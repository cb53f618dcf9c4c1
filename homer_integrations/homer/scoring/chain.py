"""``Scoring``: one scorer and the score units after it; what a compression prunes by.

The package's recipes are ``Scoring.default()`` (shared roots, with reconstruction-scored leaves) and
``Scoring.for_questions()``; ablations and research variants build their own ``Scoring`` and hand it to
``HomerModel(recipe=Recipe(scoring=...))`` (``homer.reading.strategies``). Its ``repr`` names every part and
parameter, so it is part of the document-cache key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.scoring.lexical import LexicalEvidence
from homer_integrations.homer.scoring.scorers import (
    LastTokenScorer,
    QuestionAttentionScorer,
    ReconstructionScorer,
    Scorer,
)
from homer_integrations.homer.scoring.units import (
    MaxPool,
    ScoreMemory,
    ScoreUnit,
    SentenceBonus,
    UnitBestAndMean,
    WordUnits,
)

REPEAT_PROMPT = "\n\nRepeat the previous context exactly.\n\n"
"""What a reconstruction probe says before it repeats a leaf's piece (KVzip's instruction)."""
RECONSTRUCTION_UNITS: tuple[ScoreUnit, ...] = (SentenceBonus(), ScoreMemory())
"""The units of a reconstruction-scored shared root: whole sentences by their mean reconstruction score
(no max-pool, no word units: at 16k those kept 6 of 12 inserted values whole, the sentence bonus 11 of
12; ``research/selection_sim.py``), and score memory for the tree root's merged nodes."""
QUESTION_UNITS: tuple[ScoreUnit, ...] = (UnitBestAndMean(), ScoreMemory())
"""The units of a question's pruning: whole statements (only ``.!?`` or a line break end one, so "the
number for X is: 8121922." is one unit, key and value), each ranked by its best-attended token plus 4x
its mean attention (``UnitBestAndMean``), and score memory across the tree's levels. Each token's own
score plus 4x its statement's mean (the recipe before 2026-11-26, ablation ``question_statement_mean``)
let a line in which only the asked key draws attention lose to lines of middling attention (RULER 4k
held out: multikey 0.60 against 1.00); the statement's best alone (ablation ``question_statement_max``)
kept those lines but lost facts inside long narrative sentences (bundled novel questions at 8k: 7/21
against 11/21 and 10/21 with both); README "Design and measurements"."""


@dataclass(frozen=True)
class Scoring:
    """A scorer and the units that reshape its scores, in order (default: the paper's recipe).

    ``lexical``: a per-question selection also keeps the statements BM25 finds for the question
    (``LexicalEvidence``), within the same budget; None: attention alone.
    """

    scorer: Scorer = field(default_factory=LastTokenScorer)
    units: tuple[ScoreUnit, ...] = ()
    lexical: LexicalEvidence | None = None

    @classmethod
    def default(cls) -> Scoring:
        """The package's last-token recipe: calibrated last-token scores, max-pooled over 3 neighbours,
        whole words (numbers split into digits, names split into pieces survive or go together) and
        score memory (the best standardised score a token got at any level so far). The package's shared
        roots take its ``with_reconstruction``; ``Scoring()`` is the paper's (no units)."""
        return cls(LastTokenScorer(), (MaxPool(3), WordUnits("word"), ScoreMemory()))

    @classmethod
    def for_questions(cls) -> Scoring:
        """The package's recipe for a compression whose suffix holds the question: every suffix row's
        most softmax attention (``QuestionAttentionScorer``), ranked by ``QUESTION_UNITS``."""
        return cls(QuestionAttentionScorer(), QUESTION_UNITS)

    def __post_init__(self) -> None:
        named = {u.unit for u in self.units if isinstance(getattr(u, "unit", None), str)}
        if len(named) > 1:
            raise ValueError(f"score units split the document in more than one way: {sorted(named)}")

    @property
    def unit(self) -> str:
        """How the document is split into units for ``WordUnits`` or ``SentenceBonus`` (``token``: it is not)."""
        return next((u.unit for u in self.units if isinstance(getattr(u, "unit", None), str)), "token")

    @property
    def needs_calibration(self) -> bool:
        return self.scorer.needs_calibration

    def without(self, kind: type[ScoreUnit]) -> Scoring:
        """This scoring without its units of type ``kind``."""
        return replace(self, units=tuple(u for u in self.units if not isinstance(u, kind)))

    def with_question(self) -> Scoring:
        """The scoring of a compression whose suffix holds the question (see ``Scorer.with_question``)."""
        return replace(self, scorer=self.scorer.with_question())

    def rank(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        """The scores [T] pruning ranks: ``scores`` [T] through every unit in order."""
        for unit in self.units:
            scores = unit(scores, chunk, words)
        return scores.cpu()

    def with_reconstruction(self, prompt_ids: torch.Tensor) -> Scoring:
        """Leaves scored by reconstruction (``ReconstructionScorer`` with ``prompt_ids`` [R] before the
        repeated piece), merged nodes by this scoring's scorer; ``RECONSTRUCTION_UNITS`` reshape both.
        ``with_question()`` of the result keeps those units (the package's query-aware compressions
        take ``for_questions()`` instead: ``DocumentTiers.question_scoring``)."""
        merged = self.scorer.with_question()  # never a probe inside a probe
        scorer = ReconstructionScorer(tuple(prompt_ids.tolist()), merged=merged)
        return replace(self, scorer=scorer, units=RECONSTRUCTION_UNITS)
