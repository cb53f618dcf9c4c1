"""Scoring every leaf of a leaf tier in one batched pass.

A question's flat selection needs only each leaf's pruning scores from its suffix rows. Run one leaf
at a time, that is ``num_leaves x leaf_layers`` small forwards of ~S rows: on a GPU the kernel
launches, not the arithmetic, set the time (H100, 32k tokens, 16 leaves: the question took 0.94 of
the leaf tier's own time). Here the suffix of every leaf runs the leaf layers together, as a batch
of B leaves against each leaf's stored K/V: ``leaf_layers`` forwards in all.

Every suffix sits at the same positions (after the longest piece, ``ChunkPlan.piece_len``), so a
shorter leaf's missing last slots (one at most in an even split) are padded and masked out of its attention;
each leaf is then scored on its own keys, exactly as alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.scorers import ScoreInput, Scorer


def batchable(stack: DecoderStack, layers: range) -> bool:
    """Whether these leaf layers can run as a batch: a mask per leaf (not flash-attn) and no sliding
    window (a padded slot would count in it)."""
    backend = stack.backend
    return "flash" not in backend and all(stack.window(layer) is None for layer in layers)


def leaf_keys(prefix: torch.Tensor, pieces: Sequence[torch.Tensor], plan: ChunkPlan) -> torch.Tensor:
    """One layer's prefix [1, Hkv, P, d] and each leaf's piece [1, Hkv, n_b, d] as a batch [B, Hkv, P + E, d]:
    leaf b's prefix and piece, a shorter piece padded with zeros at its end."""
    B, P, E = plan.num_leaves, plan.prefix_len, plan.piece_len
    _, heads, _, dim = prefix.shape
    out = prefix.new_zeros(B, heads, P + E, dim)
    out[:, :, :P] = prefix
    for b, piece in enumerate(pieces):
        out[b, :, P : P + piece.shape[2]] = piece[0]
    return out


@torch.inference_mode()
def score_leaves(
    stack: DecoderStack,
    scorer: Scorer,
    bias: torch.Tensor | None,
    tier: LeafTier,
    suffix_ids: torch.Tensor,
    plan: ChunkPlan,
    layers: range,
) -> list[torch.Tensor]:
    """Every leaf's pruning scores [P + n_b + S] (its prefix, piece and suffix ``suffix_ids`` [S]), as
    ``LeafPass.replayed_leaf`` computes them one leaf at a time. ``plan``: the tier's split
    with this suffix; ``layers``: the leaf layers; ``bias``: the calibration table where ``scorer``
    reads one."""
    B, P, E, S = plan.num_leaves, plan.prefix_len, plan.piece_len, plan.suffix_len
    lengths = [plan.piece(b).stop - plan.piece(b).start for b in range(B)]
    hidden = stack.embed(suffix_ids).expand(B, -1, -1)
    rope = stack.rotary(hidden[:1], torch.arange(P + E, P + E + S))  # one table, broadcast over the leaves
    key_mask = torch.zeros(B, 1, 1, P + E + S, dtype=stack.dtype, device=stack.device)
    for b, n in enumerate(lengths):
        key_mask[b, ..., P + n : P + E] = torch.finfo(stack.dtype).min
    empty = [stack.empty((B, stack.num_kv_heads, 0, stack.head_dim)) for _ in range(layers.stop)]
    cache = cache_from_tensors(empty, list(empty))
    rows = max(1, min(scorer.rows, S))
    evidence: list[list[torch.Tensor]] = [[] for _ in range(B)]
    for layer_idx in layers:
        own = cache.layers[layer_idx]
        own.keys = leaf_keys(tier.prefix_keys[layer_idx], [p.keys[layer_idx] for p in tier.pieces], plan)
        own.values = leaf_keys(tier.prefix_values[layer_idx], [p.values[layer_idx] for p in tier.pieces], plan)
        score_here = scorer.scores_at(layer_idx, layers)
        hidden, query = stack.attention(
            layer_idx, hidden, rope, cache, query_rows=rows if score_here else 0, key_mask=key_mask
        )
        if score_here:
            layer_bias = None if bias is None else bias[layer_idx]
            for b, n in enumerate(lengths):
                keys = torch.cat([own.keys[b : b + 1, :, : P + n], own.keys[b : b + 1, :, P + E :]], dim=2)
                x = ScoreInput(query[b : b + 1], keys, leaf_positions(P, n, E, S), leaf_reducible(P, n, S), layer_idx,
                               stack.scaling, layer_bias)  # fmt: skip
                evidence[b].append(scorer(x))
        own.keys, own.values = empty[layer_idx], empty[layer_idx]  # one layer's batch held at a time
        if layer_idx != layers[-1]:  # the last layer's MLP feeds nothing a selection reads
            hidden = stack.mlp(layer_idx, hidden)
    return [scorer.combine(e, leaf_reducible(P, n, S)) for e, n in zip(evidence, lengths, strict=True)]


def leaf_positions(P: int, n: int, E: int, S: int) -> torch.Tensor:
    """[P + n + S] positions of a leaf of n document tokens: the suffix always starts at P + E."""
    return torch.cat([torch.arange(P + n), torch.arange(P + E, P + E + S)])


def leaf_reducible(P: int, n: int, S: int) -> torch.Tensor:
    """[P + n + S] True on the leaf's document tokens."""
    flags = torch.zeros(P + n + S, dtype=torch.bool)
    flags[P : P + n] = True
    return flags
