"""``TierCompressor``: a compressor that also builds a document's leaf tier and replays questions from it.

The leaf layers over the document are the same whatever the question (see ``leaf_tier``), so they run
once (``build_leaf_tier``); a question then runs only its suffix rows through the leaf layers against
the stored K/V and redoes pruning and the upper levels: the paper's tree (``replay``, equal to a
query-aware ``compress`` from scratch), one flat selection across all leaves (``replay_flat``), or that
selection re-read by one plain prefill of the kept tokens (``replay_recompute``, see ``recompute``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from homer_integrations.homer.chunk import Chunk
from homer_integrations.homer.chunking import ChunkPlan
from homer_integrations.homer.compressor import CompressionResult, HomerCompressor, ProgressFn, PruneEvent
from homer_integrations.homer.kv import cache_from_tensors, layer_tensors
from homer_integrations.homer.leaf_tier import Allocate, Layout, LeafSlice, LeafTier
from homer_integrations.homer.merging import merge_siblings
from homer_integrations.homer.pruning import keep_mask, standardise
from homer_integrations.homer.recompute import prefill_kept
from homer_integrations.homer.schedule import LayerSchedule
from homer_integrations.homer.score_units import ScoreMemory

FlatLeafFn = Callable[[int, int], "tuple[Chunk, torch.Tensor | None]"]
"""(leaf index, target length) -> that leaf through the leaf layers, unpruned, and its scores [T] (None
when it fits the target)."""


class TierCompressor(HomerCompressor):
    """``HomerCompressor`` plus the leaf tier: build it once per document, replay every question from it."""

    @torch.inference_mode()
    def build_leaf_tier(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        word_ids: torch.Tensor | None = None,
        key: str = "",
        progress: ProgressFn | None = None,
        allocate: Allocate | None = None,
    ) -> LeafTier:
        """Run every leaf's prefix [P] + piece through the leaf layers once, without a suffix, and keep
        what a question needs (see ``LeafTier``). The split is planned for ``suffix_reserve`` suffix tokens.
        ``allocate``: where the tier's tensors live (default: process memory on the model's device); each
        leaf is written into them as it finishes, so nothing else holds the whole tier.
        """
        start = time.perf_counter()
        stack, s = self.stack, self.settings
        plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), 0, s.max_chunk_len, s.suffix_reserve)
        layers = self._schedule(plan).layers_at(0)
        prefix = self._prefix_part(prefix_ids, layers)
        layout = LeafTier.layout(
            plan,
            len(layers),
            stack.num_kv_heads,
            stack.head_dim,
            prefix.hidden.shape[2],
            stack.dtype,
            word_ids is not None,
        )
        storage = (allocate(layout) if allocate is not None else None) or self._in_memory(layout)
        tier = LeafTier.named(storage, key, plan, len(layers))
        for mine, theirs in zip(tier.prefix_keys + tier.prefix_values, prefix.keys + prefix.values, strict=True):
            mine.copy_(theirs)
        tier.prefix_hidden.copy_(prefix.hidden)
        if word_ids is not None:
            storage["word_ids"].copy_(word_ids)
        P = plan.prefix_len
        for index in range(plan.num_leaves):
            span = plan.piece(index)
            part = self._leaf_part(prefix, document_ids[span], span.start, layers)
            tier.hidden[:, span] = part.hidden[:, P:]
            for k, v, pk, pv in zip(tier.keys, tier.values, part.keys, part.values, strict=True):
                k[:, :, span] = pk[:, :, P:]
                v[:, :, span] = pv[:, :, P:]
            del part
            if progress is not None:
                progress(span.stop - span.start)
        return replace(tier, seconds=time.perf_counter() - start)

    def _in_memory(self, layout: Layout) -> dict[str, torch.Tensor]:
        """``Allocate`` in process memory: floats on the model's device, word ids on the CPU (where
        a stored tier's are too)."""
        device = self.stack.device
        return {
            name: torch.empty(shape, dtype=dtype, device=device if dtype.is_floating_point else "cpu")
            for name, (shape, dtype) in layout.items()
        }

    @torch.inference_mode()
    def replay(self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None) -> CompressionResult:
        """The compression ``compress`` would make of the tier's document with this suffix [S] (the same
        split), computed from the tier: only the suffix runs the leaf layers, then pruning and the upper levels.
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
    ) -> CompressionResult:
        """``replay_flat``'s selection, then one plain prefill of prefix [P] + the kept document tokens (in
        document order) + suffix [S] through every layer (``recompute.prefill_kept``); ``prefix_ids`` and
        ``document_ids`` [N] are the tier's (it keeps no token ids). A tier of one leaf is already exact:
        its replay is ``replay_flat``'s."""
        if document_ids.numel() != tier.document_tokens:
            raise ValueError(f"the leaf tier holds {tier.document_tokens} document tokens, not {document_ids.numel()}")
        if tier.plan.height == 0:
            return self.replay_flat(tier, suffix_ids, progress)
        start = time.perf_counter()
        plan, schedule = self._replay_plan(tier, suffix_ids)
        selected = self._select_flat(self._tier_leaves(tier, suffix_ids, plan, schedule), plan, schedule, progress)
        return self._recomputed(selected, prefix_ids, document_ids, suffix_ids, plan, start)

    @torch.inference_mode()
    def compress_flat(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        word_ids: torch.Tensor | None = None,
        recompute: bool = False,
    ) -> CompressionResult:
        """``_flat`` from the document's tokens: each leaf runs prefix [P] + piece, is scored (by its
        scorer's probe rows, or by the suffix [S] run after it), pruned and dropped before the next;
        no tier is held, so peak memory stays that of one leaf plus the kept tokens. ``recompute``: the
        selection is re-read by one plain prefill of the kept tokens (``recompute.prefill_kept``) instead
        of running the upper layers over it."""
        start = time.perf_counter()
        s = self.settings
        plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), suffix_ids.numel(), s.max_chunk_len)
        schedule = self._schedule(plan)
        layers = schedule.layers_at(0)
        prefix = self._prefix_part(prefix_ids, layers)
        self._word_ids = word_ids

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            span = plan.piece(index)
            part = self._leaf_part(prefix, document_ids[span], span.start, layers)
            probed = None
            if self.scoring.scorer.probes and part.hidden.shape[1] + plan.suffix_len > target_len:
                cache = cache_from_tensors(part.keys, part.values)
                probed = self._probe(cache, part.position_ids, document_ids[span], layers)
                target_len = 1 << 62  # the suffix's own scores are not needed
            chunk, scores = self._replayed_leaf(part, suffix_ids, plan, layers, target_len)
            if probed is not None:
                scores = torch.cat([probed, torch.zeros(plan.suffix_len)])
            return chunk, scores

        if recompute and plan.height > 0:
            selected = self._select_flat(leaf, plan, schedule, progress)
            return self._recomputed(selected, prefix_ids, document_ids, suffix_ids, plan, start)
        return self._result(self._flat(leaf, plan, schedule, progress), plan, schedule, start)

    def _recomputed(
        self,
        selected: Chunk,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        plan: ChunkPlan,
        start: float,
    ) -> CompressionResult:
        """The plain prefill of ``selected``'s document tokens between prefix and suffix, reported with
        the split that selected them."""
        kept = selected.origin[selected.origin >= 0].sort().values
        del selected
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
        self, leaf: FlatLeafFn, plan: ChunkPlan, schedule: LayerSchedule, progress: ProgressFn | None
    ) -> Chunk:
        """The ``final_cache_len`` best tokens of the whole document, as one node through the leaf layers.

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

    def _prefix_part(self, prefix_ids: torch.Tensor, layers: range) -> LeafSlice:
        """The prefix [P] through ``layers``, identical in every leaf (same tokens and positions)."""
        stack, P = self.stack, prefix_ids.numel()
        kv_shape = (1, stack.num_kv_heads, 0, stack.head_dim)
        cache = cache_from_tensors(*[[stack.empty(kv_shape) for _ in layers] for _ in "kv"])
        hidden = self._extend(stack.embed(prefix_ids), torch.arange(P), cache, layers)[0]
        keys, values = layer_tensors(cache)
        return LeafSlice(keys, values, hidden, torch.full((P,), -1), torch.arange(P))

    def _leaf_part(self, prefix: LeafSlice, piece_ids: torch.Tensor, offset: int, layers: range) -> LeafSlice:
        """One leaf's prefix + piece of n tokens (document indices from ``offset``) through ``layers``."""
        P, n = prefix.hidden.shape[1], piece_ids.numel()
        cache = cache_from_tensors(prefix.keys, prefix.values)
        hidden = self._extend(self.stack.embed(piece_ids), torch.arange(P, P + n), cache, layers)[0]
        keys, values = layer_tensors(cache)
        return LeafSlice(
            keys=keys,
            values=values,
            hidden=torch.cat([prefix.hidden, hidden], dim=1),
            origin=torch.cat([prefix.origin, torch.arange(offset, offset + n)]),
            position_ids=torch.arange(P + n),
        )

    def _replay_plan(self, tier: LeafTier, suffix_ids: torch.Tensor) -> tuple[ChunkPlan, LayerSchedule]:
        """The tier's split with this suffix, and its schedule (which must run the tier's leaf layers)."""
        if self.scoring.scorer.probes:
            raise ValueError("a leaf tier replays question-aware scoring: use Scoring.with_question()")
        plan = tier.plan.with_suffix(suffix_ids.numel())
        schedule = self._schedule(plan)
        if len(schedule.layers_at(0)) != tier.leaf_layers:
            raise ValueError(
                f"the leaf tier ran {tier.leaf_layers} leaf layers, these settings run {len(schedule.layers_at(0))}"
            )
        self._word_ids = tier.word_ids
        return plan, schedule

    def _tier_leaves(
        self, tier: LeafTier, suffix_ids: torch.Tensor, plan: ChunkPlan, schedule: LayerSchedule
    ) -> FlatLeafFn:
        """``FlatLeafFn`` over the tier's stored leaves, each extended by ``suffix_ids``."""

        def leaf(index: int, target_len: int) -> tuple[Chunk, torch.Tensor | None]:
            return self._replayed_leaf(tier.leaf(index), suffix_ids, plan, schedule.layers_at(0), target_len)

        return leaf

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
        suffix_hidden, scores = self._extend(
            self.stack.embed(suffix_ids), suffix_positions, chunk.cache, layers, scored
        )
        chunk.hidden = torch.cat([part.hidden, suffix_hidden], dim=1)
        return chunk, scores
