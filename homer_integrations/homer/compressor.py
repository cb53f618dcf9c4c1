"""Depth-first hierarchical merging: a whole document in, one short per-layer K/V cache out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from homer_integrations.homer.chunk import Chunk
from homer_integrations.homer.chunking import ChunkPlan, LeafInput, make_leaves
from homer_integrations.homer.config import ScoreLayers
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.kv import cache_from_tensors, layer_tensors
from homer_integrations.homer.merging import merge_siblings
from homer_integrations.homer.positions import contiguous_positions
from homer_integrations.homer.pruning import Scorer, keep_mask, pool_words, remember, score_tokens, standardise
from homer_integrations.homer.schedule import LayerSchedule


@dataclass(frozen=True)
class CompressorSettings:
    """Resolved numeric settings of one compression (see ``HomerConfig`` for their meaning)."""

    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int
    scorer: Scorer = "calibrated"
    observation_window: int = 1
    score_pooling: int = 1
    score_memory: bool = False
    score_layers: ScoreLayers = "last"
    contiguous_positions: bool = False
    want_logits: bool = False
    seed: int = 0


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

    ``bias`` is the calibration table [num_layers, max_chunk_len] (None unless the scorer is
    ``calibrated``). ``progress`` is called with the number of document tokens each finished
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
        self._generator = torch.Generator().manual_seed(settings.seed)
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
    ) -> CompressionResult:
        """Compress prefix [P] + document [L] + suffix [S] token ids into one cache of <= final_cache_len.

        ``word_ids`` [L] (document word or sentence index of each token) makes pruning keep or drop
        whole units (see ``HomerConfig.pool_unit``).
        """
        self._word_ids = word_ids
        start = time.perf_counter()
        s = self.settings
        plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), suffix_ids.numel(), s.max_chunk_len)
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
        schedule = LayerSchedule.build(self.stack.num_layers, warmup, plan.height)
        leaves = make_leaves(prefix_ids, document_ids, suffix_ids, plan)
        self._alive, self._peak = [], 0
        root = self._subtree(leaves, plan.height, s.final_cache_len, plan, schedule, progress, is_root=True)
        keys, values = layer_tensors(root.cache)
        logits = self.stack.logits(root.hidden[:, -1:]) if s.want_logits else None
        if s.contiguous_positions and plan.height > 0:
            self._compact(root)
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
        leaves: list[LeafInput],
        height: int,
        target_len: int,
        plan: ChunkPlan,
        schedule: LayerSchedule,
        progress: ProgressFn | None,
        is_root: bool = False,
    ) -> Chunk:
        """Post-order: left subtree, right subtree, merge (children freed), then this level's layers."""
        if height == 0:
            leaf = leaves[0]
            chunk = Chunk(
                hidden=self.stack.embed(leaf.input_ids),
                position_ids=leaf.position_ids,
                reducible=leaf.reducible,
                origin=leaf.origin,
                memory=torch.full((leaf.origin.numel(),), float("-inf")),
                prefix_len=leaf.prefix_len,
                suffix_len=leaf.suffix_len,
            )
            self._run_layers(chunk, schedule.layers_at(0), target_len, is_root)
            if progress is not None:
                progress(int(leaf.reducible.sum()))
            return chunk
        half = len(leaves) // 2
        child_len = plan.child_target_len
        left = self._subtree(leaves[:half], height - 1, child_len, plan, schedule, progress)
        self._alive.append(left)
        right = self._subtree(leaves[half:], height - 1, child_len, plan, schedule, progress)
        self._alive.pop()
        merged = merge_siblings(left, right)
        del left, right
        if self.settings.contiguous_positions:
            self._compact(merged)
        self._run_layers(merged, schedule.layers_at(height), target_len, is_root)
        return merged

    def _run_layers(self, chunk: Chunk, layers: range, target_len: int, is_root: bool) -> None:
        """Run ``layers`` on ``chunk``; in the last one prune to ``target_len`` between attention and MLP."""
        stack = self.stack
        rope = stack.rotary(chunk.hidden, chunk.position_ids)
        last = layers[-1]
        shrinks = chunk.length > target_len
        if shrinks and self.settings.scorer == "calibrated" and self.bias is None:
            raise ValueError("the calibrated scorer needs a calibration bias to prune")
        every_layer = self.settings.score_layers == "all"
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            prune_here = layer_idx == last and shrinks
            score_here = shrinks and (prune_here or every_layer)
            chunk.hidden, query = stack.attention(
                layer_idx, chunk.hidden, rope, chunk.cache, query_rows=self._rows(chunk) if score_here else 0
            )
            self._record_peak(chunk)
            if score_here:
                scores = self._layer_scores(chunk, layer_idx, query)
                if every_layer:
                    evidence.append(standardise(scores.cpu(), chunk.reducible))
            if prune_here:
                if every_layer:
                    scores = torch.stack(evidence).mean(0)
                if self._word_ids is not None:
                    words = torch.where(chunk.origin >= 0, self._word_ids[chunk.origin.clamp(min=0)], -1)
                    scores = pool_words(scores.cpu(), chunk.reducible, words)
                if self.settings.score_memory:
                    scores = remember(scores.cpu(), chunk)
                mask = keep_mask(scores, chunk.reducible, target_len)
                if self.observer is not None:
                    self.observer(PruneEvent(layer_idx, chunk.origin, chunk.reducible, scores, mask))
                chunk.keep(mask)
            if is_root and layer_idx == stack.num_layers - 1:
                # Only the last position's output is ever read (next-token logits): skip the rest.
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden[:, -1:])
            else:
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden)

    def _layer_scores(self, chunk: Chunk, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """This layer's significance [T] of every token of ``chunk`` (before word units and memory)."""
        return score_tokens(
            self.settings.scorer,
            query,
            chunk.cache.layers[layer_idx].keys,
            self.stack.scaling,
            chunk.position_ids,
            chunk.reducible,
            None if self.bias is None else self.bias[layer_idx],
            self.settings.score_pooling,
            self._generator,
        )

    def _compact(self, chunk: Chunk) -> None:
        """Move the chunk to positions 0..T-1 in sequence order, re-rotating every cached key."""
        keys, values = layer_tensors(chunk.cache)
        keys, chunk.position_ids = contiguous_positions(keys, chunk.position_ids, self.stack.backbone.rotary_emb)
        chunk.cache = cache_from_tensors(keys, values)

    def _rows(self, chunk: Chunk) -> int:
        """Query rows that score pruning: the last ``observation_window`` tokens, all inside the suffix."""
        return max(1, min(self.settings.observation_window, chunk.suffix_len))

    def _record_peak(self, current: Chunk) -> None:
        live = current.kv_bytes + sum(c.kv_bytes for c in self._alive)
        self._peak = max(self._peak, live)
