"""``HomerConfig``: every HOMER setting, validated, with the reason in each error."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Mode = Literal["shared", "query_aware", "full"]
Replay = Literal["tree", "flat", "recompute"]
SharedRoot = Literal["auto", "headwise", "flat", "recompute", "tree"]
MODES: tuple[Mode, ...] = get_args(Mode)
"""The modes a call can pick: ``shared``, ``query_aware``, ``full``."""


def check_mode(mode: Any) -> Mode | None:
    """``mode`` when it is one of ``MODES`` or None (the configured default); else a ``ValueError`` naming them."""
    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        choices = ", ".join(repr(m) for m in MODES)
        raise ValueError(f"unknown HOMER mode {mode!r}: use one of {choices}, or None for the engine's default")
    return mode


PoolUnit = Literal["token", "word"]
SharedScorer = Literal["reconstruction", "last_token"]

DEFAULT_DOCUMENT_SUFFIX = "\n\n(End of the document.)\n\n"


class HomerConfig(BaseModel):
    """Settings of hierarchical context merging. ``None`` means "pick the default for this model".

    Attributes:
        max_chunk_len: MCL, tokens per chunk including prefix and suffix; no RoPE position
            reaches it. Default: per model (see ``resolve``).
        warmup_layers: W, extra layers the leaves run before merging starts.
            Default: per model.
        final_cache_len: tokens kept in the final cache (default: ``max_chunk_len``).
        mode: which cache answers (every answering call can override it): ``shared`` compresses
            the document once with a question-independent suffix, so one short cache serves every
            question; ``query_aware`` puts the question in the suffix (paper), replaying pruning and
            the upper levels per question from the document's leaf tier; ``full`` keeps the whole
            prompt uncompressed (a plain prefill, exact; the document must fit the model's window).
        reask_question: ``query_aware`` only: the question steers pruning from the suffix and is
            asked again after the cache, so the answer starts from the exact question rather than
            from the merged suffix copies (default True; paper: False, the answer starts from the
            root's last logits). See README "Design and measurements".
        score_pooling: max-pool width over neighbouring document scores (default 3; paper: 1,
            none). Default chosen on passkey data, see README "Design and measurements".
        pool_unit: tokens of one ``word`` (numbers split into digits, names split into pieces)
            share their best score and survive or go together (default ``word``; paper: ``token``,
            which shreds multi-token numbers on small models).
        score_memory: prune by the best standardised score a token got at any level so far
            (default True; paper: False, each node judges afresh).
        shared_scorer: how the ``shared`` root's leaves score their tokens without a question:
            ``reconstruction`` (default; KVzip: the model repeats each leaf's piece after it, and a
            token scores the most attention it gets while being repeated; about twice the leaf
            compute) or ``last_token`` (paper: the calibrated attention of the fixed suffix's last
            token). A tree root's merged nodes score by the last token. The reconstruction root
            ranks whole sentences (``homer.scoring.RECONSTRUCTION_UNITS``: a token's score plus 4x
            its sentence's mean), so ``score_pooling``, ``pool_unit`` and ``score_memory`` shape a
            ``last_token`` root only. Question-aware pruning scores by every suffix row's most
            attention and ranks whole statements by their best token and their mean
            (``homer.scoring.Scoring.for_questions``).
        replay: how ``query_aware`` rebuilds the root from the leaf tier: ``recompute`` (default)
            keeps the ``final_cache_len`` best tokens of all leaves by their leaf scores (the question
            in each leaf's suffix) and re-reads them with one plain prefill of the kept tokens
            through every layer (``homer.recompute``); ``flat`` keeps the same tokens and runs only
            the upper layers over them as one node; ``tree`` replays the paper's merge tree (each
            level prunes again with the question). Two-tier test, held out: see README "Two tiers".
        shared_root: how the ``shared`` root is selected: ``auto`` (default: ``headwise`` where
            the model allows it, else ``flat``; RULER 8k held out, 24 paired samples each, it kept
            +0.06 more than ``flat`` at 4x and at 8x), ``headwise`` (twice the budget selected as
            ``flat`` selects and re-read, then each K/V head of each layer keeps its own tokens,
            KVzip's allocation, in a ragged cache of the same bytes: ``homer.headwise_root``; needs
            full attention in every layer), ``flat`` (each leaf's scores once, the best
            ``final_cache_len`` tokens of the whole document, then the upper layers over that single
            node, as ``replay="flat"``), ``recompute`` (that selection, re-read by a plain prefill of
            the kept tokens) or ``tree`` (paper: every merged node prunes again by its last token).
        calibration_segments: text segments of ``max_chunk_len`` tokens averaged by calibration.
        document_suffix: the fixed text after the document in ``shared`` mode.
        system_prompt: system message placed in the prefix (chat models).

    The scorer itself and the variants that measured no gain (uncalibrated and random scorers,
    more scoring rows, scoring every layer, sentence units) are ``homer.scoring.Scoring`` parts
    that ``benchmarks/ablations.py`` assembles; see ``HomerModel(scoring=...)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_chunk_len: int | None = Field(default=None, ge=64, le=1_048_576)
    warmup_layers: int | None = Field(default=None, ge=0)
    final_cache_len: int | None = Field(default=None, ge=16)
    mode: Mode = "shared"
    reask_question: bool = True
    score_pooling: int = Field(default=3, ge=1, le=63)
    pool_unit: PoolUnit = "word"
    score_memory: bool = True
    shared_scorer: SharedScorer = "reconstruction"
    replay: Replay = "recompute"
    shared_root: SharedRoot = "auto"
    calibration_segments: int = Field(default=48, ge=1, le=10_000)
    document_suffix: str = Field(default=DEFAULT_DOCUMENT_SUFFIX, min_length=1)
    system_prompt: str | None = None

    @model_validator(mode="after")
    def _cache_fits_chunk(self) -> HomerConfig:
        if (
            self.final_cache_len is not None
            and self.max_chunk_len is not None
            and self.final_cache_len > self.max_chunk_len
        ):
            raise ValueError(
                f"final_cache_len ({self.final_cache_len}) must not exceed max_chunk_len "
                f"({self.max_chunk_len}): the root chunk is never longer than one chunk"
            )
        return self

    def resolve(self, num_layers: int, max_positions: int, defaults: ModelDefaults) -> HomerConfig:
        """A copy with every ``None`` filled from ``defaults`` and checked against the model.

        Raises ``ValueError`` naming the setting when it does not fit the model.
        """
        mcl = self.max_chunk_len or defaults.max_chunk_len
        warmup = self.warmup_layers if self.warmup_layers is not None else defaults.warmup_layers
        final = self.final_cache_len or min(defaults.final_cache_len or mcl, mcl)
        if mcl > max_positions:
            raise ValueError(
                f"max_chunk_len={mcl} exceeds the model's {max_positions} positions "
                f"(max_position_embeddings); HOMER keeps every position below max_chunk_len"
            )
        if warmup >= num_layers:
            raise ValueError(
                f"warmup_layers={warmup} must be below the model's {num_layers} layers: the merge "
                f"levels need at least one layer"
            )
        if final > mcl:
            raise ValueError(f"final_cache_len ({final}) must not exceed max_chunk_len ({mcl})")
        return self.model_copy(update={"max_chunk_len": mcl, "warmup_layers": warmup, "final_cache_len": final})


class ModelDefaults(BaseModel):
    """Per-model defaults for the settings a ``HomerConfig`` leaves as ``None``."""

    model_config = ConfigDict(frozen=True)

    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int | None = None
    """None: the final cache is one chunk long (``max_chunk_len``)."""

    @classmethod
    def for_model(cls, num_layers: int, max_positions: int) -> ModelDefaults:
        """Generic rule: half the trained window (at most 4096) and about 60% warm-up layers."""
        return cls(max_chunk_len=min(4096, max(64, max_positions // 2)), warmup_layers=round(0.6 * num_layers))
