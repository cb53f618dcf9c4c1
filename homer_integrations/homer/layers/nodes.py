"""What every pass of a compression shares: its resolved settings, its result, and ``Nodes``, which runs
decoder layers over one node (a ``Chunk``), scores it and prunes it.

The passes (``leaf_pass``, ``tree``, ``flat``, ``recompute``) each take one ``Nodes``; it also keeps the
state of the compression under way: the document's unit ids, the nodes alive and the peak of their K/V.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.content_split import content_plan
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import layer_tensors
from homer_integrations.homer.layers.schedule import LayerSchedule, fit_schedule
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.pruning import keep_mask
from homer_integrations.homer.scoring.scorers import ScoreInput


@dataclass(frozen=True)
class CompressorSettings:
    """Resolved settings of one compression (see ``HomerConfig`` for their meaning).

    ``scoring`` is what pruning ranks by (default: the paper's calibrated last-token score);
    ``suffix_reserve`` the suffix tokens a leaf tier's split is planned for; ``split`` how a document is
    cut into leaves (``HomerConfig.split``), ``statements`` [N] the document's statement index per token
    that a ``content`` split cuts at (None: it cuts at token windows, ``content_split``).
    """

    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int
    scoring: Scoring = field(default_factory=Scoring)
    suffix_reserve: int = 0
    want_logits: bool = False
    split: Literal["even", "content"] = "even"
    statements: torch.Tensor | None = field(default=None, compare=False, repr=False)


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
        head_lengths: [L, Hkv] tokens each K/V head keeps in a head-wise root (``tree.headwise``), whose
            ``keys``/``values`` are then per layer [n_l, d], heads in order; None: one dense set.
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
    head_lengths: torch.Tensor | None = None

    @property
    def last_position(self) -> int:
        """Largest position id in the cache; what follows it starts at ``last_position + 1``."""
        return int(self.position_ids.max())


ProgressFn = Callable[[int], None]
LayerFn = Callable[[int], None]
"""Called with each layer's index once a chunk has run it."""
LeafFn = Callable[[int, int, bool], Chunk]
"""(leaf index, target length, is the root) -> that leaf, run through the leaf layers and pruned."""


@dataclass(frozen=True)
class PruneEvent:
    """One node's pruning, for diagnostics (``Nodes.observer``).

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


class Nodes:
    """Runs layers over the nodes of one compression for one model: ``run_layers`` (a node, pruned in its
    last layer), ``extend`` (new rows after a node's cache), ``prune``.

    ``bias`` is the calibration table [num_layers, max_chunk_len] (None unless the scorer needs
    calibration); ``observer``, if given, is called with every node's ``PruneEvent``. ``word_ids`` [N]:
    the document unit of each token, which the scoring's units pool over (None: single tokens).
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
        self.word_ids: torch.Tensor | None = None
        self.alive: list[Chunk] = []
        self.peak = 0

    def schedule(self, plan: ChunkPlan) -> LayerSchedule:
        """The layer schedule for ``plan``'s tree (``fit_schedule``)."""
        return fit_schedule(self.stack.num_layers, self.settings.warmup_layers, plan.height)

    def plan(self, prefix_len: int, document_ids: torch.Tensor, suffix_len: int, reserve: int = 0) -> ChunkPlan:
        """The settings' split of the document's token ids [L] between affixes of these lengths, planned for
        a suffix of at least ``reserve`` tokens (``ChunkPlan.build``, or ``content_split.content_plan``)."""
        s = self.settings
        if s.split == "content":
            return content_plan(prefix_len, document_ids, suffix_len, s.max_chunk_len, reserve, s.statements)
        return ChunkPlan.build(prefix_len, document_ids.numel(), suffix_len, s.max_chunk_len, reserve)

    def begin(self) -> None:
        """A new tree or selection: no node alive yet, no peak."""
        self.alive, self.peak = [], 0

    def result(self, root: Chunk, plan: ChunkPlan, schedule: LayerSchedule, start: float) -> CompressionResult:
        """``root`` as the compression's result (its next-token logits when the settings want them)."""
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
            peak_kv_bytes=self.peak,
            seconds=time.perf_counter() - start,
        )

    def extend(
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
        rope = self.stack.rotary(hidden, positions)
        scorer = self.scoring.scorer
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            score_here = scored is not None and scorer.scores_at(layer_idx, layers)
            query_rows = self.rows(scored) if score_here else 0
            hidden, query = self.stack.attention(layer_idx, hidden, rope, cache, query_rows=query_rows)
            if score_here:
                self.record_peak(scored)
                evidence.append(self.layer_scores(scored, layer_idx, query))
            hidden = self.stack.mlp(layer_idx, hidden)
        return hidden, scorer.combine(evidence, scored.reducible) if evidence else None

    def run_layers(
        self, chunk: Chunk, layers: range, target_len: int, is_root: bool, on_layer: LayerFn | None = None
    ) -> None:
        """Run ``layers`` on ``chunk``; in the last one prune to ``target_len`` between attention and MLP.
        ``on_layer(layer_idx)`` is called after each layer (progress)."""
        stack = self.stack
        rope = stack.rotary(chunk.hidden, chunk.position_ids)
        last = layers[-1]
        shrinks = chunk.length > target_len
        scorer = self.scoring.scorer
        evidence: list[torch.Tensor] = []
        for layer_idx in layers:
            score_here = shrinks and scorer.scores_at(layer_idx, layers)
            chunk.hidden, query = stack.attention(
                layer_idx, chunk.hidden, rope, chunk.cache, query_rows=self.rows(chunk) if score_here else 0
            )
            self.record_peak(chunk)
            if score_here:
                evidence.append(self.layer_scores(chunk, layer_idx, query))
            if shrinks and layer_idx == last:
                self.prune(chunk, layer_idx, scorer.combine(evidence, chunk.reducible), target_len)
            if is_root and layer_idx == stack.num_layers - 1:
                # Only the last position's output is ever read (next-token logits): skip the rest.
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden[:, -1:])
            else:
                chunk.hidden = stack.mlp(layer_idx, chunk.hidden)
            if on_layer is not None:
                on_layer(layer_idx)

    def words(self, chunk: Chunk) -> torch.Tensor | None:
        """Document unit index [T] of each token of ``chunk`` (-1 on prefix/suffix), None without unit ids."""
        if self.word_ids is None:
            return None
        return torch.where(chunk.origin >= 0, self.word_ids[chunk.origin.clamp(min=0)], -1)

    def prune(self, chunk: Chunk, layer_idx: int, scores: torch.Tensor, target_len: int) -> None:
        """The scoring's units over ``scores`` [T], then keep the best ``target_len`` tokens."""
        scores = self.scoring.rank(scores, chunk, self.words(chunk))
        mask = keep_mask(scores, chunk.reducible, target_len)
        self.keep(chunk, layer_idx, scores, mask)

    def keep(self, chunk: Chunk, layer_idx: int, scores: torch.Tensor, mask: torch.Tensor) -> None:
        """Keep ``mask`` [T] of ``chunk`` (``scores`` [T] ranked it in ``layer_idx``), told to the observer."""
        if self.observer is not None:
            self.observer(PruneEvent(layer_idx, chunk.origin, chunk.reducible, scores, mask))
        chunk.keep(mask)

    def layer_scores(self, chunk: Chunk, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """The scorer's rating [T] of every token of ``chunk`` in this layer."""
        bias = None if self.bias is None else self.bias[layer_idx]
        keys = chunk.cache.layers[layer_idx].keys
        x = ScoreInput(query, keys, chunk.position_ids, chunk.reducible, layer_idx, self.stack.scaling, bias)
        return self.scoring.scorer(x)

    def rows(self, chunk: Chunk) -> int:
        """Query rows that score pruning: the scorer's last rows, all inside the suffix."""
        return max(1, min(self.scoring.scorer.rows, chunk.suffix_len))

    def record_peak(self, current: Chunk) -> None:
        """Count ``current`` with the nodes alive toward the peak of K/V bytes."""
        live = current.kv_bytes + sum(c.kv_bytes for c in self.alive)
        self.peak = max(self.peak, live)
