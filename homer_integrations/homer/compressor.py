"""``HomerCompressor``: one object over the passes of a compression, for the callers that want one.

Each pass is its own unit, found by its file: ``nodes`` (layers over one node, scoring, pruning; the
settings and result types), ``leaf_pass`` (the leaf layers, built once into a leaf tier and read back
per question), ``tree`` (the paper's merge tree), ``flat`` (the flat selection) and ``recompute`` (the
re-read of a selection by one plain prefill). This facade builds them on one ``Nodes`` and forwards.
"""

from __future__ import annotations

import torch

from homer_integrations.homer.chunking import ChunkPlan
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.flat import FlatSelection
from homer_integrations.homer.leaf_pass import LeafPass
from homer_integrations.homer.leaf_tier import Allocate, LeafTier
from homer_integrations.homer.nodes import (
    CompressionResult,
    CompressorSettings,
    LeafFn,
    Nodes,
    ProgressFn,
    PruneEvent,
    PruneObserver,
)
from homer_integrations.homer.recompute import reread
from homer_integrations.homer.scoring import Scoring
from homer_integrations.homer.tree import MergeTree

__all__ = [
    "CompressionResult",
    "CompressorSettings",
    "HomerCompressor",
    "LeafFn",
    "ProgressFn",
    "PruneEvent",
    "PruneObserver",
    "TierCompressor",
]


class HomerCompressor:
    """The compressions of one model and settings: from the document's tokens (``compress``, the tree;
    ``compress_flat``), and per question from the document's leaf tier (``build_leaf_tier``, then
    ``replay``, ``replay_flat``, ``replay_recompute``, ``document_scores``), or a re-read (``reread``).

    ``bias`` is the calibration table [num_layers, max_chunk_len] (None unless the scorer needs
    calibration); ``observer``, if given, is called with every node's ``PruneEvent``; ``progress`` (per
    call) with the number of document tokens each finished leaf consumed.
    """

    def __init__(
        self,
        stack: DecoderStack,
        settings: CompressorSettings,
        bias: torch.Tensor | None,
        observer: PruneObserver | None = None,
    ) -> None:
        self.nodes = Nodes(stack, settings, bias, observer)
        self.leaves = LeafPass(self.nodes)
        self.tree = MergeTree(self.nodes, self.leaves)
        self.flat = FlatSelection(self.nodes, self.leaves)

    @property
    def stack(self) -> DecoderStack:
        return self.nodes.stack

    @property
    def settings(self) -> CompressorSettings:
        return self.nodes.settings

    @property
    def bias(self) -> torch.Tensor | None:
        return self.nodes.bias

    @property
    def observer(self) -> PruneObserver | None:
        return self.nodes.observer

    @observer.setter
    def observer(self, observer: PruneObserver | None) -> None:
        self.nodes.observer = observer

    @property
    def scoring(self) -> Scoring:
        return self.nodes.scoring

    def compress(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        word_ids: torch.Tensor | None = None,
        plan: ChunkPlan | None = None,
    ) -> CompressionResult:
        """The merge tree over prefix [P] + document [N] + suffix [S] (``MergeTree.compress``)."""
        return self.tree.compress(prefix_ids, document_ids, suffix_ids, progress, word_ids, plan)

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
        """The flat selection from the document's tokens (``FlatSelection.compress_flat``)."""
        return self.flat.compress_flat(prefix_ids, document_ids, suffix_ids, progress, word_ids, recompute, whole)

    def build_leaf_tier(
        self,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        word_ids: torch.Tensor | None = None,
        key: str = "",
        progress: ProgressFn | None = None,
        allocate: Allocate | None = None,
    ) -> LeafTier:
        """The document's leaf tier (``LeafPass.build``)."""
        return self.leaves.build(prefix_ids, document_ids, word_ids, key, progress, allocate)

    def replay(self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None) -> CompressionResult:
        """The merge tree replayed from ``tier`` with this suffix [S] (``MergeTree.replay``)."""
        return self.tree.replay(tier, suffix_ids, progress)

    def replay_flat(
        self, tier: LeafTier, suffix_ids: torch.Tensor, progress: ProgressFn | None = None
    ) -> CompressionResult:
        """The flat selection from ``tier`` through the upper layers (``FlatSelection.replay_flat``)."""
        return self.flat.replay_flat(tier, suffix_ids, progress)

    def replay_recompute(
        self,
        tier: LeafTier,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        progress: ProgressFn | None = None,
        extra: torch.Tensor | None = None,
    ) -> CompressionResult:
        """The flat selection from ``tier``, re-read (``FlatSelection.replay_recompute``)."""
        return self.flat.replay_recompute(tier, prefix_ids, document_ids, suffix_ids, progress, extra)

    def document_scores(self, tier: LeafTier, suffix_ids: torch.Tensor) -> torch.Tensor:
        """Every document token's selection score [N] (``FlatSelection.document_scores``)."""
        return self.flat.document_scores(tier, suffix_ids)

    def reread(
        self,
        plan: ChunkPlan,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        kept: torch.Tensor,
        suffix_ids: torch.Tensor,
        started: float,
    ) -> CompressionResult:
        """One plain prefill of prefix [P] + ``document_ids[kept]`` + suffix [S] (``recompute.reread``)."""
        return reread(self.nodes, plan, prefix_ids, document_ids, kept, suffix_ids, started)


TierCompressor = HomerCompressor
"""The name the per-question code knew the compressor by (one class now: the facade)."""
