"""Pruning: keep a node's best-scored document tokens (paper, section 4).

Each node prunes once, in its last layer, between attention and MLP, by the scores its
``Scoring`` gives (``scorers`` rate tokens, ``score_units`` reshape the ratings). Prefix and
suffix tokens always survive; kept tokens keep their order.
"""

from __future__ import annotations

import torch


def keep_mask(scores: torch.Tensor, reducible: torch.Tensor, target_len: int) -> torch.Tensor:
    """Keep-mask [T]: drop the ``T - target_len`` lowest-scoring reducible tokens."""
    length = scores.numel()
    drop = length - target_len
    mask = torch.ones(length, dtype=torch.bool)
    if drop <= 0:
        return mask
    reducible = reducible.to(scores.device)
    if drop > int(reducible.sum()):
        raise ValueError(f"cannot prune {drop} tokens: only {int(reducible.sum())} are reducible")
    ranked = scores.float().masked_fill(~reducible, float("inf"))
    mask[ranked.topk(drop, largest=False).indices.cpu()] = False
    return mask


def standardise(scores: torch.Tensor, reducible: torch.Tensor) -> torch.Tensor:
    """Scores [T] shifted and scaled so the document tokens' scores have zero mean and unit variance."""
    doc = scores[reducible].float()
    return (scores.float() - doc.mean()) / doc.std().clamp(min=1e-6)
