"""How HOMER builds what ``HomerConfig`` asks for: the shared root's builder, the per-question replay, and
the ``Recipe`` that holds them with the scoring and the two remaining research switches.

A user sets ``HomerConfig`` (seven fields); the defaults here are the measured best, and the variants that
lost their measurements stay reachable for ``benchmarks/`` and ``research/``:
``HomerModel(recipe=Recipe(shared_root=TreeRoot(), replay=FlatReplay()))``. Each unit is a frozen
dataclass whose ``repr`` names it and its parameters, so it can be part of a document-cache key, as
``Scoring`` is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol, runtime_checkable

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.encoded import EncodedDocument
from homer_integrations.homer.layers.nodes import CompressionResult, CompressorSettings, ProgressFn
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.echo import PassageEcho
from homer_integrations.homer.reading.passages import Passages, PassageSelection
from homer_integrations.homer.scoring.calibration import SEGMENTS
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.tree import recompute
from homer_integrations.homer.tree.compressor import HomerCompressor
from homer_integrations.homer.tree.headwise import compress_headwise, headwise_refusal, select_candidates

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------- shared roots
@dataclass(frozen=True)
class RootSpan:
    """What a shared root is built from: the call's ``document`` (prefix [P], document [N] and suffix [S]
    token ids, its units on demand) and how to prune it.

    ``word_ids`` [N]: each document token's unit for the shared scoring (None: single tokens, or no
    pruning); ``whole_words()`` [N]: each token's word (computed only by a root that asks for it);
    ``repeat_ids`` [R]: the reconstruction prompt; ``prunes``: the prompt exceeds ``final_cache_len``.
    """

    document: EncodedDocument
    word_ids: torch.Tensor | None
    repeat_ids: torch.Tensor
    prunes: bool
    progress: ProgressFn | None = None

    @property
    def prefix_ids(self) -> torch.Tensor:
        return self.document.prefix_ids

    @property
    def document_ids(self) -> torch.Tensor:
        return self.document.document_ids

    @property
    def suffix_ids(self) -> torch.Tensor:
        return self.document.suffix_ids

    def whole_words(self) -> torch.Tensor | None:
        """Each document token's word [N] (None where offsets do not line up)."""
        return self.document.units("word")


@runtime_checkable
class SharedRoot(Protocol):
    """How the ``shared`` root is selected from the document. ``rereads``: the kept tokens are re-read by a
    plain prefill, which numbers them up to the model's window (the cache entry's position limit)."""

    rereads: ClassVar[bool]

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        """The root of ``span`` in ``compressor.nodes.settings.final_cache_len`` tokens."""
        ...


@dataclass(frozen=True)
class TreeRoot:
    """The paper's merge tree: every merged node prunes again by its last token (also the ``full``
    prefill's builder, which prunes nothing)."""

    rereads: ClassVar[bool] = False

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        return compressor.tree.compress(
            span.prefix_ids, span.document_ids, span.suffix_ids, progress=span.progress, word_ids=span.word_ids
        )


@dataclass(frozen=True)
class FlatRoot:
    """Each leaf's scores once, the best ``final_cache_len`` tokens of the whole document, then the upper
    layers over that single node (as ``FlatReplay``)."""

    rereads: ClassVar[bool] = False

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        return compressor.flat.compress_flat(
            span.prefix_ids, span.document_ids, span.suffix_ids, span.progress, span.word_ids
        )


@dataclass(frozen=True)
class RecomputeRoot:
    """``FlatRoot``'s selection, re-read by one plain prefill of the kept tokens (``homer.tree.recompute``)."""

    rereads: ClassVar[bool] = True

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        return compressor.flat.compress_flat(
            span.prefix_ids, span.document_ids, span.suffix_ids, span.progress, span.word_ids, recompute=True
        )


@dataclass(frozen=True)
class HeadwiseRoot:
    """Twice the budget selected as ``FlatRoot`` selects and re-read, then each K/V head of each layer keeps
    its own tokens (KVzip's allocation) in a ragged cache of the same bytes (``homer.headwise_root``);
    needs full attention in every layer. A prompt within the budget is kept whole, as ``FlatRoot`` does."""

    rereads: ClassVar[bool] = True

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        if not span.prunes:
            return FlatRoot().build(compressor, span)
        return compress_headwise(
            compressor,
            span.prefix_ids,
            span.document_ids,
            span.suffix_ids,
            span.repeat_ids,
            span.progress,
            span.word_ids,
            span.whole_words(),
        )


@dataclass(frozen=True)
class WindowRoot:
    """A root of about ``tokens`` tokens, not bounded by the chunk length: ``FlatRoot``'s selection of that
    many document tokens (every word it touches whole, where that stays in the window), re-read by one plain
    prefill (``homer.tree.recompute``), kept dense. For a book past the window: a root as large as the window
    allows (16k-24k of a 100k-170k-token book for a 32k-window model) instead of one chunk's. A document
    that short is prefilled whole."""

    tokens: int = 16384
    rereads: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if type(self.tokens) is not int or self.tokens < 16:
            raise ValueError(f"WindowRoot.tokens must be a whole number of at least 16, not {self.tokens!r}")

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        fixed = span.prefix_ids.numel() + span.suffix_ids.numel()
        no_probe = span.prefix_ids.new_zeros(0)  # nothing is read after the kept tokens while building
        return select_candidates(
            compressor,
            span.prefix_ids,
            span.document_ids,
            span.suffix_ids,
            no_probe,
            span.progress,
            span.word_ids,
            whole=span.whole_words(),
            tokens=max(self.tokens - fixed, 1),
        )


@dataclass(frozen=True)
class AutoRoot:
    """The default: ``HeadwiseRoot`` where the model allows it, else ``FlatRoot`` (RULER 8k held out, 24
    paired samples each: head-wise kept +0.06 more than flat at 4x and at 8x)."""

    rereads: ClassVar[bool] = True
    """A head-wise root re-reads; the entry's position limit must allow it."""

    def build(self, compressor: HomerCompressor, span: RootSpan) -> CompressionResult:
        return self.choose(compressor, span).build(compressor, span)

    def choose(self, compressor: HomerCompressor, span: RootSpan) -> SharedRoot:
        """``HeadwiseRoot`` unless ``headwise_refusal`` names a reason, then ``FlatRoot`` (logged)."""
        fixed = span.prefix_ids.numel() + span.suffix_ids.numel()
        budget = compressor.nodes.settings.final_cache_len
        refusal = headwise_refusal(compressor.nodes.stack, budget, span.repeat_ids.numel(), fixed)
        if refusal is None:
            return HeadwiseRoot()
        logger.info("AutoRoot uses the flat root: the head-wise root %s", refusal)
        return FlatRoot()


SHARED_ROOTS: dict[str, SharedRoot] = {
    "auto": AutoRoot(),
    "headwise": HeadwiseRoot(),
    "flat": FlatRoot(),
    "recompute": RecomputeRoot(),
    "tree": TreeRoot(),
    "window": WindowRoot(),
}
"""Each shared root by the name the removed ``HomerConfig.shared_root`` gave it (benchmarks' flags)."""


# ------------------------------------------------------------------------------------- replays
class Reread(NamedTuple):
    """A re-read's inputs: the call's ``document`` (its prefix [P] and document [N] token ids: a leaf tier
    keeps no ids), ``extra`` [E],
    document token indices kept beside the selection whatever it chose (``lexical.LexicalEvidence``), the
    ``question``, the model's context ``window``, ``passages(selection)``: the document's passages as
    ``selection`` groups them (None where the tokenizer's offsets do not line up with statements), and
    ``rate()``."""

    document: EncodedDocument
    extra: torch.Tensor | None
    question: str = ""
    window: int = 0
    passages: Callable[[PassageSelection], Passages | None] = lambda selection: None
    rate: Callable[[], float] = lambda: 0.0
    """Tokens per second this machine re-reads with the model (``budget.read_rate``)."""

    @property
    def prefix_ids(self) -> torch.Tensor:
        return self.document.prefix_ids

    @property
    def document_ids(self) -> torch.Tensor:
        return self.document.document_ids


CompressorFor = Callable[[int], HomerCompressor]
"""A query-aware compressor that selects ``final_cache_len`` less this many reserved tokens."""


@runtime_checkable
class Replay(Protocol):
    """How ``query_aware`` builds the root the model answers one question from: from the document's leaf
    tier (``leaf_tier()``: read or built on first call) or from its text alone (``reread()``)."""

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        """The root of the document with ``suffix_ids`` [S] (which holds the question); ``leaf_tier()`` gives
        the document's leaf tier (built once, on the first call of the first question that needs it) and
        ``reread()`` what a prefill of the kept tokens needs."""
        ...

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        """Whether a question about a document of ``document_tokens`` reads its leaf tier (a model of this
        context ``window``, re-reading ``final_cache_len`` tokens): what ``cache_document`` prepares."""
        ...


@dataclass(frozen=True)
class RecomputeReplay:
    """Within the model's window (``AutoReplay``): the ``final_cache_len`` best tokens of all leaves by
    their leaf scores (the question in each leaf's suffix), re-read by one plain prefill of the kept
    tokens through every layer (``homer.tree.recompute``); ``extra`` evidence tokens take their share of the
    same budget."""

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return True

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        r = reread()
        reserved = 0 if r.extra is None else r.extra.numel()
        chosen = compressor(reserved)
        return chosen.flat.replay_recompute(leaf_tier(), r.prefix_ids, r.document_ids, suffix_ids, extra=r.extra)


@dataclass(frozen=True)
class FlatReplay:
    """``RecomputeReplay``'s selection, run through the upper layers only, as one node."""

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return True

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        return compressor(0).flat.replay_flat(leaf_tier(), suffix_ids)


@dataclass(frozen=True)
class TreeReplay:
    """The paper's merge tree replayed: each level prunes again with the question."""

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return True

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        return compressor(0).tree.replay(leaf_tier(), suffix_ids)


class PassageRoom(NamedTuple):
    """What a passage re-read works with: the call's ``inputs``, the ``chosen`` compressor, the document's
    ``passages``, the tokens they may fill (``budget``), the split the re-read reports with (``plan``),
    the question's suffix [S] and when the question's work began (``started``, ``time.perf_counter()``)."""

    inputs: Reread
    chosen: HomerCompressor
    passages: Passages
    budget: int
    plan: ChunkPlan
    suffix_ids: torch.Tensor
    started: float


@dataclass(frozen=True)
class PassageReplay:
    """Whole passages ranked by BM25 (fused with question attention when the selection weighs it:
    ``passages.PassageSelection``), as many as fill the ``budget`` (``budget.ReadBudget``: what this
    machine re-reads in about a second, at least 512 tokens), re-read by one plain prefill. BM25
    alone reads the document's text only: no leaf tier is built. A document within ``final_cache_len``,
    or a tokenizer whose offsets give no statements, replays as ``RecomputeReplay``."""

    selection: PassageSelection = field(default_factory=PassageSelection)
    budget: ReadBudget = field(default_factory=ReadBudget)

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return self.selection.attention > 0 or document_tokens <= final_cache_len

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        def select_and_reread(room: PassageRoom) -> CompressionResult:
            scores = room.chosen.flat.document_scores(leaf_tier(), suffix_ids) if self.selection.attention > 0 else None
            return self.read_kept(room, self.selection.select(room.inputs.question, scores, room.passages, room.budget))

        return self.read(leaf_tier, suffix_ids, compressor, reread, select_and_reread)

    def read_kept(self, room: PassageRoom, kept: torch.Tensor) -> CompressionResult:
        """The root of ``room``'s question over the ``kept`` document tokens [K] (ascending): one plain prefill
        of them (``recompute.reread``); the benchmarks' ways of reading the same passages override it."""
        inputs = room.inputs
        return recompute.reread(
            room.chosen.nodes, room.plan, inputs.prefix_ids, inputs.document_ids, kept, room.suffix_ids, room.started
        )

    def read(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
        read: Callable[[PassageRoom], CompressionResult],
    ) -> CompressionResult:
        """``read``'s root from the document's passages (``room``), or ``RecomputeReplay``'s where the
        document fits ``final_cache_len`` or has no statements: what every passage replay (this one's
        selection, the benchmarks' ablations) shares."""
        started = time.perf_counter()
        inputs = reread()
        chosen = compressor(0)
        room = self.room(inputs, chosen.nodes.settings, suffix_ids)
        if room is None:
            return RecomputeReplay().replay(leaf_tier, suffix_ids, compressor, lambda: inputs)
        return read(PassageRoom(inputs, chosen, *room, suffix_ids, started))

    def room(
        self, inputs: Reread, settings: CompressorSettings, suffix_ids: torch.Tensor
    ) -> tuple[Passages, int, ChunkPlan] | None:
        """The document's passages, the tokens they may fill and the split the re-read reports with; None
        where the document fits ``final_cache_len`` or has no statements (``RecomputeReplay`` then)."""
        prefix, document, suffix = inputs.prefix_ids.numel(), inputs.document_ids.numel(), suffix_ids.numel()
        floor = settings.final_cache_len - prefix - suffix
        passages = inputs.passages(self.selection) if document > floor else None
        if passages is None:
            return None
        budget = self.budget.kept(floor, inputs.window, document, inputs.rate(), passages.documents)
        plan = ChunkPlan.build(prefix, document, 0, settings.max_chunk_len, settings.suffix_reserve)
        return passages, budget, plan.with_suffix(suffix)


@dataclass(frozen=True)
class AutoReplay:
    """The default: ``PassageReplay`` for a document longer than the model's window, ``RecomputeReplay``
    within it. Past the window (Northanger Abbey, 102k tokens, tuning split) single statements chosen by
    attention kept the asked fact for 19 of 36 questions and BM25's passages 28 (``homer.reading.passages``), with
    no leaf tier to build; within it (RULER 4k-32k) the token selection answers as a plain prefill does."""

    passages: PassageReplay = field(default_factory=PassageReplay)

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return document_tokens <= window or self.passages.reads_tier(document_tokens, window, final_cache_len)

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        inputs = reread()
        chosen: Replay = self.passages if inputs.document_ids.numel() > inputs.window else RecomputeReplay()
        return chosen.replay(leaf_tier, suffix_ids, compressor, lambda: inputs)


REPLAYS: dict[str, Replay] = {
    "auto": AutoReplay(),
    "recompute": RecomputeReplay(),
    "passages": PassageReplay(),
    "flat": FlatReplay(),
    "tree": TreeReplay(),
}
"""Each replay by the name the removed ``HomerConfig.replay`` gave it (benchmarks' flags)."""


# ------------------------------------------------------------------------------------- the recipe
@dataclass(frozen=True)
class Recipe:
    """Every research switch of one engine, ``HomerModel(recipe=...)``; the defaults are the package's.

    Args:
        shared_root: how the ``shared`` root is selected (``SHARED_ROOTS``). Part of the root's cache key.
        replay: how ``query_aware`` rebuilds the root from the leaf tier (``REPLAYS``). In no cache key:
            the leaf tier is the same for every replay, and a replayed root is never stored.
        scoring: what shared roots prune by (None: the package's, ``Scoring.default()`` with
            reconstruction-scored leaves, ``Scoring.with_reconstruction``; ``Scoring.default()`` itself is
            the paper's last-token shared scorer). Part of the root's cache key.
        question_scoring: what query-aware compressions prune by (None: ``Scoring.for_questions()`` when
            ``scoring`` is None, else ``scoring.with_question()``).
        echo: ``full`` only: the question's passages whose K/V the prefill holds, copied once more right
            before it (``echo.PassageEcho``; None: the question alone follows the prefill). In no cache key:
            the prefill is the same either way.
        reask_question: ``query_aware`` only: the question is asked again after the cache, so the answer
            starts from the exact question (default True; paper: False, the answer starts from the root's
            last logits). A switch of the prompt layout (``Prompting``) for every replay alike, so it sits
            here rather than in one replay unit.
        calibration_segments: segments a missing calibration table averages (``Calibration(segments=)``):
            the table is keyed by model, RoPE, chunk length and dtype only, so this is how a table is
            computed, not which one is read; tests lower it. Kept in the root's key, as before.
    """

    shared_root: SharedRoot = field(default_factory=AutoRoot)
    replay: Replay = field(default_factory=AutoReplay)
    scoring: Scoring | None = None
    question_scoring: Scoring | None = None
    echo: PassageEcho | None = field(default_factory=PassageEcho)
    reask_question: bool = True
    calibration_segments: int = SEGMENTS

    def __post_init__(self) -> None:
        if not isinstance(self.shared_root, SharedRoot):
            raise TypeError(
                f"Recipe.shared_root must be a SharedRoot ({', '.join(SHARED_ROOTS)}), not {self.shared_root!r}"
            )
        if not isinstance(self.replay, Replay):
            raise TypeError(f"Recipe.replay must be a Replay ({', '.join(REPLAYS)}), not {self.replay!r}")
        if self.echo is not None and not isinstance(self.echo, PassageEcho):
            raise TypeError(f"Recipe.echo must be a homer.reading.echo.PassageEcho or None, not {self.echo!r}")
        for name in ("scoring", "question_scoring"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Scoring):
                raise TypeError(f"Recipe.{name} must be a homer.scoring.chain.Scoring or None, not {value!r}")
        segments = self.calibration_segments
        if type(segments) is not int or not 1 <= segments <= 10_000:
            raise ValueError(f"Recipe.calibration_segments must be a whole number from 1 to 10000, not {segments!r}")
