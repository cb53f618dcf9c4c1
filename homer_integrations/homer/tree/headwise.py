"""The head-wise shared root (``strategies.HeadwiseRoot``): HOMER picks the candidates, each head keeps its own.

RULER's needles are about half of their context, so no 4x cache that keeps one token set for every
head holds all of them; KVzip (Kim et al. 2025), which lets each K/V head of each layer keep its own
tokens under one budget, holds them. ``research/headwise_probe.py`` found that this allocation, not
KVzip's score, is what the flat root lacked. The root is built in three steps:

1. HOMER's flat selection keeps ``CANDIDATES`` x the budget's document tokens (each leaf scores its
   piece by reconstruction, the best of the whole document survive) and one plain prefill re-reads
   them, every word they touch whole (``compress_flat(recompute=True, whole=...)``); a document that
   short is prefilled whole, and the candidates stay inside the model's window with the probe after
   them.
2. ``selection.head_scores`` scores every candidate per layer and head by reconstruction.
3. ``selection.survivors`` keeps the best ``L * Hkv * budget`` (layer, head, token) triples, prefix and
   suffix in every head, stored ragged (``cache.headwise_cache``): as many K/V bytes as a dense root of
   ``final_cache_len`` tokens.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import torch
from transformers.utils.generic import is_flash_attention_requested

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.dynamic import tensors_nbytes
from homer_integrations.homer.layers.nodes import CompressionResult, ProgressFn
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.headwise import SEGMENT_ROWS, head_scores, keep_ragged, survivors
from homer_integrations.homer.tree.compressor import HomerCompressor
from homer_integrations.homer.tree.recompute import WHOLE_GROWTH, prefill_kept

logger = logging.getLogger(__name__)

CANDIDATES = 2.0
"""Candidates per budget token: HOMER's selection keeps this many times the budget's document tokens
(chosen on indices 0-2 of RULER 4k, 4x: ``benchmarks/ruler_notes.md``). More did not pay: 3x answered
as 2x on the multikey_2 tuning split, and the whole document (KVzip's input; the ablation
``homer_shared_headwise_whole``) lost to 2x at 8k, 4x, held out, for 1.45x the compression."""


WHOLE_WORDS = True
"""The candidates' re-read takes every word the selection touched whole (``recompute.whole_units``): at
16k, 8x the selection of a quarter of the document kept 1 of 7 digits of a needle's value, and the
answer was a cut number (``benchmarks/ruler_notes.md``). False: the ablation
``homer_shared_headwise_cut``."""


def compress_headwise(
    compressor: HomerCompressor,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    prompt_ids: torch.Tensor,
    progress: ProgressFn | None = None,
    word_ids: torch.Tensor | None = None,
    whole_words: torch.Tensor | None = None,
) -> CompressionResult:
    """The head-wise root of prefix [P] + document [N] + suffix [S] in ``compressor.nodes.settings.final_cache_len``
    tokens a head on average. ``prompt_ids`` [R]: the reconstruction prompt read before the repeated
    text. ``word_ids`` [N]: the selection's units; ``whole_words`` [N]: each token's word, which the
    candidates keep whole where the selection touched it (with ``WHOLE_WORDS``). Returns a result whose
    ``keys``/``values`` are per layer [n_l, d] with ``head_lengths`` [L, Hkv], and whose
    ``position_ids``/``origin`` list the tokens some head keeps."""
    start = time.perf_counter()
    stack, budget = compressor.nodes.stack, compressor.nodes.settings.final_cache_len
    fixed = prefix_ids.numel() + suffix_ids.numel()
    refusal = headwise_refusal(stack, budget, prompt_ids.numel(), fixed)
    if refusal is not None:
        raise ValueError(f"the head-wise root {refusal}: use Recipe(shared_root=FlatRoot())")
    # CANDIDATES read at call time, not bound as a default: benchmarks' whole-document ablation raises it
    built = select_candidates(
        compressor,
        prefix_ids,
        document_ids,
        suffix_ids,
        prompt_ids,
        progress,
        word_ids,
        factor=CANDIDATES,
        whole=whole_words if WHOLE_WORDS else None,
    )
    logger.info("head-wise root: scoring %d candidates per layer and head", built.origin.numel())
    scores = score_candidates(stack, built, document_ids, prompt_ids)
    alive = survivors(scores, built.origin < 0, budget)
    keys, values, lengths = keep_ragged(built.keys, built.values, alive)
    some_head = alive.any(0).any(0)
    # the probe's cache: the candidates, and one layer's copy of them grown by a segment's rows
    candidates, rows = built.origin.numel(), prompt_ids.numel() + min(SEGMENT_ROWS, int((built.origin >= 0).sum()))
    per_token = tensors_nbytes(built.keys + built.values) / candidates
    probe_bytes = int(per_token * (candidates + (candidates + rows) / stack.num_layers))
    return replace(
        built,
        peak_kv_bytes=max(built.peak_kv_bytes, probe_bytes),
        keys=keys,
        values=values,
        position_ids=built.position_ids[some_head],
        origin=built.origin[some_head],
        head_lengths=lengths,
        seconds=time.perf_counter() - start,
    )


def select_candidates(
    compressor: HomerCompressor,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    prompt_ids: torch.Tensor,
    progress: ProgressFn | None = None,
    word_ids: torch.Tensor | None = None,
    factor: float = CANDIDATES,
    recompute: bool = True,
    whole: torch.Tensor | None = None,
    tokens: int | None = None,
) -> CompressionResult:
    """Step 1: HOMER's flat selection of ``factor`` x the budget's document tokens (``tokens``: that many
    instead, ``strategies.WindowRoot``), re-read by a plain
    prefill (``recompute``; else the shared flat root's cache of them); a document that short (and
    inside the probe's room) is prefilled whole, without the selection. ``whole`` [N] (each document
    token's unit): the re-read takes every unit the selection touched whole. A dense result
    [1, Hkv, W, d] per layer."""
    nodes = compressor.nodes
    stack, settings = nodes.stack, nodes.settings
    fixed, length = prefix_ids.numel() + suffix_ids.numel(), document_ids.numel()
    room = _widest(stack.model.config.max_position_embeddings, prompt_ids.numel(), fixed) - fixed
    wanted = tokens if tokens is not None else math.ceil(factor * (settings.final_cache_len - fixed))
    if recompute and length <= min(wanted, room):
        start = time.perf_counter()
        everything = prefill_kept(stack, settings, prefix_ids, document_ids, torch.arange(length), suffix_ids)
        if progress is not None:
            progress(length)
        plan = ChunkPlan.build(prefix_ids.numel(), length, suffix_ids.numel(), settings.max_chunk_len)
        return replace(everything, plan=plan, seconds=time.perf_counter() - start)
    wide = fixed + min(wanted, room, length)
    if whole is not None and WHOLE_GROWTH * (wide - fixed) > room:
        whole = None  # the closure could leave the probe's window
    wider = HomerCompressor(stack, replace(settings, final_cache_len=wide), nodes.bias, nodes.observer)
    return wider.flat.compress_flat(prefix_ids, document_ids, suffix_ids, progress, word_ids, recompute, whole)


def headwise_refusal(stack: DecoderStack, budget: int, prompt_len: int, fixed: int) -> str | None:
    """Why this model cannot hold a head-wise root of ``budget`` tokens (None: it can). ``prompt_len``:
    the reconstruction prompt's tokens, read after the candidates; ``fixed``: prefix + suffix tokens."""
    if is_flash_attention_requested(requested_attention_implementation=stack.backend):
        # its kernels read the implementation's name from the config: no wrapper can hold it (cache.py)
        return f"needs SDPA or eager attention, not {stack.backend}"
    windowed = [layer for layer in range(stack.num_layers) if stack.window(layer) is not None]
    if windowed:
        return f"needs full attention in every layer; layers {windowed[:4]} have a sliding window"
    positions = stack.model.config.max_position_embeddings
    room = _widest(positions, prompt_len, fixed)
    if room < budget:
        return (
            f"probes after its candidates, which leaves final_cache_len at most {room} positions of this "
            f"model's {positions}: lower final_cache_len"
        )
    return None


def score_candidates(
    stack: DecoderStack, built: CompressionResult, document_ids: torch.Tensor, prompt_ids: torch.Tensor
) -> torch.Tensor:
    """Step 2: reconstruction scores [L, Hkv, W] of ``built``'s tokens (prefix and suffix: -inf)."""
    document = built.origin >= 0
    repeat_ids = document_ids[built.origin[document]]
    return head_scores(
        stack, built.keys, built.values, built.position_ids, prompt_ids, repeat_ids, document.nonzero()[:, 0]
    )


def _widest(max_positions: int, prompt: int, fixed: int) -> int:
    """The most candidates W whose probe stays inside the window: W + ``prompt`` + one segment of
    min(SEGMENT_ROWS, W - ``fixed``) repeated ids at most ``max_positions``."""
    full_segment = max_positions - prompt - SEGMENT_ROWS
    return full_segment if full_segment - fixed >= SEGMENT_ROWS else (max_positions - prompt + fixed) // 2
