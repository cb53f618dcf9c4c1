"""Probe (issue 79, item 4): the kept passages read from stored K/V, a few tokens recomputed (CacheBlend).

Past the model's window the default re-reads the passages BM25 keeps by one plain prefill through every
layer (``PassageReplay``: about 2,048 tokens, ten seconds on two CPU cores). A kept book would hold every
token's K/V computed once, block by block (each block of ``BLOCK`` document tokens prefilled after the
prompt's prefix, as a leaf is); a question would gather its passages' rows, turn their keys to the new
positions and read them without a prefill. What the rows lose is having read one another: each read its
own block instead (``upper_read.py`` lost 5 of 8 right answers that way with only the lower layers reused).
CacheBlend (Yao et al., 2024) restores it in part: the first layer runs fresh over every row, the
``ratio`` of the passages' tokens whose first-layer K/V deviate most from the stored ones (and the
question's) run every later layer, attending to the stored K/V of the rest.

``ReusedPassages(ratio=r)`` is that read, with the blocks computed on demand and kept for the run (a probe
of accuracy: its seconds include the blocks, which a kept book would compute once). ``whole_book.py run
--methods reuse15`` plugs it in beside ``query_aware``.

Measured (``whole_book.py run --book northangerabbey --methods reuse15 --split tuning --limit 16
--read-tokens 2048``, Qwen2.5-Coder-1.5B in bfloat16; stopped after 6 of the 16 questions once the
direction was plain): 1 of 6 right against the re-read's 4 of the same 6 (3 lost, none gained) and
``upper``'s 1. Passages whose K/V were computed apart, with 15% of their rows read again, are misread
as the lower layers alone were: this model needs the kept passages to read one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors
from homer_integrations.homer.layers.nodes import CompressionResult, Nodes
from homer_integrations.homer.leaves.leaf_batch import leaf_reducible
from homer_integrations.homer.reading.strategies import PassageReplay, PassageRoom

BLOCK = 512
"""Document tokens per stored block (CacheBlend's chunks are passages of a few hundred tokens)."""


class BlockStore:
    """Per-layer K/V [1, Hkv, P + B, d] of ``prefix + document[b*B:(b+1)*B]`` for every block b asked for,
    computed once per (document, block) on ``nodes``' model."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    @torch.inference_mode()
    def block(self, nodes: Nodes, prefix: torch.Tensor, document: torch.Tensor, b: int) -> tuple[list, list]:
        key = (hash(document[:64].numpy().tobytes()) ^ document.numel(), b)
        if key not in self.blocks:
            ids = torch.cat([prefix, document[b * BLOCK : (b + 1) * BLOCK]])
            hidden = nodes.stack.embed(ids)
            cache = cache_from_tensors(*empty_layers(nodes))
            nodes.extend(hidden, torch.arange(ids.numel()), cache, range(nodes.stack.num_layers))
            self.blocks[key] = layer_tensors(cache)
        return self.blocks[key]


def empty_layers(nodes: Nodes) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    stack = nodes.stack
    empty = torch.zeros(1, stack.num_kv_heads, 0, stack.head_dim, dtype=stack.dtype, device=stack.device)
    return [empty] * stack.num_layers, [empty] * stack.num_layers


@torch.inference_mode()
def blended_read(
    nodes: Nodes,
    store: BlockStore,
    prefix: torch.Tensor,
    document: torch.Tensor,
    kept: torch.Tensor,
    suffix: torch.Tensor,
    ratio: float,
) -> Chunk:
    """Prefix [P] + ``document[kept]`` ([K] ascending) + suffix [S] at positions 0..P+K+S-1: stored K/V turned to
    their new positions, the first layer fresh over every row, the ``ratio`` x K rows that deviate most there
    (and the suffix) fresh through every later layer. Returns the chunk (its cache in sequence order)."""
    stack = nodes.stack
    P, K, S = prefix.numel(), kept.numel(), suffix.numel()
    n = P + K + S
    positions = torch.arange(n)
    blocks = kept // BLOCK
    old = P + kept - blocks * BLOCK
    delta = P + torch.arange(K) - old
    turns = stack.turns(delta)
    stored_k, stored_v = [], []  # per layer [1, Hkv, P + K, d]: prefix then the kept rows, turned
    for layer in range(stack.num_layers):
        ks, vs = [], []
        for b in blocks.unique().tolist():
            bk, bv = store.block(nodes, prefix, document, b)
            rows = P + (kept[blocks == b] - b * BLOCK)
            ks.append(bk[layer][:, :, rows])
            vs.append(bv[layer][:, :, rows])
        first_k, first_v = store.block(nodes, prefix, document, int(blocks[0]))
        k = nodes.stack.turned_keys(torch.cat(ks, dim=2), layer, turns)
        stored_k.append(torch.cat([first_k[layer][:, :, :P], k], dim=2))
        stored_v.append(torch.cat([first_v[layer][:, :, :P], torch.cat(vs, dim=2)], dim=2))
    ids = torch.cat([prefix, document[kept], suffix])
    hidden = stack.embed(ids)
    rope = stack.rotary(hidden, positions)
    # the first layer fresh over every row; the rows that deviate most are read again above it
    cache = cache_from_tensors(*empty_layers(nodes))
    hidden = stack.mlp(0, stack.attention(0, hidden, rope, cache)[0])
    fresh_k, fresh_v = cache.layers[0].keys, cache.layers[0].values
    deviation = (fresh_k[:, :, P : P + K] - stored_k[0][:, :, P:]).float().square().sum((0, 1, 3))
    deviation += (fresh_v[:, :, P : P + K] - stored_v[0][:, :, P:]).float().square().sum((0, 1, 3))
    chosen = P + deviation.topk(min(K, round(ratio * K))).indices
    again = torch.cat([chosen.sort().values, torch.arange(P + K, n)])  # [m] ascending, the suffix last
    rest = torch.ones(n, dtype=torch.bool)
    rest[again] = False
    rest[P + K :] = False
    others = rest.nonzero()[:, 0]  # [u]: rows read from the store
    order = torch.cat([others, again])  # the cache's rows, in the order they are appended
    seen = order[None, :] <= again[:, None]  # [m, u + m]: causal by sequence index
    mask = torch.zeros(seen.shape, dtype=stack.dtype).masked_fill_(~seen, torch.finfo(stack.dtype).min)[None, None]
    rows = hidden[:, again]
    keys, values = [fresh_k], [fresh_v]
    inverse = torch.argsort(order)
    for layer in range(1, stack.num_layers):
        kind = stack.family.rope_kind(layer)
        rows_rope = tuple(t[:, again] for t in rope[kind])
        layer_cache = cache_from_tensors(
            [stored_k[layer][:, :, others] if i == layer else k for i, k in enumerate(empty_layers(nodes)[0])],
            [stored_v[layer][:, :, others] if i == layer else v for i, v in enumerate(empty_layers(nodes)[1])],
        )
        out, _ = stack.family.attend(layer, rows, rows_rope, layer_cache, mask)
        rows = stack.mlp(layer, out)
        keys.append(layer_cache.layers[layer].keys[:, :, inverse])
        values.append(layer_cache.layers[layer].values[:, :, inverse])
    return Chunk(
        hidden=rows[:, -1:],
        position_ids=positions,
        reducible=leaf_reducible(P, K, S),
        origin=torch.cat([torch.full((P,), -1), kept, torch.full((S,), -1)]),
        memory=torch.full((n,), float("-inf")),
        prefix_len=P,
        suffix_len=S,
        cache=cache_from_tensors(keys, values),
    )


@dataclass(frozen=True)
class ReusedPassages(PassageReplay):
    """``PassageReplay``'s passages read from stored blocks with ``ratio`` of them recomputed (``blended_read``)."""

    ratio: float = 0.15
    store: BlockStore = field(default_factory=BlockStore, compare=False, repr=False)

    def read_kept(self, room: PassageRoom, kept: torch.Tensor) -> CompressionResult:
        inputs, nodes = room.inputs, room.chosen.nodes
        nodes.begin()
        chunk = blended_read(
            nodes, self.store, inputs.prefix_ids, inputs.document_ids, kept, room.suffix_ids, self.ratio
        )
        return nodes.result(chunk, room.plan, nodes.schedule(room.plan), room.started)
