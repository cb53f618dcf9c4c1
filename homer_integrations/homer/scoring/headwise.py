"""Head-wise selection: each K/V head of each layer keeps its own tokens of a cache.

HOMER's caches keep one token set for every head and layer. RULER's needles alone (keys and values)
are about half of their context, so no 4x cache that keeps the same tokens in every head holds all of
them; KVzip (Kim et al. 2025), which keeps different tokens per head and layer, holds them. These are
the units to test that on our caches (``research/headwise_probe.py``): a reconstruction probe that
scores every token per layer and head (``head_scores``), and two selections over those scores, the
same count in every head (``keep_per_head``: the dense layout transformers' caches read as they are)
and one budget over all heads and layers (``keep_global``: KVzip's; a head then keeps what it needs,
and the cache must hide the rest of its slots from attention).
"""

from __future__ import annotations

import torch

from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.scorers import ScoreInput, log_max_attention

SEGMENT_ROWS = 2048
"""Repeated tokens per probe segment (KVzip's chunk): each segment (the prompt, then up to this many
cached tokens' ids) runs alone after the cache, so the probe's K/V and attention stay one segment's size
(and one layer's copy of the cache and segment, which ``head_scores`` frees before the next layer)."""


@torch.inference_mode()
def head_scores(
    stack: DecoderStack,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    positions: torch.Tensor,
    prompt_ids: torch.Tensor,
    repeat_ids: torch.Tensor,
    repeated: torch.Tensor,
    segment_rows: int = SEGMENT_ROWS,
    sinks: int = 4,
) -> torch.Tensor:
    """Reconstruction scores [L, Hkv, T] of a cache's T tokens (``keys``/``values``: per layer
    [1, Hkv, T, d], at ``positions`` [T]).

    The model reads ``prompt_ids`` [P] + ``repeat_ids`` [R] after the cache, one segment of
    ``segment_rows`` repeated ids at a time (every row attends to the whole cache). ``repeated`` [R]
    holds the cache slot each repeated id copies; a slot's score in a layer and K/V head is the log of
    the most attention (max over the segment's rows and the head's query group) it gets, normalised
    over the first ``sinks`` slots, the segment's own slots and the rows, as KVzip normalises (the
    rest of the cache would dilute it unevenly; their logits are not computed: 0.86 of the time at
    3,000 slots). Slots never repeated score -inf. The cache tensors
    are not modified."""
    if repeat_ids.numel() != repeated.numel():
        raise ValueError(f"{repeat_ids.numel()} repeated ids but {repeated.numel()} slots they copy")
    length, kv_heads = positions.numel(), keys[0].shape[1]
    best = torch.full((stack.num_layers, kv_heads, length), float("-inf"))
    start = int(positions.max()) + 1
    reducible = torch.ones(length, dtype=torch.bool)
    for segment, own in zip(repeat_ids.split(segment_rows), repeated.split(segment_rows), strict=True):
        probe = torch.cat([prompt_ids, segment])
        rows = probe.numel()
        inside = torch.zeros(length, dtype=torch.bool)
        inside[own], inside[:sinks] = True, True
        columns = inside.nonzero()[:, 0]  # [C]: the cached slots the rows' softmax is normalised over
        scored = torch.isin(columns, own)  # [C]: a sink that is not repeated here keeps its score
        slots = columns[scored]
        cache = cache_from_tensors(keys, values)  # attention appends into new tensors
        hidden = stack.embed(probe)
        rope = stack.rotary(hidden, torch.arange(start, start + rows))
        for layer in range(stack.num_layers):
            hidden, query = stack.attention(layer, hidden, rope, cache, query_rows=rows)
            grown = cache.layers[layer].keys  # [1, Hkv, T + rows, d]
            # only the slots inside the softmax: the logits of the rest would be masked out anyway
            seen = torch.cat([grown[:, :, columns.to(grown.device)], grown[:, :, length:]], dim=2)
            x = ScoreInput(query, seen, positions[columns], reducible[columns], layer, stack.scaling, None)
            scores = log_max_attention(x, columns.numel(), per_head=True).cpu()  # [Hkv, C]
            best[layer][:, slots] = torch.maximum(best[layer][:, slots], scores[:, scored])
            # this layer's copy (the cache and the segment's rows) is read no more: free it now, so
            # the probe holds one layer's copy at a time, not every layer's
            cache.layers[layer].keys = cache.layers[layer].values = None
            if layer != stack.num_layers - 1:
                hidden = stack.mlp(layer, hidden)
        del cache
    return best


def _gather(
    keys: list[torch.Tensor], values: list[torch.Tensor], kept: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the slots ``kept`` [L, Hkv, K] of each head: [1, Hkv, K, d] keys and values."""
    out_keys, out_values = [], []
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        index = kept[layer].to(k.device)[None, :, :, None].expand(1, -1, -1, k.shape[-1])
        out_keys.append(k.gather(2, index))
        out_values.append(v.gather(2, index))
    return out_keys, out_values


def keep_per_head(
    keys: list[torch.Tensor], values: list[torch.Tensor], scores: torch.Tensor, fixed: torch.Tensor, budget: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Per layer and K/V head, the ``budget`` best of T slots by ``scores`` [L, Hkv, T], ``fixed`` [T]
    (prefix and suffix) always among them, in cache order. Returns the kept keys and values (per layer
    [1, Hkv, budget, d]) and the kept slots [L, Hkv, budget]."""
    if budget < int(fixed.sum()):
        raise ValueError(f"a budget of {budget} tokens cannot hold the {int(fixed.sum())} never-pruned ones")
    ranked = scores.masked_fill(fixed[None, None], float("inf"))
    kept = ranked.topk(budget, dim=-1).indices.sort(dim=-1).values
    return (*_gather(keys, values, kept), kept)


def survivors(scores: torch.Tensor, fixed: torch.Tensor, budget: int) -> torch.Tensor:
    """KVzip's allocation: of all (layer, head, slot) scores [L, Hkv, T], the best ``L * Hkv * (budget -
    fixed)`` non-fixed ones survive, and the ``fixed`` [T] slots in every head; heads keep different
    counts. Returns the surviving pairs [L, Hkv, T] (bool)."""
    layers, heads, _ = scores.shape
    room = budget - int(fixed.sum())
    if room < 0:
        raise ValueError(f"a budget of {budget} tokens cannot hold the {int(fixed.sum())} never-pruned ones")
    if room == 0:
        return fixed[None, None].expand_as(scores).clone()
    open_scores = scores[:, :, ~fixed].reshape(-1)
    threshold = open_scores.topk(min(layers * heads * room, open_scores.numel())).values[-1]
    return (scores >= threshold) | fixed[None, None]


def keep_ragged(
    keys: list[torch.Tensor], values: list[torch.Tensor], survives: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """The surviving slots ``survives`` [L, Hkv, T] of a dense cache (per layer [1, Hkv, T, d]) as a
    ragged one: per layer keys and values [n_l, d] (head 0's slots in cache order, then head 1's, ...)
    and the lengths [L, Hkv] (``cache.headwise_cache`` reads them)."""
    out_keys = [k[0][alive] for k, alive in zip(keys, survives, strict=True)]
    out_values = [v[0][alive] for v, alive in zip(values, survives, strict=True)]
    return out_keys, out_values, survives.sum(-1)


def keep_global(
    keys: list[torch.Tensor], values: list[torch.Tensor], scores: torch.Tensor, fixed: torch.Tensor, budget: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """``survivors`` in a dense layout: per layer keys and values [1, Hkv, W, d] (W: the most slots any
    head keeps, the others padded with their worst slots), the slots [L, Hkv, W] and ``hidden``
    [L, Hkv, W], True on padding that attention must not see. Answers as ``keep_ragged`` does, in the
    memory of the widest head (``research/headwise_probe.py`` measures with it)."""
    survives = survivors(scores, fixed, budget)
    ranked = scores.masked_fill(fixed[None, None], float("inf"))
    width = int(survives.sum(-1).max())
    kept = ranked.masked_fill(~survives, float("-inf")).topk(width, dim=-1).indices.sort(dim=-1).values
    hidden = ~survives.gather(2, kept)
    return (*_gather(keys, values, kept), kept, hidden)
