"""Named ablations: the scoring variants that measured no gain, assembled from ``homer.scoring.chain`` parts.

They left ``HomerConfig`` (README "Design and measurements" has their numbers); a benchmark builds
one with ``ablation(name)`` and hands it to ``HomerModel(recipe=Recipe(scoring=...))``. ``recipe_of``
maps the research switches ``HomerConfig`` had until 2026-12 (``shared_root="flat"``, ``replay="tree"``,
...) to the ``homer.reading.strategies`` units that replaced them, for the rows measured with them and the
benchmarks' flags. One cache transform is here too, under trial: ``compact_positions`` (each kept
token its own position).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from homer_integrations import HomerModel
from homer_integrations.homer.kv.compressed import CompressedDocument
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.strategies import REPLAYS, SHARED_ROOTS, Recipe
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.scorers import EveryLayer, LastTokenScorer, QuestionAttentionScorer, RandomScorer
from homer_integrations.homer.scoring.units import (
    MaxPool,
    ScoreMemory,
    ScoreUnit,
    SentenceBonus,
    UnitBestAndMean,
    WordUnits,
)


def _swap_units(scoring: Scoring, unit: str) -> Scoring:
    """``scoring`` with its units (``WordUnits``, ``SentenceBonus``) splitting the document by ``unit``."""
    return replace(
        scoring,
        units=tuple(replace(u, unit=unit) if isinstance(u, WordUnits | SentenceBonus) else u for u in scoring.units),
    )


def _question_statement_mean() -> Scoring:
    """Question attention ranked by the sentence bonus over statements (the question recipe of 2026-11-25)."""
    return Scoring(QuestionAttentionScorer(), (SentenceBonus(unit="statement"), ScoreMemory()))


ABLATIONS: dict[str, Callable[[Scoring], Scoring]] = {
    # the paper's uncalibrated ablation and its random-pruning baseline
    "no_calibration": lambda s: replace(s, scorer=LastTokenScorer(calibrated=False)),
    "random_pruning": lambda s: replace(s, scorer=RandomScorer(seed=0)),
    # all tokens of one sentence share its best score
    "sentence_units": lambda s: _swap_units(s, "sentence"),
    # the mean standardised score over every layer a node runs
    "score_all_layers": lambda s: replace(s, scorer=EveryLayer(s.scorer)),
    # the mean score of the last 16 suffix rows instead of the last row
    "observation_window_16": lambda s: replace(s, scorer=LastTokenScorer(rows=16)),
    # every suffix row scores, by the most softmax attention a token gets (KVzip's score, the question as probe)
    "question_attention": lambda s: replace(s, scorer=QuestionAttentionScorer()),
    # the same, ranked by the sentence bonus over sentences, which end at a colon (the package's
    # question recipe, ``Scoring.for_questions()``, ranks statements, which do not)
    "question_attention_sentences": lambda _: _swap_units(_question_statement_mean(), "sentence"),
    # questions prune by the paper's calibrated last token and this recipe's units (the package's
    # question recipe before ``Scoring.for_questions()``): a recipe handed to ``HomerModel(scoring=...)``
    # is what its query-aware compressions use (``with_question()``)
    "question_last_token": lambda s: s,
    # question attention ranked by each statement's best token alone
    "question_statement_max": lambda _: Scoring(QuestionAttentionScorer(), (WordUnits("statement"), ScoreMemory())),
    # a statement's best question attention plus 4x its mean (``UnitBestAndMean``; the package's
    # question recipe since 2026-11-26, pinned here for the rows measured with it)
    "question_statement_best_and_mean": lambda _: Scoring(
        QuestionAttentionScorer(), (UnitBestAndMean(), ScoreMemory())
    ),
    # question attention plus 4x its statement's mean (the sentence bonus over statements)
    "question_statement_mean": lambda _: _question_statement_mean(),
}
"""Ablations of the package's last-token recipe (``Scoring.default()``, the last-token shared scorer)."""

RECONSTRUCTION_ABLATIONS: dict[str, Callable[[Scoring], Scoring]] = {
    # reconstruction probes every leaf layer and keeps each token's best (the default: the last one)
    "reconstruction_every_layer": lambda s: replace(s, scorer=replace(s.scorer, every_layer=True)),
    # the last-token recipe's units (max-pool over 3 tokens, word units, score memory) instead of the sentence bonus
    "reconstruction_word_units": lambda s: replace(s, units=Scoring.default().units),
    # the sentence bonus over statements (a colon does not end the unit) instead of sentences
    "reconstruction_statements": lambda s: _swap_units(s, "statement"),
    # the probe scores at model layer 9 (of Qwen2.5-0.5B's 24) and stops there, not at the leaves' last
    "reconstruction_probe_layer_9": lambda s: replace(s, scorer=replace(s.scorer, probe_layer=9)),
    # each token its word's best reconstruction score, no sentence bonus
    "reconstruction_word_best": lambda s: replace(s, units=(WordUnits(), ScoreMemory())),
    # each sentence ranked whole by its best token plus 4x its mean (the question recipe's ranking)
    "reconstruction_sentence_best_and_mean": lambda s: replace(
        s, units=(UnitBestAndMean(unit="sentence"), ScoreMemory())
    ),
}
"""Ablations of the reconstruction-scored shared root (a ``Scoring`` whose scorer probes)."""


def ablation(name: str, base: Scoring | None = None) -> Scoring:
    """The named ablation of ``base`` (default: the last-token recipe, ``Scoring.default()``)."""
    if name not in ABLATIONS:
        raise KeyError(f"unknown ablation {name!r}: one of {', '.join(ABLATIONS)}")
    return ABLATIONS[name](base or Scoring.default())


SWITCHES = (
    "shared_root",
    "replay",
    "reask_question",
    "calibration_segments",
    "shared_scorer",
    "score_pooling",
    "pool_unit",
    "score_memory",
)
"""The research switches ``HomerConfig`` had until 2026-12, by their names there (``recipe_of``)."""


def split_switches(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``settings`` split into ``HomerConfig`` fields and ``SWITCHES`` (for ``recipe_of``)."""
    switches = {k: v for k, v in settings.items() if k in SWITCHES}
    return {k: v for k, v in settings.items() if k not in SWITCHES}, switches


def recipe_of(scoring: Scoring | None = None, **switches: Any) -> Recipe:
    """The ``Recipe`` that runs what ``HomerConfig(**switches)`` ran, with ``scoring`` as ``HomerModel(scoring=)``
    took it (its ``with_question()`` prunes for questions).

    ``shared_root``, ``replay``: names in ``SHARED_ROOTS``, ``REPLAYS``; ``shared_scorer="last_token"``: the
    shared root scores by ``Scoring.default()`` reshaped by ``score_pooling`` (default 3), ``pool_unit``
    (``word``) and ``score_memory`` (True), questions by ``Scoring.for_questions()``. Under the
    reconstruction scorer (the default) those three changed nothing but the cache key, and do nothing here.
    """
    unknown = set(switches) - set(SWITCHES)
    if unknown:
        raise KeyError(f"not a research switch: {sorted(unknown)} (one of {', '.join(SWITCHES)})")
    parts: dict[str, Any] = {
        k: switches[k] for k in ("reask_question", "calibration_segments") if switches.get(k) is not None
    }
    if switches.get("shared_root") is not None:
        parts["shared_root"] = SHARED_ROOTS[switches["shared_root"]]
    if switches.get("replay") is not None:
        parts["replay"] = REPLAYS[switches["replay"]]
    if scoring is not None:
        parts["scoring"] = scoring
    elif switches.get("shared_scorer", "reconstruction") == "last_token":
        pooling, unit = switches.get("score_pooling", 3), switches.get("pool_unit", "word")
        units: list[ScoreUnit] = [MaxPool(pooling)] if pooling > 1 else []
        units += [WordUnits(unit)] if unit != "token" else []
        units += [ScoreMemory()] if switches.get("score_memory", True) else []
        parts["scoring"] = Scoring(LastTokenScorer(), tuple(units))
        parts["question_scoring"] = Scoring.for_questions()
    return Recipe(**parts)


def compact_positions(stack: DecoderStack, doc: CompressedDocument) -> CompressedDocument:
    """``doc`` with its cached tokens moved to positions 0..K-1 in cache (document) order.

    HOMER's root keeps every token at its leaf's position, so tokens of different leaves share
    positions (the paper's design: no position reaches the chunk length). Here each gets its own,
    as in a plain prefill over exactly the kept tokens: every key [1, Hkv, K, d] is rotated by
    (new - old) positions, since RoPE rotations compose; values and the layers' work stay as they
    were. RoPE with an attention scaling (YaRN, LongRoPE) would be scaled twice and is refused.
    (The removed ``contiguous_positions`` option re-rotated at every merge, changing what the upper
    layers computed; this moves only the finished cache that the answer reads.)
    """
    if getattr(stack.family.backbone.rotary_emb, "attention_scaling", 1.0) != 1.0:
        raise ValueError("compact_positions: RoPE with attention scaling cannot be re-rotated")
    if doc.head_lengths is not None:
        raise ValueError("compact_positions: a dense root only (it was measured on the flat root): FlatRoot()")
    new = torch.arange(doc.num_tokens)
    tables = stack.rotary(doc.keys[0], new - doc.position_ids.cpu())
    keys = tuple(stack.family.rotate(k, tables[stack.family.rope_kind(layer)]) for layer, k in enumerate(doc.keys))
    return replace(doc, keys=keys, position_ids=new, last_position=doc.num_tokens - 1)


def with_compact_positions(engine: HomerModel) -> HomerModel:
    """``engine`` answering from ``compact_positions`` of every cache it compresses or looks up."""
    tiers = engine.tiers

    def compacting(compress: Any) -> Any:
        def compacted(*args: Any, **kwargs: Any) -> Any:
            result = compress(*args, **kwargs)
            return result._replace(document=compact_positions(tiers.stack, result.document))

        return compacted

    tiers.root = compacting(tiers.root)  # type: ignore[method-assign]
    tiers.replay = compacting(tiers.replay)  # type: ignore[method-assign]
    return engine
