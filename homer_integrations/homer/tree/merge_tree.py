"""``MergeTree``: the paper's merge tree over the leaves, from the document's tokens or from its leaf tier.

Depth-first: left subtree, right subtree, merge (children freed), then the level's layers, each merged
node pruned again by its last token(s); a leaf is computed from its tokens (``compress``) or read back
from the leaf tier with the question's suffix (``replay``, equal to a query-aware ``compress``).
"""

from __future__ import annotations

import time

import torch

from homer_integrations.homer.document.chunking import ChunkPlan, LeafInput, halves, make_leaves
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors
from homer_integrations.homer.layers.nodes import CompressionResult, LayerFn, LeafFn, Nodes, ProgressFn
from homer_integrations.homer.layers.schedule import LayerSchedule
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.scoring.probing import probe_scores
from homer_integrations.homer.tree.merging import merge_siblings


def tree_plan(
    nodes: Nodes,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    plan: ChunkPlan | None = None,
) -> ChunkPlan:
    """``plan``, checked to split these token counts, or the split ``nodes``' settings plan for them."""
    s = nodes.settings
    lengths = (prefix_ids.numel(), document_ids.numel(), suffix_ids.numel())
    plan = plan or nodes.plan(lengths[0], document_ids, lengths[2], s.suffix_reserve)
    if (plan.prefix_len, plan.document_len, plan.suffix_len) != lengths:
        raise ValueError(f"the plan {plan} does not split these token counts")
    return plan


def leaf_chunk(leaf: LeafInput, hidden: torch.Tensor) -> Chunk:
    """A leaf before its layers: its embedded prefix + piece + suffix ``hidden`` [1, T, D], nothing remembered."""
    return Chunk(
        hidden=hidden,
        position_ids=leaf.position_ids,
        reducible=leaf.reducible,
        origin=leaf.origin,
        memory=torch.full((leaf.origin.numel(),), float("-inf")),
        prefix_len=leaf.prefix_len,
        suffix_len=leaf.suffix_len,
    )


class MergeTree:
    """The merge tree on ``nodes``: leaves -> prune -> merge -> ... -> root; ``leaves`` reads a leaf tier."""

    def __init__(self, nodes: Nodes, leaves: LeafPass) -> None:
        self.nodes = nodes
        self.leaves = leaves

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
        plan = tree_plan(self.nodes, prefix_ids, document_ids, suffix_ids, plan)
        schedule = self.nodes.schedule(plan)
        leaves = make_leaves(prefix_ids, document_ids, suffix_ids, plan)
        self.nodes.word_ids = word_ids

        # one leaf (a whole prefill: minutes at 32k) reports its progress layer by layer, so a bar has an ETA
        by_layer = progress if plan.num_leaves == 1 else None
        on_layer = None if by_layer is None else layer_shares(by_layer, document_ids.numel(), schedule.layers_at(0))

        def leaf(index: int, target_len: int, is_root: bool) -> Chunk:
            return self._scratch_leaf(leaves[index], schedule.layers_at(0), target_len, is_root, on_layer)

        root = self.tree(leaf, plan, schedule, None if by_layer else progress)
        return self.nodes.result(root, plan, schedule, start)

    @torch.inference_mode()
    def replay(self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None) -> CompressionResult:
        """The compression ``compress`` would make of the tier's document with this suffix [S] (the same
        split), computed from the tier: only the suffix runs the leaf layers, then pruning and the upper levels.
        """
        start = time.perf_counter()
        plan, schedule = self.leaves.replay_plan(tier, suffix_ids)

        def leaf(index: int, target_len: int, is_root: bool) -> Chunk:
            part = tier.leaf(index)
            chunk, scores = self.leaves.replayed_leaf(part, suffix_ids, plan, schedule.layers_at(0), target_len)
            if scores is not None:
                self.nodes.prune(chunk, schedule.layers_at(0)[-1], scores, target_len)
            return chunk

        root = self.tree(leaf, plan, schedule, progress)
        return self.nodes.result(root, plan, schedule, start)

    def tree(self, leaf: LeafFn, plan: ChunkPlan, schedule: LayerSchedule, progress: ProgressFn | None) -> Chunk:
        self.nodes.begin()
        final = self.nodes.settings.final_cache_len
        return self._subtree(leaf, 0, plan.num_leaves, plan.height, final, plan, schedule, progress, True)

    def _subtree(
        self,
        leaf: LeafFn,
        first: int,
        count: int,
        height: int,
        target_len: int,
        plan: ChunkPlan,
        schedule: LayerSchedule,
        progress: ProgressFn | None,
        is_root: bool = False,
    ) -> Chunk:
        """Post-order over the ``count`` leaves from ``first`` (``halves``): left subtree, right subtree,
        merge (children freed), then this level's layers. A node with one child (a leaf count that is no
        power of two) runs this level's layers on that child alone, pruned as a merged node would be."""
        if height == 0:
            chunk = leaf(first, target_len, is_root)
            if progress is not None:
                span = plan.piece(first)
                progress(span.stop - span.start)
            return chunk
        left_count, right_count = halves(count)
        child_len = plan.child_target_len
        node = self._subtree(leaf, first, left_count, height - 1, child_len, plan, schedule, progress)
        if right_count:
            self.nodes.alive.append(node)
            right_first = first + left_count
            right = self._subtree(leaf, right_first, right_count, height - 1, child_len, plan, schedule, progress)
            self.nodes.alive.pop()
            node = merge_siblings(node, right)
            del right
        self.nodes.run_layers(node, schedule.layers_at(height), target_len, is_root)
        return node

    def _scratch_leaf(
        self, leaf: LeafInput, layers: range, target_len: int, is_root: bool, on_layer: LayerFn | None = None
    ) -> Chunk:
        """A leaf computed from its tokens: prefix + piece + suffix through the leaf layers, pruned
        (``on_layer(layer_idx)`` after each layer of a leaf that is not probed)."""
        chunk = leaf_chunk(leaf, self.nodes.stack.embed(leaf.input_ids))
        if not (self.nodes.scoring.scorer.probes and chunk.length > target_len and not is_root):
            self.nodes.run_layers(chunk, layers, target_len, is_root, on_layer)
            return chunk
        # a probing scorer: run the leaf whole, probe its prefix + piece as the leaf tier does, prune
        self.nodes.run_layers(chunk, layers, chunk.length, is_root=False)
        kept = chunk.length - chunk.suffix_len
        keys, values = layer_tensors(chunk.cache)
        probe_cache = cache_from_tensors([k[:, :, :kept] for k in keys], [v[:, :, :kept] for v in values])
        piece_ids = leaf.input_ids[chunk.document]
        scores = probe_scores(
            self.nodes.stack, self.nodes.scoring.scorer, probe_cache, chunk.position_ids[:kept], piece_ids, layers
        )
        self.nodes.prune(chunk, layers[-1], torch.cat([scores, torch.zeros(chunk.suffix_len)]), target_len)
        return chunk


def layer_shares(progress: ProgressFn, tokens: int, layers: range) -> LayerFn:
    """``on_layer`` for a leaf of ``tokens`` document tokens run through ``layers``: after each layer it reports
    that layer's share of the tokens to ``progress`` (the shares add up to ``tokens``)."""
    first, count = layers.start, len(layers)

    def on_layer(layer_idx: int) -> None:
        done = layer_idx - first
        progress(tokens * (done + 1) // count - tokens * done // count)

    return on_layer
