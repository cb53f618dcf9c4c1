"""``FlatSelection``: HOMER's question-aware selection made flat, run on the upper layers or re-read.

Instead of the paper's tree (each merged node prunes again, judging a fact in a noisier, merged
context), every leaf scores its tokens once, with the question in its own suffix, and the
``final_cache_len`` best document tokens of the whole document survive (``select``). The kept
tokens are then either run through the upper layers as one node (``replay_flat``, ``compress_flat``)
or re-read by one plain prefill of prefix + kept tokens + suffix through every layer
(``replay_recompute``, ``compress_flat(recompute=True)``, see ``recompute``): HOMER picks what to keep,
an ordinary prompt reads it.
"""

from __future__ import annotations

import time

import torch

from homer_integrations.homer.document.chunking import ChunkPlan, halves
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.layers.nodes import CompressionResult, Nodes, ProgressFn
from homer_integrations.homer.layers.schedule import LayerSchedule
from homer_integrations.homer.leaves.leaf_pass import FlatLeafFn, LeafPass, scores_only_leaf
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.scoring.probing import probe_scores
from homer_integrations.homer.scoring.pruning import keep_mask, standardise
from homer_integrations.homer.scoring.units import ScoreMemory
from homer_integrations.homer.tree.merging import merge_siblings
from homer_integrations.homer.tree.recompute import reread_selected


class FlatSelection:
    """The flat selection across all leaves on ``nodes``, its leaves read from a tier by ``leaves`` or
    computed from the document's tokens."""

    def __init__(self, nodes: Nodes, leaves: LeafPass) -> None:
        self.nodes = nodes
        self.leaves = leaves

    @torch.inference_mode()
    def replay_flat(
        self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None
    ) -> CompressionResult:
        """Question-aware selection across all leaves at once (see ``flat``), from the tier."""
        start = time.perf_counter()
        plan, schedule = self.leaves.replay_plan(tier, suffix_ids)
        leaf = self.leaves.tier_leaves(tier, suffix_ids, plan, schedule)
        return self.nodes.result(self.flat(leaf, plan, schedule, progress), plan, schedule, start)

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
        plan, schedule, leaves = self.leaves.question_leaves(tier, suffix_ids)
        selected = self.select(leaves, plan, schedule, progress, scores_only=True)
        return reread_selected(self.nodes, selected, prefix_ids, document_ids, suffix_ids, plan, start, extra=extra)

    @torch.inference_mode()
    def document_scores(self, tier: LeafTier, suffix_ids: torch.Tensor) -> torch.Tensor:
        """Every document token's selection score [N] with this suffix [S]: each leaf scored from the tier
        (the question in its suffix), the scoring's units but memory applied, standardised per leaf:
        the scores ``replay_recompute``'s flat selection ranks, for a selection of its own."""
        plan, _, leaf = self.leaves.question_leaves(tier, suffix_ids)
        scoring = self.nodes.scoring.without(ScoreMemory)
        scores = torch.empty(tier.document_tokens)
        for index in range(plan.num_leaves):
            chunk, raw = leaf(index, 0)  # a target of 0: every leaf is scored
            assert raw is not None
            doc = chunk.origin >= 0
            ranked = standardise(scoring.rank(raw, chunk, self.nodes.words(chunk)), chunk.reducible)
            scores[chunk.origin[doc]] = ranked[doc.to(ranked.device)].float().cpu()
        return scores

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
        """``flat`` from the document's tokens: each leaf runs prefix [P] + piece, is scored (by its
        scorer's probe rows, or by the suffix [S] run after it), pruned and dropped before the next;
        no tier is held, so peak memory stays that of one leaf plus the kept tokens. ``recompute``: the
        selection is re-read by one plain prefill of the kept tokens (``recompute.prefill_kept``) instead
        of running the upper layers over it, and with ``whole`` [N] (each document token's unit) it re-reads
        every unit the selection touched whole (``recompute.whole_units``)."""
        if whole is not None and not recompute:
            raise ValueError("compress_flat(whole=...) needs recompute=True: only the re-read keeps units whole")
        start = time.perf_counter()
        plan = self.nodes.plan(prefix_ids.numel(), document_ids, suffix_ids.numel())
        schedule = self.nodes.schedule(plan)
        layers = schedule.layers_at(0)
        scorer = self.nodes.scoring.scorer
        reread = recompute and plan.height > 0
        # a re-read keeps nothing the leaves compute after the probe's layer: they stop there
        run = range(layers.start, scorer.probe_last(layers) + 1) if reread and scorer.probes else layers
        prefix = self.leaves.prefix_part(prefix_ids, run)
        self.nodes.word_ids = word_ids

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            span = plan.piece(index)
            part = self.leaves.leaf_part(prefix, document_ids[span], span.start, run)
            if not (scorer.probes and part.hidden.shape[1] + plan.suffix_len > target_len):
                return self.leaves.replayed_leaf(part, suffix_ids, plan, layers, target_len)
            cache = cache_from_tensors(part.keys, part.values)
            probed = probe_scores(self.nodes.stack, scorer, cache, part.position_ids, document_ids[span], layers)
            scores = torch.cat([probed, torch.zeros(plan.suffix_len)])
            if reread:  # only the scores are read: the suffix need not run after the piece
                return scores_only_leaf(self.nodes.stack, plan, index), scores
            return self.leaves.replayed_leaf(part, suffix_ids, plan, layers, 1 << 62)[0], scores

        if reread:
            selected = self.select(leaf, plan, schedule, progress, scores_only=True)
            return reread_selected(self.nodes, selected, prefix_ids, document_ids, suffix_ids, plan, start, whole)
        return self.nodes.result(self.flat(leaf, plan, schedule, progress), plan, schedule, start)

    def flat(self, leaf: FlatLeafFn, plan: ChunkPlan, schedule: LayerSchedule, progress: ProgressFn | None) -> Chunk:
        """One selection across all leaves (``select``), then every layer above the leaves runs
        once over that single node."""
        root = self.select(leaf, plan, schedule, progress)
        upper = range(schedule.layers_at(0).stop, self.nodes.stack.num_layers)
        if upper:
            self.nodes.run_layers(root, upper, self.nodes.settings.final_cache_len, is_root=True)
        return root

    def select(
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
        self.nodes.begin()
        target = self.nodes.settings.final_cache_len
        leaf_target = target if plan.height == 0 else 0  # with several leaves every one is scored

        def walk(first: int, count: int, height: int) -> Chunk:
            if height == 0:
                chunk, scores = leaf(first, leaf_target)
                if scores is not None:
                    ranked = self.nodes.scoring.without(ScoreMemory).rank(scores, chunk, self.nodes.words(chunk))
                    chunk.memory = standardise(ranked, chunk.reducible)
                if scores_only:
                    chunk = chunk.scores_only()
                if progress is not None:
                    progress(int(chunk.reducible.sum()))
            else:
                left_count, right_count = halves(count)
                chunk = walk(first, left_count, height - 1)
                if right_count:  # else a single child (a leaf count that is no power of two) goes up alone
                    self.nodes.alive.append(chunk)
                    right = walk(first + left_count, right_count, height - 1)
                    self.nodes.alive.pop()
                    chunk = merge_siblings(chunk, right)
            if chunk.length > target:
                mask = keep_mask(chunk.memory, chunk.reducible, target)
                self.nodes.keep(chunk, leaf_layers[-1], chunk.memory, mask)
            self.nodes.record_peak(chunk)
            return chunk

        return walk(0, plan.num_leaves, plan.height)
