"""``HomerCompressor``: the passes of one compression, wired over one shared ``Nodes``.

Each pass is its own unit, found by its file: ``nodes`` (layers over one node, scoring, pruning; the
settings and result types), ``leaf_pass`` (the leaf layers, built once into a leaf tier and read back
per question), ``tree`` (the paper's merge tree), ``flat`` (the flat selection) and ``recompute`` (the
re-read of a selection by one plain prefill). The passes share one ``Nodes`` (the model, settings,
calibration bias, observer, and a running compression's state), and that wiring is all this object
owns: a caller calls the pass it needs (``tree.compress``, ``flat.replay_recompute``, ``leaves.build``,
``recompute.reread(nodes, ...)``).
"""

from __future__ import annotations

import torch

from homer_integrations.homer.layers.nodes import CompressorSettings, Nodes, PruneObserver
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.tree.flat import FlatSelection
from homer_integrations.homer.tree.merge_tree import MergeTree


class HomerCompressor:
    """The passes of one model and settings over one ``nodes``: ``leaves`` (the leaf tier), ``tree`` and
    ``flat``. ``bias`` is the calibration table [num_layers, max_chunk_len] (None unless the scorer needs
    calibration); ``observer``, if given, is called with every node's ``PruneEvent``."""

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
