"""Token pruning with calibrated last-token significance (paper, section 4).

Each node prunes once, in its last layer, between attention and MLP. A document token's score
is the raw pre-softmax attention logit of the chunk's LAST token to it, maxed over heads, minus
a calibration bias that removes last-token attention's preference for nearby positions.
"""

from __future__ import annotations

from typing import Literal

import torch

Scorer = Literal["calibrated", "uncalibrated", "random"]


def last_token_logits(query: torch.Tensor, keys: torch.Tensor, scaling: float) -> torch.Tensor:
    """Raw attention logits of the last token: query [1, H, 1, d], keys [1, Hkv, T, d] -> [H, T].

    Grouped-query attention: query head ``h`` reads key head ``h // (H // Hkv)``, the layout
    of transformers' ``repeat_kv``.
    """
    heads, kv_heads = query.shape[1], keys.shape[1]
    group = heads // kv_heads
    q = query[0, :, 0].float().view(kv_heads, group, -1)  # [Hkv, G, d]
    k = keys[0].float()  # [Hkv, T, d]
    return torch.einsum("hgd,htd->hgt", q, k).reshape(heads, -1) * scaling


def significance(
    query: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    position_ids: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Score [T] of every token: max over heads of the last token's logit, minus ``bias``.

    ``bias`` [MCL] is this layer's calibration row, indexed by distance to the last token
    (``position_ids[-1] - position_ids[j]``); None means uncalibrated.
    """
    scores = last_token_logits(query, keys, scaling).amax(dim=0)
    if bias is not None:
        distance = (position_ids[-1] - position_ids).clamp(0, bias.numel() - 1)
        scores = scores - bias.to(scores.device)[distance.to(scores.device)]
    return scores


def keep_mask(scores: torch.Tensor, reducible: torch.Tensor, target_len: int) -> torch.Tensor:
    """Keep-mask [T]: drop the ``T - target_len`` lowest-scoring reducible tokens.

    Non-reducible tokens (prefix, suffix) always survive; kept tokens keep their order.
    """
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


def score_tokens(
    scorer: Scorer,
    query: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    position_ids: torch.Tensor,
    bias: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Scores [T] under the named scorer; ``random`` is the paper's ablation baseline."""
    if scorer == "random":
        return torch.rand(keys.shape[2], generator=generator)
    return significance(query, keys, scaling, position_ids, bias if scorer == "calibrated" else None)
