"""``LeafPass``: the leaves' own layers, run once per document into its leaf tier and read back per question.

The leaf layers over the document are the same whatever the question (see ``leaf_tier``), so they run
once (``build``); a question then runs only its suffix rows through the leaf layers against the stored
K/V (``replayed_leaf``, or every leaf in one batch: ``scored_leaves``), and the tree (``tree``) or the
flat selection (``flat``) prunes and merges what that gives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors
from homer_integrations.homer.layers.nodes import Nodes, ProgressFn
from homer_integrations.homer.layers.schedule import LayerSchedule
from homer_integrations.homer.leaves.leaf_batch import batchable, leaf_positions, leaf_reducible, score_leaves
from homer_integrations.homer.leaves.leaf_reuse import LeafReuse
from homer_integrations.homer.leaves.leaf_stash import LeafStash, StashedBuild
from homer_integrations.homer.leaves.leaf_tier import LeafSlice, LeafTier
from homer_integrations.homer.leaves.tier_file import Allocate, Layout, layout, named
from homer_integrations.homer.model.decoder import DecoderStack

FlatLeafFn = Callable[[int, int], "tuple[Chunk, torch.Tensor | None]"]
"""(leaf index, target length) -> that leaf through the leaf layers, unpruned, and its scores [T] (None
when it fits the target)."""


class LeafPass:
    """Builds a document's leaf tier and reads its leaves back with a question's suffix, on ``nodes``."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    @torch.inference_mode()
    def build(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        word_ids: torch.Tensor | None = None,
        key: str = "",
        progress: ProgressFn | None = None,
        allocate: Allocate | None = None,
        reuse: LeafReuse | None = None,
        stash: LeafStash | None = None,
    ) -> LeafTier:
        """Run every leaf's prefix [P] + piece through the leaf layers once, without a suffix, and keep
        what a question needs (see ``LeafTier``). The split is planned for ``suffix_reserve`` suffix tokens.
        ``allocate``: where the tier's tensors live (default: process memory on the model's device); each
        leaf is written into them as it finishes, so nothing else holds the whole tier. ``reuse``: a leaf
        it finds in a held tier is copied from there instead of computed (``leaf_reuse``). ``stash`` (with
        ``reuse``, whose content keys it uses): each leaf is looked up there and kept there as it finishes,
        instead of laid out in ``allocate``'s storage, and the tier holds the kept pieces (``leaf_keys`` set).
        """
        start = time.perf_counter()
        stack, s = self.nodes.stack, self.nodes.settings
        plan = self.nodes.plan(prefix_ids.numel(), document_ids, 0, s.suffix_reserve)
        layers = self.nodes.schedule(plan).layers_at(0)
        prefix = self.prefix_part(prefix_ids, layers)
        if stash is not None and reuse is not None:
            tier = StashedBuild(self.leaf_part, reuse, stash).build(
                prefix, prefix_ids, document_ids, plan, layers, progress
            )
            word_ids = None if word_ids is None else word_ids.cpu()
            return replace(tier, key=key, word_ids=word_ids, seconds=time.perf_counter() - start)
        shapes = layout(
            plan,
            len(layers),
            stack.num_kv_heads,
            stack.head_dim,
            prefix.hidden.shape[2],
            stack.dtype,
            word_ids is not None,
        )
        storage = (allocate(shapes) if allocate is not None else None) or self.in_memory(shapes)
        tier = named(storage, key, plan, len(layers))
        for mine, theirs in zip(tier.prefix_keys + tier.prefix_values, prefix.keys + prefix.values, strict=True):
            mine.copy_(theirs)
        tier.prefix_hidden.copy_(prefix.hidden)
        if word_ids is not None:
            storage["word_ids"].copy_(word_ids)
        P = plan.prefix_len
        if reuse is not None:
            reuse.prepare(prefix_ids, document_ids, plan, len(layers))
        for index in range(plan.num_leaves):
            span = plan.piece(index)
            piece = tier.pieces[index]
            held = None if reuse is None else reuse.take(index, span.stop - span.start, len(layers))
            if held is not None:  # the same leaf in another tier: its piece, copied
                piece.write(held.hidden, held.keys, held.values, slice(None))
            else:
                part = self.leaf_part(prefix, document_ids[span], span.start, layers)
                piece.write(part.hidden[:, P:], part.keys, part.values, slice(P, None))
                del part
            if progress is not None:
                progress(span.stop - span.start)
        return replace(tier, seconds=time.perf_counter() - start)

    def in_memory(self, layout: Layout) -> dict[str, torch.Tensor]:
        """``Allocate`` in process memory: floats on the model's device, word ids on the CPU (where
        a stored tier's are too)."""
        device = self.nodes.stack.device
        return {
            name: torch.empty(shape, dtype=dtype, device=device if dtype.is_floating_point else "cpu")
            for name, (shape, dtype) in layout.items()
        }

    def prefix_part(self, prefix_ids: torch.Tensor, layers: range) -> LeafSlice:
        """The prefix [P] through ``layers``, identical in every leaf (same tokens and positions)."""
        stack, P = self.nodes.stack, prefix_ids.numel()
        kv_shape = (1, stack.num_kv_heads, 0, stack.head_dim)
        cache = cache_from_tensors(*[[stack.empty(kv_shape) for _ in layers] for _ in "kv"])
        hidden = self.nodes.extend(stack.embed(prefix_ids), torch.arange(P), cache, layers)[0]
        keys, values = layer_tensors(cache)
        return LeafSlice(keys, values, hidden, torch.full((P,), -1), torch.arange(P))

    def leaf_part(self, prefix: LeafSlice, piece_ids: torch.Tensor, offset: int, layers: range) -> LeafSlice:
        """One leaf's prefix + piece of n tokens (document indices from ``offset``) through ``layers``."""
        P, n = prefix.hidden.shape[1], piece_ids.numel()
        cache = cache_from_tensors(prefix.keys, prefix.values)
        hidden = self.nodes.extend(self.nodes.stack.embed(piece_ids), torch.arange(P, P + n), cache, layers)[0]
        keys, values = layer_tensors(cache)
        return LeafSlice(
            keys=keys,
            values=values,
            hidden=torch.cat([prefix.hidden, hidden], dim=1),
            origin=torch.cat([prefix.origin, torch.arange(offset, offset + n)]),
            position_ids=torch.arange(P + n),
        )

    def replay_plan(self, tier: LeafTier, suffix_ids: torch.Tensor) -> tuple[ChunkPlan, LayerSchedule]:
        """The tier's split with this suffix, and its schedule (which must run the tier's leaf layers)."""
        if self.nodes.scoring.scorer.probes:
            raise ValueError("a leaf tier replays question-aware scoring: use Scoring.with_question()")
        plan = tier.plan.with_suffix(suffix_ids.numel())
        schedule = self.nodes.schedule(plan)
        if len(schedule.layers_at(0)) != tier.leaf_layers:
            raise ValueError(
                f"the leaf tier ran {tier.leaf_layers} leaf layers, these settings run {len(schedule.layers_at(0))}"
            )
        self.nodes.word_ids = tier.word_ids
        return plan, schedule

    def tier_leaves(
        self, tier: LeafTier, suffix_ids: torch.Tensor, plan: ChunkPlan, schedule: LayerSchedule
    ) -> FlatLeafFn:
        """``FlatLeafFn`` over the tier's stored leaves, each extended by ``suffix_ids``."""

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            return self.replayed_leaf(tier.leaf(index), suffix_ids, plan, schedule.layers_at(0), target_len)

        return leaf

    def replayed_leaf(
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
        chunk = Chunk(
            hidden=part.hidden,
            position_ids=torch.cat([part.position_ids, suffix_positions]),
            reducible=leaf_reducible(P, n, S),
            origin=torch.cat([part.origin, torch.full((S,), -1)]),
            memory=torch.full((P + n + S,), float("-inf")),
            prefix_len=P,
            suffix_len=S,
            cache=cache_from_tensors(part.keys, part.values),
        )
        scored = chunk if chunk.length > target_len else None
        suffix_hidden, scores = self.nodes.extend(
            self.nodes.stack.embed(suffix_ids), suffix_positions, chunk.cache, layers, scored
        )
        chunk.hidden = torch.cat([part.hidden, suffix_hidden], dim=1)
        return chunk, scores

    def question_leaves(self, tier: LeafTier, suffix_ids: torch.Tensor) -> tuple[ChunkPlan, LayerSchedule, FlatLeafFn]:
        """The tier's split and schedule with this suffix, and its leaves scored with it (in one batched
        pass where the leaf layers allow it)."""
        plan, schedule = self.replay_plan(tier, suffix_ids)
        layers = schedule.layers_at(0)
        if batchable(self.nodes.stack, layers):
            return plan, schedule, self.scored_leaves(tier, suffix_ids, plan, layers)
        return plan, schedule, self.tier_leaves(tier, suffix_ids, plan, schedule)

    def scored_leaves(self, tier: LeafTier, suffix_ids: torch.Tensor, plan: ChunkPlan, layers: range) -> FlatLeafFn:
        """``FlatLeafFn`` of scores-only leaves, every leaf scored in one batched pass (``leaf_batch``)."""
        scores = score_leaves(
            self.nodes.stack, self.nodes.scoring.scorer, self.nodes.bias, tier, suffix_ids, plan, layers
        )

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            chunk = scores_only_leaf(self.nodes.stack, plan, index)
            return chunk, scores[index] if chunk.length > target_len else None

        return leaf


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
