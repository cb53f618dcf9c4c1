"""``LevelBatchedTree``: the merge tree breadth-first, every node of a level through its layers as one batch.

``MergeTree`` walks the tree depth-first: ``leaves x leaf_layers`` small forwards, then one node's layers
at a time. On a GPU the kernel launches, not the arithmetic, set the pace of those forwards. Here the
leaves run the leaf layers as one batch [B, T, D] (B = 2**h), each is pruned on its own scores exactly
as ``Nodes.run_layers`` prunes it, siblings are merged, and every higher level's nodes run as one batch
again: ``num_layers`` batched forwards for the whole tree. The result (kept tokens, K/V, logits) is the
depth-first one up to float rounding of the batched kernels.

Nodes of a level differ in length (pieces differ by one token; an unpruned child keeps its length), so
each is padded between its document and its suffix: every suffix sits in the same rows (the scorer's
query rows) and a mask hides the padded keys. Padding and that mask (SDPA then runs a masked kernel, not
its causal one) are where the two passes differ in arithmetic. Per layer a level still makes 2B small
gathers (each node's own K/V rows) and, in its scored layers, B scorer calls: each node is scored and
pruned by ``Nodes`` on its own tokens, as in the depth-first tree. Unmeasured on a GPU so far.

Memory, traded for launches (meant for GPUs; on a CPU the depth-first tree is as fast and far leaner):
every node of the level being run is alive at once. Peak: all 2**h leaves with their leaf-layer K/V
(about a plain prefill's K/V over the leaf layers, plus 2**h copies of the affixes), plus one layer's
padded batch K/V, the batch's hidden states [B, T, D] and its attention mask [B, 1, rows, T]; the
depth-first tree holds one pending node per level instead. ``CompressionResult.peak_kv_bytes`` counts
the nodes' K/V and the batch layer's.

What it cannot batch falls back to ``MergeTree.compress`` (same result, depth-first), named by
``unbatchable``: flash-attention backends (their layers take no mask), sliding-window layers (a padded
slot would count in the window), probing scorers (``ReconstructionScorer``: each leaf is probed with
its own piece) and content-defined splits (``ChunkPlan.bounds``: a level may hold a node without a
sibling). A tree of height 0 is one node either way. The observer sees the prunings level by level, not
in post-order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from homer_integrations.homer.document.chunking import ChunkPlan, make_leaves
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors, tensors_nbytes
from homer_integrations.homer.layers.nodes import CompressionResult, Nodes, ProgressFn
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from homer_integrations.homer.tree.merge_tree import MergeTree, leaf_chunk, tree_plan
from homer_integrations.homer.tree.merging import merge_siblings


def unbatchable(nodes: Nodes) -> str | None:
    """Why ``nodes``' model and scoring cannot run a level as one padded batch, or None when they can."""
    stack = nodes.stack
    if "flash" in stack.backend:
        return f"the {stack.backend} backend takes no attention mask to hide padded keys"
    windowed = [layer for layer in range(stack.num_layers) if stack.window(layer) is not None]
    if windowed:
        return f"layers {windowed} attend within a sliding window, which padded slots would enter"
    if nodes.scoring.scorer.probes:
        return f"{type(nodes.scoring.scorer).__name__} probes each leaf with its own piece"
    return None


@dataclass
class PaddedLevel:
    """B nodes of one level as a batch of T = P + D + S rows: node b's prefix, its d_b document tokens,
    D - d_b padded slots, its suffix (so every suffix sits in the last S rows).

    Attributes:
        hidden: [B, T, D_model] the nodes' hidden states, zeros in padded slots.
        positions: [B, T] their position ids, 0 in padded slots.
        key_mask: [B, 1, 1, T] 0 on real slots, the dtype's minimum on padded ones.
        slots: B tensors [T_b] (on the hidden states' device), the batch rows of node b's tokens, in order.
    """

    hidden: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor
    slots: list[torch.Tensor]

    @classmethod
    def of(cls, chunks: list[Chunk]) -> PaddedLevel:
        """Pad ``chunks`` (one prefix and suffix length) into one batch."""
        P, S = chunks[0].prefix_len, chunks[0].suffix_len
        docs = [c.length - P - S for c in chunks]
        T = P + max(docs) + S
        first = chunks[0].hidden
        hidden = first.new_zeros(len(chunks), T, first.shape[2])
        positions = torch.zeros(len(chunks), T, dtype=chunks[0].position_ids.dtype)
        key_mask = first.new_zeros(len(chunks), 1, 1, T)
        slots = []
        for b, (chunk, d) in enumerate(zip(chunks, docs, strict=True)):
            rows = torch.cat([torch.arange(P + d), torch.arange(T - S, T)])
            positions[b, rows] = chunk.position_ids
            rows = rows.to(first.device)
            hidden[b, rows] = chunk.hidden[0]
            key_mask[b, ..., P + d : T - S] = torch.finfo(first.dtype).min
            slots.append(rows)
        return cls(hidden, positions, key_mask, slots)

    def rows_of(self, batch: torch.Tensor, b: int, dim: int) -> torch.Tensor:
        """Node b's rows of a batched tensor (its batch axis first), along ``dim``: [1, ..., T_b, ...]."""
        return batch[b : b + 1].index_select(dim, self.slots[b])


class LevelBatchedTree:
    """The merge tree on ``nodes``, level by level, each level's nodes as one batch (see the module)."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    @property
    def unbatchable(self) -> str | None:
        """Why ``compress`` falls back to the depth-first ``MergeTree``, or None."""
        return unbatchable(self.nodes)

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
        """Compress prefix [P] + document [L] + suffix [S] token ids as ``MergeTree.compress`` does."""
        start = time.perf_counter()
        plan = tree_plan(self.nodes, prefix_ids, document_ids, suffix_ids, plan)
        if self.unbatchable is not None or plan.bounds is not None:
            tree = MergeTree(self.nodes, LeafPass(self.nodes))
            return tree.compress(prefix_ids, document_ids, suffix_ids, progress, word_ids, plan)
        s = self.nodes.settings
        schedule = self.nodes.schedule(plan)
        self.nodes.word_ids = word_ids
        self.nodes.begin()
        level = self._leaves(prefix_ids, document_ids, suffix_ids, plan)
        for height in range(plan.height + 1):
            if height:
                level = [merge_siblings(left, right) for left, right in zip(level[::2], level[1::2], strict=True)]
            is_root = height == plan.height
            target_len = s.final_cache_len if is_root else plan.child_target_len
            self._run_level(level, schedule.layers_at(height), target_len, is_root)
            if height == 0 and progress is not None:
                for index in range(plan.num_leaves):
                    span = plan.piece(index)
                    progress(span.stop - span.start)
        (root,) = level
        return self.nodes.result(root, plan, schedule, start)

    def _leaves(
        self, prefix_ids: torch.Tensor, document_ids: torch.Tensor, suffix_ids: torch.Tensor, plan: ChunkPlan
    ) -> list[Chunk]:
        """Every leaf before its layers: prefix + piece + suffix, embedded in one call."""
        leaves = make_leaves(prefix_ids, document_ids, suffix_ids, plan)
        embedded = self.nodes.stack.embed(torch.cat([leaf.input_ids for leaf in leaves]))
        hidden = embedded.split([leaf.input_ids.numel() for leaf in leaves], dim=1)
        return [leaf_chunk(leaf, h) for leaf, h in zip(leaves, hidden, strict=True)]

    def _run_level(self, chunks: list[Chunk], layers: range, target_len: int, is_root: bool) -> None:
        """Run ``layers`` on every node of ``chunks``, each pruned to ``target_len`` in the last layer."""
        if len(chunks) == 1:
            self.nodes.run_layers(chunks[0], layers, target_len, is_root)
            return
        nodes, stack = self.nodes, self.nodes.stack
        scorer = nodes.scoring.scorer
        batch = PaddedLevel.of(chunks)
        hidden = batch.hidden
        rope = stack.family.rotary(hidden, batch.positions.to(stack.device))
        empty = [stack.empty((len(chunks), stack.num_kv_heads, 0, stack.head_dim)) for _ in range(layers.stop)]
        cache = cache_from_tensors(empty, list(empty))
        shrinks = [c.length > target_len for c in chunks]
        rows = nodes.rows(chunks[0])  # every node has the same suffix, so the same scoring rows
        evidence: list[list[torch.Tensor]] = [[] for _ in chunks]
        last = layers[-1]
        for layer_idx in layers:
            score_here = any(shrinks) and scorer.scores_at(layer_idx, layers)
            hidden, query = stack.attention(
                layer_idx, hidden, rope, cache, query_rows=rows if score_here else 0, key_mask=batch.key_mask
            )
            self._hand_out(cache, layer_idx, batch, chunks)
            if score_here:
                for b, chunk in enumerate(chunks):
                    if shrinks[b]:
                        evidence[b].append(nodes.layer_scores(chunk, layer_idx, query[b : b + 1]))
            if layer_idx != last or not any(shrinks):
                hidden = self._mlp(layer_idx, hidden)
                continue
            for b, chunk in enumerate(chunks):
                chunk.hidden = batch.rows_of(hidden, b, dim=1)
                if shrinks[b]:
                    nodes.prune(chunk, layer_idx, scorer.combine(evidence[b], chunk.reducible), target_len)
            self._mlp_each(layer_idx, chunks)
            return
        for b, chunk in enumerate(chunks):
            chunk.hidden = batch.rows_of(hidden, b, dim=1)

    def _hand_out(self, cache: DynamicCache, layer_idx: int, batch: PaddedLevel, chunks: list[Chunk]) -> None:
        """Append each node's own rows of the batch's K/V [B, Hkv, T, d] for ``layer_idx`` to its cache, then
        empty that batch layer (one layer's batch is held at a time); the peak is counted before that."""
        own = cache.layers[layer_idx]
        for b, chunk in enumerate(chunks):
            keys, values = layer_tensors(chunk.cache)
            keys.append(batch.rows_of(own.keys, b, dim=2))
            values.append(batch.rows_of(own.values, b, dim=2))
            chunk.cache = cache_from_tensors(keys, values)
        held = sum(c.kv_bytes for c in chunks) + tensors_nbytes([own.keys, own.values])
        self.nodes.peak = max(self.nodes.peak, held)
        own.keys = own.values = own.keys[:, :, :0]

    def _mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's MLP on a batch [B, T, D], its rows as one sequence (blocked as ``DecoderStack.mlp`` blocks)."""
        B, T, D = hidden.shape
        return self.nodes.stack.mlp(layer_idx, hidden.reshape(1, B * T, D)).view(B, T, D)

    def _mlp_each(self, layer_idx: int, chunks: list[Chunk]) -> None:
        """The layer's MLP on every node's (pruned) hidden states [1, T_b, D], in one call."""
        out = self.nodes.stack.mlp(layer_idx, torch.cat([c.hidden for c in chunks], dim=1))
        for chunk, h in zip(chunks, out.split([c.length for c in chunks], dim=1), strict=True):
            chunk.hidden = h
