"""The head-wise shared root (``shared_root="headwise"``): HOMER picks the candidates, each head keeps its own.

RULER's needles are about half of their context, so no 4x cache that keeps one token set for every
head holds all of them; KVzip (Kim et al. 2025), which lets each K/V head of each layer keep its own
tokens under one budget, holds them. ``benchmarks/headwise_probe.py`` found that this allocation, not
KVzip's score, is what the flat root lacked. The root is built in three steps:

1. HOMER's flat selection keeps ``CANDIDATES`` x the budget's document tokens (each leaf scores its
   piece by reconstruction, the best of the whole document survive) and one plain prefill re-reads
   them (``compress_flat(recompute=True)``); a prompt that fits that many tokens is prefilled whole, and
   the candidates stay inside the model's window with the probe after them.
2. ``headwise.head_scores`` scores every candidate per layer and head by reconstruction.
3. ``headwise.survivors`` keeps the best ``L * Hkv * budget`` (layer, head, token) triples, prefix and
   suffix in every head, stored ragged (``headwise_cache``): as many K/V bytes as a dense root of
   ``final_cache_len`` tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from homer_integrations.homer.compressor import CompressionResult, ProgressFn
from homer_integrations.homer.flat import TierCompressor
from homer_integrations.homer.headwise import SEGMENT_ROWS, head_scores, keep_ragged, survivors

CANDIDATES = 2.0
"""Candidates per budget token: HOMER's selection keeps this many times the budget's document tokens
(chosen on indices 0-2 of RULER 4k, 4x: ``benchmarks/ruler_notes.md``)."""


def compress_headwise(
    compressor: TierCompressor,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    prompt_ids: torch.Tensor,
    progress: ProgressFn | None = None,
    word_ids: torch.Tensor | None = None,
    candidates: float = CANDIDATES,
) -> CompressionResult:
    """The head-wise root of prefix [P] + document [N] + suffix [S] in ``compressor.settings.final_cache_len``
    tokens a head on average. ``prompt_ids`` [R]: the reconstruction prompt read before the repeated
    text. Returns a result whose ``keys``/``values`` are per layer [n_l, d] with ``head_lengths``
    [L, Hkv], and whose ``position_ids``/``origin`` list the tokens some head keeps."""
    start = time.perf_counter()
    stack, settings = compressor.stack, compressor.settings
    windowed = [layer for layer in range(stack.num_layers) if stack.window(layer) is not None]
    if windowed:
        raise ValueError(
            f"shared_root='headwise' needs full attention in every layer; layers {windowed[:4]} have a sliding "
            f"window: use shared_root='flat'"
        )
    fixed = prefix_ids.numel() + suffix_ids.numel()
    wide = fixed + math.ceil(candidates * (settings.final_cache_len - fixed))
    room = _widest(stack.model.config.max_position_embeddings, prompt_ids.numel(), fixed)
    if room < settings.final_cache_len:
        raise ValueError(
            f"shared_root='headwise' probes after its candidates, which leaves final_cache_len at most {room} "
            f"positions of this model's {stack.model.config.max_position_embeddings}: lower final_cache_len or "
            f"use shared_root='flat'"
        )
    wide = min(wide, room, fixed + document_ids.numel())
    wider = TierCompressor(stack, replace(settings, final_cache_len=wide), compressor.bias, compressor.observer)
    built = wider.compress_flat(prefix_ids, document_ids, suffix_ids, progress, word_ids, recompute=True)
    document = built.origin >= 0
    scores = head_scores(
        stack,
        built.keys,
        built.values,
        built.position_ids,
        prompt_ids,
        document_ids[built.origin[document]],
        document.nonzero()[:, 0],
    )
    alive = survivors(scores, ~document, settings.final_cache_len)
    keys, values, lengths = keep_ragged(built.keys, built.values, alive)
    some_head = alive.any(0).any(0)
    return replace(
        built,
        keys=keys,
        values=values,
        position_ids=built.position_ids[some_head],
        origin=built.origin[some_head],
        head_lengths=lengths,
        seconds=time.perf_counter() - start,
    )


def _widest(max_positions: int, prompt: int, fixed: int) -> int:
    """The most candidates W whose probe stays inside the window: W + ``prompt`` + one segment of
    min(SEGMENT_ROWS, W - ``fixed``) repeated ids at most ``max_positions``."""
    full_segment = max_positions - prompt - SEGMENT_ROWS
    return full_segment if full_segment - fixed >= SEGMENT_ROWS else (max_positions - prompt + fixed) // 2
