"""The leaf probe: a probing scorer's rows (e.g. reconstruction's "repeat the text" prompt and the piece)
read after a leaf's cached tokens, and the scores they give those tokens."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.scorers import ScoreInput, Scorer


@torch.inference_mode()
def probe_scores(
    stack: DecoderStack,
    scorer: Scorer,
    cache: DynamicCache,
    positions: torch.Tensor,
    piece_ids: torch.Tensor,
    layers: range,
) -> torch.Tensor:
    """Scores [T] of a leaf's T cached tokens at ``positions`` [T] from ``scorer``'s probe rows (at the
    next positions), run through ``layers`` against ``cache`` and then dropped from it. ``piece_ids``: the
    leaf's document tokens, which the probe may repeat."""
    length = positions.numel()
    probe_ids = scorer.probe_ids(piece_ids)
    rows = probe_ids.numel()
    start = int(positions.max()) + 1
    hidden = stack.embed(probe_ids)
    rope = stack.rotary(hidden, torch.arange(start, start + rows))
    reducible = torch.ones(length, dtype=torch.bool)
    evidence: list[torch.Tensor] = []
    last = scorer.probe_last(layers)
    for layer_idx in range(layers.start, last + 1):
        score_here = scorer.probe_scores_at(layer_idx, layers)
        hidden, query = stack.attention(layer_idx, hidden, rope, cache, query_rows=rows if score_here else 0)
        if score_here:
            x = ScoreInput(query, cache.layers[layer_idx].keys, positions, reducible, layer_idx, stack.scaling, None)
            evidence.append(scorer.probe_scores(x, length))
        if layer_idx != last:
            hidden = stack.mlp(layer_idx, hidden)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
    return scorer.probe_combine(evidence)
