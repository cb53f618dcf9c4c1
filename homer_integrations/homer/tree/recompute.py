"""Re-reading a selection: one plain prefill of the tokens a HOMER selection kept.

HOMER's cache keeps each surviving token's K/V as its own leaf computed them: the token saw only its
leaf's piece, and tokens of different leaves share positions. Where a kept fact is misread from such a
cache (kept, yet answered wrong, while a plain prefill over the same tokens answers), running the kept
tokens again as one ordinary prompt (prefix + kept document tokens in document order + suffix, positions
0..K-1, every layer) gives a cache in which every kept token attended to every kept token before it.
HOMER decides *what* to keep; this pass decides *how* it is read. It costs one prefill of K tokens
(``final_cache_len``), against the upper levels' work over K tokens that it replaces.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.layers.nodes import CompressionResult, CompressorSettings, Nodes
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.tree.merge_tree import MergeTree

WHOLE_GROWTH = 1.5
"""``whole_units`` never grows a selection past this many times its tokens."""


def whole_units(
    kept: torch.Tensor, units: torch.Tensor, longest: int = 16, growth: float = WHOLE_GROWTH
) -> torch.Tensor:
    """Every document token [K'] (ascending) of a unit of at most ``longest`` tokens that ``kept`` [K]
    (ascending) touches, and the other kept tokens; ``units`` [N] holds each document token's unit
    index. A selection keeps single tokens, and a number or name whose digits or pieces it split is
    re-read as a different one. Longer units (minified code, a data line) are left as kept, and a
    closure past ``growth`` x K returns ``kept`` itself, so the re-read stays near its budget."""
    sizes = torch.bincount(units - units.min())[units - units.min()]
    touched = torch.isin(units, units[kept]) & (sizes <= longest)
    touched[kept] = True
    closed = touched.nonzero()[:, 0]
    return closed if closed.numel() <= growth * kept.numel() else kept


def prefill_kept(
    stack: DecoderStack,
    settings: CompressorSettings,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    kept: torch.Tensor,
    suffix_ids: torch.Tensor,
) -> CompressionResult:
    """The plain prefill of prefix [P] + ``document_ids[kept]`` + suffix [S]: one chunk through every
    layer, nothing pruned. ``kept`` [K] holds ascending document indices; the result's ``origin`` maps
    its rows back to them (-1 on prefix and suffix) and its positions are 0..P+K+S-1."""
    if kept.numel() == 0:
        raise ValueError("nothing was kept to prefill")
    if bool((kept[1:] <= kept[:-1]).any()):
        raise ValueError("kept document indices must be ascending (document order)")
    total = prefix_ids.numel() + kept.numel() + suffix_ids.numel()
    # One chunk as long as the prompt: a tree of height 0 runs every layer and prunes nothing.
    one_chunk = replace(settings, max_chunk_len=total, final_cache_len=total, suffix_reserve=0)
    plan = ChunkPlan.build(prefix_ids.numel(), kept.numel(), suffix_ids.numel(), total)
    nodes = Nodes(stack, one_chunk, None)
    result = MergeTree(nodes, LeafPass(nodes)).compress(prefix_ids, document_ids[kept], suffix_ids, plan=plan)
    origin = torch.where(result.origin >= 0, kept[result.origin.clamp(min=0)], result.origin)
    return replace(result, origin=origin)


@torch.inference_mode()
def reread(
    nodes: Nodes,
    plan: ChunkPlan,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    kept: torch.Tensor,
    suffix_ids: torch.Tensor,
    started: float,
) -> CompressionResult:
    """One plain prefill of prefix [P] + ``document_ids[kept]`` ([K] ascending) + suffix [S] on ``nodes``'
    model and settings (``prefill_kept``), reported with the document's split ``plan``; ``started``: when
    the question's work began (``time.perf_counter()``)."""
    result = prefill_kept(nodes.stack, nodes.settings, prefix_ids, document_ids, kept, suffix_ids)
    return replace(result, plan=plan, seconds=time.perf_counter() - started)


def reread_selected(
    nodes: Nodes,
    selected: Chunk,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    plan: ChunkPlan,
    start: float,
    whole: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
) -> CompressionResult:
    """The plain prefill of ``selected``'s document tokens (with ``whole`` [N], of every unit they touch;
    with ``extra`` [E], and those) between prefix [P] and suffix [S], reported with the split that selected
    them and the selection's peak (``nodes.peak``)."""
    kept = selected.origin[selected.origin >= 0].sort().values
    del selected
    if whole is not None:
        kept = whole_units(kept, whole)
    if extra is not None and extra.numel():
        kept = torch.cat([kept, extra.to(kept.device)]).unique()  # sorted, each token once
    result = prefill_kept(nodes.stack, nodes.settings, prefix_ids, document_ids, kept, suffix_ids)
    return replace(
        result, plan=plan, peak_kv_bytes=max(nodes.peak, result.peak_kv_bytes), seconds=time.perf_counter() - start
    )
