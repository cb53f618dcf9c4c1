"""``TierCompressor``: HOMER's question-aware selection made flat, and re-read by a plain prefill.

Instead of the paper's tree (each merged node prunes again, judging a fact in a noisier, merged
context), every leaf scores its tokens once, with the question in its own suffix, and the
``final_cache_len`` best document tokens of the whole document survive (``_select_flat``). The kept
tokens are then either run through the upper layers as one node (``replay_flat``, ``compress_flat``)
or re-read by one plain prefill of prefix + kept tokens + suffix through every layer
(``replay_recompute``, ``compress_flat(recompute=True)``, see ``recompute``): HOMER picks what to keep,
an ordinary prompt reads it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from homer_integrations.homer.chunk import Chunk
from homer_integrations.homer.chunking import ChunkPlan
from homer_integrations.homer.compressor import CompressionResult, ProgressFn, PruneEvent
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.kv import cache_from_tensors
from homer_integrations.homer.leaf_batch import batchable, leaf_positions, leaf_reducible, score_leaves
from homer_integrations.homer.leaf_tier import LeafTier
from homer_integrations.homer.merging import merge_siblings
from homer_integrations.homer.probing import probe_scores
from homer_integrations.homer.pruning import keep_mask, standardise
from homer_integrations.homer.recompute import prefill_kept, whole_units
from homer_integrations.homer.replay import FlatLeafFn, LeafTierCompressor
from homer_integrations.homer.schedule import LayerSchedule
from homer_integrations.homer.score_units import ScoreMemory


class TierCompressor(LeafTierCompressor):
    """``LeafTierCompressor`` plus the flat selection across all leaves and its plain-prefill re-read."""

    @torch.inference_mode()
    def replay_flat(
        self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None
    ) -> CompressionResult:
        """Question-aware selection across all leaves at once (see ``_flat``), from the tier."""
        start = time.perf_counter()
        plan, schedule = self._replay_plan(tier, suffix_ids)
        leaf = self._tier_leaves(tier, suffix_ids, plan, schedule)
        return self._result(self._flat(leaf, plan, schedule, progress), plan, schedule, start)

    @torch.inference_mode()
    def replay_recompute(
        self,
        tier: LeafTier,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        extra: torch.Tensor | None = None,
    ) -> CompressionResult:
        """``replay_flat``'s selection, then one plain prefill of prefix [P] + the kept document tokens (in
        document order) + suffix [S] through every layer (``recompute.prefill_kept``); ``prefix_ids`` and
        ``document_ids`` [N] are the tier's (it keeps no token ids). ``extra`` [E]: document token indices
        re-read beside the selection whatever it chose (``lexical.LexicalEvidence``). A tier of one leaf
        is already exact: its replay is ``replay_flat``'s."""
        if document_ids.numel() != tier.document_tokens:
            raise ValueError(f"the leaf tier holds {tier.document_tokens} document tokens, not {document_ids.numel()}")
        if tier.plan.height == 0:
            return self.replay_flat(tier, suffix_ids, progress)
        start = time.perf_counter()
        plan, schedule, leaves = self._question_leaves(tier, suffix_ids)
        selected = self._select_flat(leaves, plan, schedule, progress, scores_only=True)
        return self._recomputed(selected, prefix_ids, document_ids, suffix_ids, plan, start, extra=extra)

    @torch.inference_mode()
    def document_scores(self, tier: LeafTier, suffix_ids: torch.Tensor) -> torch.Tensor:
        """Every document token's selection score [N] with this suffix [S]: each leaf scored from the tier
        (the question in its suffix), the scoring's units but memory applied, standardised per leaf:
        the scores ``replay_recompute``'s flat selection ranks, for a selection of its own."""
        plan, _, leaf = self._question_leaves(tier, suffix_ids)
        scoring = self.scoring.without(ScoreMemory)
        scores = torch.empty(tier.document_tokens)
        for index in range(plan.num_leaves):
            chunk, raw = leaf(index, 0)  # a target of 0: every leaf is scored
            assert raw is not None
            doc = chunk.origin >= 0
            ranked = standardise(scoring.rank(raw, chunk, self._words(chunk)), chunk.reducible)
            scores[chunk.origin[doc]] = ranked[doc.to(ranked.device)].float().cpu()
        return scores

    @torch.inference_mode()
    def reread(
        self,
        plan: ChunkPlan,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        kept: torch.Tensor,
        suffix_ids: torch.Tensor,
        started: float,
    ) -> CompressionResult:
        """One plain prefill of prefix [P] + ``document_ids[kept]`` ([K] ascending) + suffix [S]
        (``recompute.prefill_kept``), reported with the document's split ``plan``; ``started``: when the
        question's work began (``time.perf_counter()``)."""
        result = prefill_kept(self.stack, self.settings, prefix_ids, document_ids, kept, suffix_ids)
        return replace(result, plan=plan, seconds=time.perf_counter() - started)

    @torch.inference_mode()
    def compress_flat(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        word_ids: torch.Tensor | None = None,
        recompute: bool = False,
        whole: torch.Tensor | None = None,
    ) -> CompressionResult:
        """``_flat`` from the document's tokens: each leaf runs prefix [P] + piece, is scored (by its
        scorer's probe rows, or by the suffix [S] run after it), pruned and dropped before the next;
        no tier is held, so peak memory stays that of one leaf plus the kept tokens. ``recompute``: the
        selection is re-read by one plain prefill of the kept tokens (``recompute.prefill_kept``) instead
        of running the upper layers over it, and with ``whole`` [N] (each document token's unit) it re-reads
        every unit the selection touched whole (``recompute.whole_units``)."""
        if whole is not None and not recompute:
            raise ValueError("compress_flat(whole=...) needs recompute=True: only the re-read keeps units whole")
        start = time.perf_counter()
        s = self.settings
        plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), suffix_ids.numel(), s.max_chunk_len)
        schedule = self._schedule(plan)
        layers = schedule.layers_at(0)
        scorer = self.scoring.scorer
        reread = recompute and plan.height > 0
        # a re-read keeps nothing the leaves compute after the probe's layer: they stop there
        run = range(layers.start, scorer.probe_last(layers) + 1) if reread and scorer.probes else layers
        prefix = self._prefix_part(prefix_ids, run)
        self._word_ids = word_ids

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            span = plan.piece(index)
            part = self._leaf_part(prefix, document_ids[span], span.start, run)
            if not (scorer.probes and part.hidden.shape[1] + plan.suffix_len > target_len):
                return self._replayed_leaf(part, suffix_ids, plan, layers, target_len)
            cache = cache_from_tensors(part.keys, part.values)
            probed = probe_scores(self.stack, scorer, cache, part.position_ids, document_ids[span], layers)
            scores = torch.cat([probed, torch.zeros(plan.suffix_len)])
            if reread:  # only the scores are read: the suffix need not run after the piece
                return scores_only_leaf(self.stack, plan, index), scores
            return self._replayed_leaf(part, suffix_ids, plan, layers, 1 << 62)[0], scores

        if reread:
            selected = self._select_flat(leaf, plan, schedule, progress, scores_only=True)
            return self._recomputed(selected, prefix_ids, document_ids, suffix_ids, plan, start, whole)
        return self._result(self._flat(leaf, plan, schedule, progress), plan, schedule, start)

    def _question_leaves(self, tier: LeafTier, suffix_ids: torch.Tensor) -> tuple[ChunkPlan, LayerSchedule, FlatLeafFn]:
        """The tier's split and schedule with this suffix, and its leaves scored with it (in one batched
        pass where the leaf layers allow it)."""
        plan, schedule = self._replay_plan(tier, suffix_ids)
        layers = schedule.layers_at(0)
        if batchable(self.stack, layers):
            return plan, schedule, self._scored_leaves(tier, suffix_ids, plan, layers)
        return plan, schedule, self._tier_leaves(tier, suffix_ids, plan, schedule)

    def _scored_leaves(self, tier: LeafTier, suffix_ids: torch.Tensor, plan: ChunkPlan, layers: range) -> FlatLeafFn:
        """``FlatLeafFn`` of scores-only leaves, every leaf scored in one batched pass (``leaf_batch``)."""
        scores = score_leaves(self.stack, self.scoring.scorer, self.bias, tier, suffix_ids, plan, layers)

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            chunk = scores_only_leaf(self.stack, plan, index)
            return chunk, scores[index] if chunk.length > target_len else None

        return leaf

    def _recomputed(
        self,
        selected: Chunk,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        plan: ChunkPlan,
        start: float,
        whole: torch.Tensor | None = None,
        extra: torch.Tensor | None = None,
    ) -> CompressionResult:
        """The plain prefill of ``selected``'s document tokens (with ``whole`` [N], of every unit they
        touch; with ``extra`` [E], and those) between prefix and suffix, reported with the split that
        selected them."""
        kept = selected.origin[selected.origin >= 0].sort().values
        del selected
        if whole is not None:
            kept = whole_units(kept, whole)
        if extra is not None and extra.numel():
            kept = torch.cat([kept, extra.to(kept.device)]).unique()  # sorted, each token once
        result = prefill_kept(self.stack, self.settings, prefix_ids, document_ids, kept, suffix_ids)
        return replace(
            result, plan=plan, peak_kv_bytes=max(self._peak, result.peak_kv_bytes), seconds=time.perf_counter() - start
        )

    def _flat(self, leaf: FlatLeafFn, plan: ChunkPlan, schedule: LayerSchedule, progress: ProgressFn | None) -> Chunk:
        """One selection across all leaves (``_select_flat``), then every layer above the leaves runs
        once over that single node."""
        root = self._select_flat(leaf, plan, schedule, progress)
        upper = range(schedule.layers_at(0).stop, self.stack.num_layers)
        if upper:
            self._run_layers(root, upper, self.settings.final_cache_len, is_root=True)
        return root

    def _select_flat(
        self,
        leaf: FlatLeafFn,
        plan: ChunkPlan,
        schedule: LayerSchedule,
        progress: ProgressFn | None,
        scores_only: bool = False,
    ) -> Chunk:
        """The ``final_cache_len`` best tokens of the whole document, as one node through the leaf layers
        (``scores_only``: its origins and scores only, for a caller that re-reads the tokens).

        Every leaf scores its tokens once, in its own context (the scoring's units but memory,
        standardised per leaf); the best document tokens of the whole document survive (pairwise, in
        document order, affixes averaged as the tree averages them). A fact is judged where it is
        clearest and never again by a merged node's noisier context.
        """
        leaf_layers = schedule.layers_at(0)
        self._alive, self._peak = [], 0
        target = self.settings.final_cache_len
        leaf_target = target if plan.height == 0 else 0  # with several leaves every one is scored

        def select(first: int, height: int) -> Chunk:
            if height == 0:
                chunk, scores = leaf(first, leaf_target)
                if scores is not None:
                    ranked = self.scoring.without(ScoreMemory).rank(scores, chunk, self._words(chunk))
                    chunk.memory = standardise(ranked, chunk.reducible)
                if scores_only:
                    chunk = chunk.scores_only()
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
            self._record_peak(chunk)
            return chunk

        return select(0, plan.height)


def scores_only_leaf(stack: DecoderStack, plan: ChunkPlan, index: int) -> Chunk:
    """Leaf ``index`` of ``plan`` as a selection that only ranks tokens reads it: its prefix, piece and
    suffix origins, positions and reducible flags [P + n + S], no states (``Chunk.scores_only``)."""
    P, E, S = plan.prefix_len, plan.piece_len, plan.suffix_len
    span = plan.piece(index)
    n = span.stop - span.start
    reducible = leaf_reducible(P, n, S)
    return Chunk(
        hidden=stack.empty((1, reducible.numel(), 0)),
        position_ids=leaf_positions(P, n, E, S),
        reducible=reducible,
        origin=torch.cat([torch.full((P,), -1), torch.arange(span.start, span.stop), torch.full((S,), -1)]),
        memory=torch.full((reducible.numel(),), float("-inf")),
        prefix_len=P,
        suffix_len=S,
        cache=cache_from_tensors([], []),
    )
