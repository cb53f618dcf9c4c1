"""Depth-first hierarchical merging: a whole document in, one short per-layer K/V cache out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from homer_integrations.homer.chunk import Chunk
from homer_integrations.homer.chunking import ChunkPlan, LeafInput, make_leaves
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.kv import cache_from_tensors, layer_tensors
from homer_integrations.homer.leaf_tier import LeafSlice, LeafTier
from homer_integrations.homer.merging import merge_siblings
from homer_integrations.homer.pruning import keep_mask, standardise
from homer_integrations.homer.schedule import LayerSchedule
from homer_integrations.homer.score_units import ScoreMemory
from homer_integrations.homer.scorers import ScoreInput
from homer_integrations.homer.scoring import Scoring


@dataclass(frozen=True)
class CompressorSettings:
    """Resolved settings of one compression (see ``HomerConfig`` for their meaning).

    ``scoring`` is what pruning ranks by (default: the paper's calibrated last-token score);
    ``suffix_reserve`` the suffix tokens a leaf tier's split is planned for.
    """

    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int
    scoring: Scoring = field(default_factory=Scoring)
    suffix_reserve: int = 0
    want_logits: bool = False


@dataclass
class CompressionResult:
    """The compressed cache and what it took.

    Attributes:
        keys, values: one [1, Hkv, K, d] tensor per decoder layer, all the same K.
        position_ids: [K] positions of the cached tokens (repeated after merges).
        origin: [K] document index of each cached token, -1 for prefix and suffix tokens.
        next_token_logits: [V] float32 logits after the last prompt token, if asked for.
        plan: how the document was split; schedule: the layers each tree level ran.
        peak_kv_bytes: the most K/V bytes alive at once during compression.
        seconds: wall time of the compression.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    position_ids: torch.Tensor
    origin: torch.Tensor
    next_token_logits: torch.Tensor | None
    plan: ChunkPlan
    schedule: LayerSchedule
    peak_kv_bytes: int
    seconds: float

    @property
    def last_position(self) -> int:
        """Largest position id in the cache; what follows it starts at ``last_position + 1``."""
        return int(self.position_ids.max())


ProgressFn = Callable[[int], None]
LeafFn = Callable[[int, int, bool], Chunk]
"""(leaf index, target length, is the root) -> that leaf, run through the leaf layers and pruned."""


@dataclass(frozen=True)
class PruneEvent:
    """One node's pruning, for diagnostics (``HomerCompressor.observer``).

    Attributes:
        layer: the decoder layer whose attention scored the node.
        origin: [T] document index of each token before pruning (-1 on prefix/suffix).
        reducible: [T] True on document tokens.
        scores: [T] the scores pruning ranked (after pooling and memory).
        keep: [T] True on the tokens that survived.
    """

    layer: int
    origin: torch.Tensor
    reducible: torch.Tensor
    scores: torch.Tensor
    keep: torch.Tensor


PruneObserver = Callable[[PruneEvent], None]

logger = logging.getLogger(__name__)


class HomerCompressor:
    """Runs the merge tree for one model: leaves -> prune -> merge -> ... -> root.

    ``bias`` is the calibration table [num_layers, max_chunk_len] (None unless the scorer needs
    calibration). ``progress`` is called with the number of document tokens each finished
    leaf consumed; ``observer``, if given, with every node's ``PruneEvent``.
    """

    def __init__(
        self,
        stack: DecoderStack,
        settings: CompressorSettings,
        bias: torch.Tensor | None,
        observer: PruneObserver | None = None,
    ) -> None:
        if bias is not None and tuple(bias.shape) != (stack.num_layers, settings.max_chunk_len):
            raise ValueError(
                f"calibration bias has shape {tuple(bias.shape)}, expected "
                f"({stack.num_layers}, {settings.max_chunk_len})"
            )
        self.stack = stack
        self.settings = settings
        self.bias = bias
        self.observer = observer
        self.scoring = settings.scoring
        self._alive: list[Chunk] = []
        self._peak = 0
        self._word_ids: torch.Tensor | None = None

    @torch.inference_mode()
    def compress(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        word_ids: torch.Tensor | None = None,
        plan: ChunkPlan | None = None,
    ) -> CompressionResult:
        """Compress prefix [P] + document [L] + suffix [S] token ids into one cache of <= final_cache_len.

        ``word_ids`` [L] (document unit index of each token) is what ``WordUnits`` pools over; ``plan``
        (default: planned for these lengths and ``suffix_reserve``) fixes the split, as a leaf tier's does.
        """
        start = time.perf_counter()
        s = self.settings
        plan = plan or ChunkPlan.build(
            prefix_ids.numel(), document_ids.numel(), suffix_ids.numel(), s.max_chunk_len, s.suffix_reserve
        )
        if (plan.prefix_len, plan.document_len, plan.suffix_len) != (
            prefix_ids.numel(),
            document_ids.numel(),
            suffix_ids.numel(),
        ):
            raise ValueError(f"the plan {plan} does not split these token counts")
        schedule = self._schedule(plan)
        leaves = make_leaves(prefix_ids, document_ids, suffix_ids, plan)
        self._word_ids = word_ids

        def leaf(index: int, target_len: int, is_root: bool) -> Chunk:
            return self._scratch_leaf(leaves[index], schedule.layers_at(0), target_len, is_root)

        root = self._tree(leaf, plan, schedule, progress)
        return self._result(root, plan, schedule, start)

    @torch.inference_mode()
    def build_leaf_tier(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        word_ids: torch.Tensor | None = None,
        key: str = "",
        progress: ProgressFn | None = None,
    ) -> LeafTier:
        """Run every leaf's prefix [P] + piece through the leaf layers once, without a suffix, and keep
        what a question needs (see ``LeafTier``). The split is planned for ``suffix_reserve`` suffix tokens.
        A probing scorer (``Scorer.probes``) also scores every leaf from its probe rows, once.
        """
        start = time.perf_counter()
        stack, s = self.stack, self.settings
        plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), 0, s.max_chunk_len, s.suffix_reserve)
        layers = self._schedule(plan).layers_at(0)
        P, L = plan.prefix_len, plan.document_len
        kv_shape = (1, stack.num_kv_heads, 0, stack.head_dim)
        prefix_cache = cache_from_tensors(*[[stack.empty(kv_shape) for _ in layers] for _ in "kv"])
        prefix_hidden = self._extend(stack.embed(prefix_ids), torch.arange(P), prefix_cache, layers)[0]
        prefix_keys, prefix_values = layer_tensors(prefix_cache)
        doc_shape = (1, stack.num_kv_heads, L, stack.head_dim)
        keys = [stack.empty(doc_shape) for _ in layers]
        values = [stack.empty(doc_shape) for _ in layers]
        hidden = stack.empty((1, L, prefix_hidden.shape[2]))
        probes = self.scoring.scorer.probes
        probe_scores = torch.zeros(L) if probes else None
        for index in range(plan.num_leaves):
            span = plan.piece(index)
            cache = cache_from_tensors(prefix_keys, prefix_values)
            positions = torch.arange(P, P + span.stop - span.start)
            hidden[:, span] = self._extend(stack.embed(document_ids[span]), positions, cache, layers)[0]
            if probe_scores is not None:
                probe_scores[span] = self._probe(
                    cache, torch.arange(P + span.stop - span.start), document_ids[span], layers
                )[P:]
            for k, v, (ck, cv) in zip(keys, values, zip(*layer_tensors(cache), strict=True), strict=True):
                k[:, :, span] = ck[:, :, P:]
                v[:, :, span] = cv[:, :, P:]
            del cache
            if progress is not None:
                progress(span.stop - span.start)
        return LeafTier(
            key=key,
            plan=plan,
            leaf_layers=len(layers),
            prefix_keys=tuple(prefix_keys),
            prefix_values=tuple(prefix_values),
            prefix_hidden=prefix_hidden,
            keys=tuple(keys),
            values=tuple(values),
            hidden=hidden,
            word_ids=word_ids,
            probe_scores=probe_scores,
            seconds=time.perf_counter() - start,
        )

    @torch.inference_mode()
    def replay(self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None) -> CompressionResult:
        """The compression ``compress`` would make of the tier's document with this suffix [S] (the same
        split), computed from the tier: only the suffix runs the leaf layers, then pruning and the upper levels.
        A probing scorer prunes the leaves by the probe scores the tier holds.
        """
        start = time.perf_counter()
        plan, schedule = self._replay_plan(tier, suffix_ids)

        def leaf(index: int, target_len: int, is_root: bool) -> Chunk:
            part = tier.leaf(index)
            chunk, scores = self._replayed_leaf(part, suffix_ids, plan, schedule.layers_at(0), target_len)
            if scores is not None:
                self._prune(chunk, schedule.layers_at(0)[-1], scores, target_len)
            return chunk

        root = self._tree(leaf, plan, schedule, progress)
        return self._result(root, plan, schedule, start)

    @torch.inference_mode()
    def replay_flat(
        self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None
    ) -> CompressionResult:
        """Question-aware selection across all leaves at once, then the upper layers over one node.

        Every leaf scores its tokens once, in its own context with the question in its suffix (the
        tree's leaf scores, word units, standardised per leaf); the ``final_cache_len`` best document
        tokens of the whole document survive (pairwise, in document order, affixes averaged as the
        tree averages them), and every layer above the leaves runs once over that single node.
        A fact is judged where it is clearest and never again by a merged node's noisier context.
        """
        start = time.perf_counter()
        plan, schedule = self._replay_plan(tier, suffix_ids)
        leaf_layers = schedule.layers_at(0)
        self._alive, self._peak = [], 0
        target = self.settings.final_cache_len
        leaf_target = target if plan.height == 0 else 0  # with several leaves every one is scored

        def select(first: int, height: int) -> Chunk:
            if height == 0:
                chunk, scores = self._replayed_leaf(tier.leaf(first), suffix_ids, plan, leaf_layers, leaf_target)
                if scores is not None:
                    ranked = self.scoring.without(ScoreMemory).rank(scores, chunk, self._words(chunk))
                    chunk.memory = standardise(ranked, chunk.reducible)
                if progress is not None:
                    progress(int(chunk.reducible.sum()))
            else:
                left = select(first, height - 1)
                self._alive.append(left)
                right = select(first + 2 ** (height - 1), height - 1)
                self._alive.pop()
                chunk = merge_siblings(left, right)
            if chunk.length > target:
                mask = keep_mask(chunk.memory, chunk.reducible, target)
                if self.observer is not None:
                    self.observer(PruneEvent(leaf_layers[-1], chunk.origin, chunk.reducible, chunk.memory, mask))
                chunk.keep(mask)
            return chunk

        root = select(0, plan.height)
        upper = range(leaf_layers.stop, self.stack.num_layers)
        if upper:
            self._run_layers(root, upper, target, is_root=True)
        return self._result(root, plan, schedule, start)

    def _replay_plan(self, tier: LeafTier, suffix_ids: torch.Tensor) -> tuple[ChunkPlan, LayerSchedule]:
        """The tier's split with this suffix, and its schedule (which must run the tier's leaf layers)."""
        if self.scoring.scorer.probes and tier.probe_scores is None:
            raise ValueError("this scorer prunes leaves by probe scores: build the leaf tier with it")
        plan = tier.plan.with_suffix(suffix_ids.numel())
        schedule = self._schedule(plan)
        if len(schedule.layers_at(0)) != tier.leaf_layers:
            raise ValueError(
                f"the leaf tier ran {tier.leaf_layers} leaf layers, these settings run {len(schedule.layers_at(0))}"
            )
        self._word_ids = tier.word_ids
        return plan, schedule

    # ----------------------------------------------------------------------------- the tree
    def _schedule(self, plan: ChunkPlan) -> LayerSchedule:
        """The layer schedule for ``plan``'s tree; warm-up is lowered (with a warning) where it must be."""
        s = self.settings
        if plan.height + 1 > self.stack.num_layers:
            raise ValueError(
                f"the document needs a merge tree of height {plan.height} ({plan.num_leaves} chunks), but the "
                f"model has only {self.stack.num_layers} layers for its {plan.height + 1} levels; raise max_chunk_len"
            )
        warmup = min(s.warmup_layers, self.stack.num_layers - plan.height - 1)
        if warmup < s.warmup_layers:
            logger.warning(
                "a tree of height %d needs %d merging layers: warm-up lowered from %d to %d layers for "
                "this document (raise max_chunk_len to keep it)",
                plan.height,
                plan.height + 1,
                s.warmup_layers,
                warmup,
            )
        return LayerSchedule.build(self.stack.num_layers, warmup, plan.height)

    def _tree(self, leaf: LeafFn, plan: ChunkPlan, schedule: LayerSchedule, progress: ProgressFn | None) -> Chunk:
        self._alive, self._peak = [], 0
        return self._subtree(leaf, 0, plan.height, self.settings.final_cache_len, plan, schedule, progress, True)

    def _result(self, root: Chunk, plan: ChunkPlan, schedule: LayerSchedule, start: float) -> CompressionResult:
        logits = self.stack.logits(root.hidden[:, -1:]) if self.settings.want_logits else None
        keys, values = layer_tensors(root.cache)
        return CompressionResult(
            keys=keys,
            values=values,
            position_ids=root.position_ids,
            origin=root.origin,
            next_token_logits=logits,
            plan=plan,
            schedule=schedule,
            peak_kv_bytes=self._peak,
            seconds=time.perf_counter() - start,
        )

    def _subtree(
        self,
        leaf: LeafFn,
        first: int,
        height: int,
        target_len: int,
        plan: ChunkPlan,
        schedule: LayerSchedule,
        progress: ProgressFn | None,
        is_root: bool = False,
    ) -> Chunk:
        """Post-order over leaves ``first..first+2**height-1``: left subtree, right subtree, merge
        (children freed), then this level's layers."""
        if height == 0:
            chunk = leaf(first, target_len, is_root)
            if progress is not None:
                span = plan.piece(first)
                progress(span.stop - span.start)
            return chunk
        half = 2 ** (height - 1)
        child_len = plan.child_target_len
        left = self._subtree(leaf, first, height - 1, child_len, plan, schedule, progress)
        self._alive.append(left)
        right = self._subtree(leaf, first + half, height - 1, child_len, plan, schedule, progress)
        self._alive.pop()
        merged = merge_siblings(left, right)
        del left, right
        self._run_layers(merged, schedule.layers_at(height), target_len, is_root)
        return merged

    # ----------------------------------------------------------------------------- leaves
    def _scratch_leaf(self, leaf: LeafInput, layers: range, target_len: int, is_root: bool) -> Chunk:
        """A leaf computed from its tokens: prefix + piece + suffix through the leaf layers, pruned."""
        chunk = Chunk(
            hidden=self.stack.embed(leaf.input_ids),
            position_ids=leaf.position_ids,
            reducible=leaf.reducible,
            origin=leaf.origin,
            memory=torch.full((leaf.origin.numel(),), float("-inf")),
            prefix_len=leaf.prefix_len,
            suffix_len=leaf.suffix_len,
        )
        if not (self.scoring.scorer.probes and chunk.length > target_len and not is_root):
            self._run_layers(chunk, layers, target_len, is_root)
            return chunk
        # a probing scorer: run the leaf whole, probe its prefix + piece as the leaf tier does, prune
        self._run_layers(chunk, layers, chunk.length, is_root=False)
        kept = chunk.length - chunk.suffix_len
        keys, values = layer_tensors(chunk.cache)
        probe_cache = cache_from_tensors([k[:, :, :kept] for k in keys], [v[:, :, :kept] for v in values])
        piece_ids = leaf.input_ids[chunk.document]
        scores = self._probe(probe_cache, chunk.position_ids[:kept], piece_ids, layers)
        self._prune(chunk, layers[-1], torch.cat([scores, torch.zeros(chunk.suffix_len)]), target_len)
        return chunk

    def _replayed_leaf(
        self, part: LeafSlice, suffix_ids: torch.Tensor, plan: ChunkPlan, layers: range, target_len: int
    ) -> tuple[Chunk, torch.Tensor | None]:
        """A leaf from its stored prefix + piece, and its pruning scores [T] (None when it fits ``target_len``):
        only the suffix [S] runs the leaf layers.

        The stored hidden states are post-MLP; the suffix is never pruned and the MLP acts per token,
        so pruning after the last MLP keeps what pruning before it would.
        """
        P, S = plan.prefix_len, plan.suffix_len
        n = part.hidden.shape[1] - P
        suffix_positions = torch.arange(P + plan.piece_len, P + plan.piece_len + S)
        flags = torch.zeros(P + n + S, dtype=torch.bool)
        flags[P : P + n] = True
        chunk = Chunk(
            hidden=part.hidden,
            position_ids=torch.cat([part.position_ids, suffix_positions]),
            reducible=flags,
            origin=torch.cat([part.origin, torch.full((S,), -1)]),
            memory=torch.full((P + n + S,), float("-inf")),
            prefix_len=P,
            suffix_len=S,
            cache=cache_from_tensors(part.keys, part.values),
        )
        scored = chunk if chunk.length > target_len else None
        probe = scored is not None and self.scoring.scorer.probes
        suffix_hidden, scores = self._extend(
            self.stack.embed(suffix_ids), suffix_positions, chunk.cache, layers, None if probe else scored
        )
        chunk.hidden = torch.cat([part.hidden, suffix_hidden], dim=1)
        if probe:
            scores = torch.cat([part.probe_scores, torch.zeros(S)])
        return chunk, scores

    def _probe(
        self, cache: DynamicCache, positions: torch.Tensor, piece_ids: torch.Tensor, layers: range
    ) -> torch.Tensor:
        """Scores [T] of a leaf's T cached tokens at ``positions`` [T] from its scorer's probe rows (at the
        next positions), run through ``layers`` against ``cache`` and then dropped from it."""
        stack, scorer, length = self.stack, self.scoring.scorer, positions.numel()
        probe_ids = scorer.probe_ids(piece_ids)
        rows = probe_ids.numel()
        start = int(positions.max()) + 1
        hidden = stack.embed(probe_ids)
        rope = stack.rotary(hidden, torch.arange(start, start + rows))
        mask = stack.causal_mask_after(length, rows)
        reducible = torch.ones(length, dtype=torch.bool)
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            score_here = scorer.scores_at(layer_idx, layers)
            hidden, query = stack.attention(
                layer_idx, hidden, rope, cache, query_rows=rows if score_here else 0, mask=mask
            )
            if score_here:
                x = ScoreInput(
                    query, cache.layers[layer_idx].keys, positions, reducible, layer_idx, stack.scaling, None
                )
                evidence.append(scorer.probe_scores(x, length))
            if layer_idx != layers[-1]:
                hidden = stack.mlp(layer_idx, hidden)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
        return scorer.combine(evidence, reducible)

    def _extend(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        layers: range,
        scored: Chunk | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``layers`` (attention and MLP) on new rows [1, R, D] at ``positions`` [R] after the tokens
        ``cache`` holds, appending their K/V. With ``scored`` (the chunk whose cache this is, the rows
        its suffix) also return the chunk's pruning scores [T] from the suffix's queries."""
        rows = hidden.shape[1]
        if rows == 0:
            return hidden, None
        past = cache.layers[layers[0]].keys.shape[2] if len(cache.layers) > layers[0] else 0
        mask = self.stack.causal_mask_after(past, rows)
        rope = self.stack.rotary(hidden, positions)
        scorer = self.scoring.scorer
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            score_here = scored is not None and scorer.scores_at(layer_idx, layers)
            query_rows = self._rows(scored) if score_here else 0
            hidden, query = self.stack.attention(layer_idx, hidden, rope, cache, query_rows=query_rows, mask=mask)
            if score_here:
                self._record_peak(scored)
                evidence.append(self._layer_scores(scored, layer_idx, query))
            hidden = self.stack.mlp(layer_idx, hidden)
        return hidden, scorer.combine(evidence, scored.reducible) if evidence else None

    # ----------------------------------------------------------------------------- one node
    def _run_layers(self, chunk: Chunk, layers: range, target_len: int, is_root: bool) -> None:
        """Run ``layers`` on ``chunk``; in the last one prune to ``target_len`` between attention and MLP."""
        stack = self.stack
        rope = stack.rotary(chunk.hidden, chunk.position_ids)
        last = layers[-1]
        shrinks = chunk.length > target_len
        scorer = self.scoring.scorer
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            score_here = shrinks and scorer.scores_at(layer_idx, layers)
            chunk.hidden, query = stack.attention(
                layer_idx, chunk.hidden, rope, chunk.cache, query_rows=self._rows(chunk) if score_here else 0
            )
            self._record_peak(chunk)
            if score_here:
                evidence.append(self._layer_scores(chunk, layer_idx, query))
            if shrinks and layer_idx == last:
                self._prune(chunk, layer_idx, scorer.combine(evidence, chunk.reducible), target_len)
            if is_root and layer_idx == stack.num_layers - 1:
                # Only the last position's output is ever read (next-token logits): skip the rest.
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden[:, -1:])
            else:
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden)

    def _words(self, chunk: Chunk) -> torch.Tensor | None:
        """Document unit index [T] of each token of ``chunk`` (-1 on prefix/suffix), None without unit ids."""
        if self._word_ids is None:
            return None
        return torch.where(chunk.origin >= 0, self._word_ids[chunk.origin.clamp(min=0)], -1)

    def _prune(self, chunk: Chunk, layer_idx: int, scores: torch.Tensor, target_len: int) -> None:
        """The scoring's units over ``scores`` [T], then keep the best ``target_len`` tokens."""
        scores = self.scoring.rank(scores, chunk, self._words(chunk))
        mask = keep_mask(scores, chunk.reducible, target_len)
        if self.observer is not None:
            self.observer(PruneEvent(layer_idx, chunk.origin, chunk.reducible, scores, mask))
        chunk.keep(mask)

    def _layer_scores(self, chunk: Chunk, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """The scorer's rating [T] of every token of ``chunk`` in this layer."""
        bias = None if self.bias is None else self.bias[layer_idx]
        keys = chunk.cache.layers[layer_idx].keys
        x = ScoreInput(query, keys, chunk.position_ids, chunk.reducible, layer_idx, self.stack.scaling, bias)
        return self.scoring.scorer(x)

    def _rows(self, chunk: Chunk) -> int:
        """Query rows that score pruning: the scorer's last rows, all inside the suffix."""
        return max(1, min(self.scoring.scorer.rows, chunk.suffix_len))

    def _record_peak(self, current: Chunk) -> None:
        live = current.kv_bytes + sum(c.kv_bytes for c in self._alive)
        self._peak = max(self._peak, live)
