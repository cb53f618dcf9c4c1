"""Ablation: the kept passages read from the leaf tier, only the layers above the leaves run per question.

The default per-question path past the model's window re-reads the passages BM25 keeps by one plain
prefill through every layer (``PassageReplay``): about 2,048 tokens, ten seconds on two CPU cores. The
leaf tier already holds every document token after the leaf layers (its hidden state and each leaf
layer's K/V, computed with the leaf's own stretch of the book around it and without the question).
``UpperRead`` takes the kept tokens' rows from the tier instead, gives them consecutive positions (the
cached keys rotated from their leaf positions to the new ones), runs the question's suffix through the
leaf layers after them and then every token through the layers above the leaves together, as HOMER's
root runs its upper layers. The per-question work shrinks to the upper layers' share of the model; what
the kept tokens lose is having read one another in the lower layers (each read its own leaf instead).

Measured (``whole_book.py run --methods upper --split tuning --limit 16``: Northanger Abbey, Qwen2.5-Coder-1.5B
in bfloat16, 2,048 tokens): the first token after 5.5 s against the re-read's 10.9 s, but 3 of 15 story
questions against 8 (-0.33 [-0.53, -0.13]), so it stays here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.layers.nodes import CompressionResult, Nodes
from homer_integrations.homer.leaves.leaf_batch import leaf_reducible
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.reading.strategies import CompressorFor, PassageReplay, PassageRoom, Reread


def positions_in_leaves(plan: ChunkPlan, kept: torch.Tensor) -> torch.Tensor:
    """The position [K] each kept document token ([K] ascending) had in its leaf: P + its offset in the piece."""
    starts = torch.tensor([plan.piece(i).start for i in range(plan.num_leaves)])
    leaf = torch.searchsorted(starts, kept, right=True) - 1
    return plan.prefix_len + kept - starts[leaf]


@torch.inference_mode()
def upper_read(
    nodes: Nodes, tier: LeafTier, kept: torch.Tensor, suffix_ids: torch.Tensor, plan: ChunkPlan, started: float
) -> CompressionResult:
    """Prefix [P] + the kept document tokens ([K] ascending) + suffix [S], positions 0..P+K+S-1, from the
    tier's leaf layers up: the suffix runs the leaf layers after the kept rows, then all rows the rest."""
    leaves = LeafPass(nodes)
    _, schedule = leaves.replay_plan(tier, suffix_ids)
    nodes.begin()
    P, K, S = tier.plan.prefix_len, kept.numel(), suffix_ids.numel()
    delta = P + torch.arange(K) - positions_in_leaves(tier.plan, kept)
    turns = nodes.stack.turns(delta)
    rows = tier.document_rows(kept)
    keys = [
        torch.cat([pk, nodes.stack.turned_keys(k, layer, turns)], dim=2)
        for layer, (pk, k) in enumerate(zip(tier.prefix_keys, rows.keys, strict=True))
    ]
    values = [torch.cat([pv, v], dim=2) for pv, v in zip(tier.prefix_values, rows.values, strict=True)]
    cache = cache_from_tensors(keys, values)
    positions = torch.arange(P + K + S)
    suffix_hidden, _ = nodes.extend(nodes.stack.embed(suffix_ids), positions[P + K :], cache, schedule.layers_at(0))
    chunk = Chunk(
        hidden=torch.cat([tier.prefix_hidden, rows.hidden, suffix_hidden], dim=1),
        position_ids=positions,
        reducible=leaf_reducible(P, K, S),
        origin=torch.cat([torch.full((P,), -1), kept, torch.full((S,), -1)]),
        memory=torch.full((P + K + S,), float("-inf")),
        prefix_len=P,
        suffix_len=S,
        cache=cache,
    )
    upper = range(schedule.layers_at(0).stop, nodes.stack.num_layers)
    if upper:
        nodes.run_layers(chunk, upper, chunk.length, is_root=True)
    nodes.record_peak(chunk)
    return nodes.result(chunk, plan, schedule, started)


@dataclass(frozen=True)
class UpperRead(PassageReplay):
    """``PassageReplay``'s passages read from the leaf tier (``upper_read``) instead of re-read from text."""

    def reads_tier(self, document_tokens: int, window: int, final_cache_len: int) -> bool:
        return True

    def replay(
        self,
        leaf_tier: Callable[[], LeafTier],
        suffix_ids: torch.Tensor,
        compressor: CompressorFor,
        reread: Callable[[], Reread],
    ) -> CompressionResult:
        def select_and_read(room: PassageRoom) -> CompressionResult:
            kept = self.selection.select(room.inputs.question, None, room.passages, room.budget)
            return upper_read(room.chosen.nodes, leaf_tier(), kept, suffix_ids, room.plan, room.started)

        return self.read(leaf_tier, suffix_ids, compressor, reread, select_and_read)
