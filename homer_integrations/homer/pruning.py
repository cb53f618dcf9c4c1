"""Token pruning with calibrated last-token significance (paper, section 4).

Each node prunes once, in its last layer, between attention and MLP. A document token's score
is the raw pre-softmax attention logit of the chunk's LAST token to it, maxed over heads, minus
a calibration bias that removes last-token attention's preference for nearby positions.
"""

from __future__ import annotations

import torch

from homer_integrations.homer.config import Scorer


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
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    position_ids: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Score [T] of every token from the last R tokens' queries [1, H, R, d] (R = 1 in the paper).

    Per query row: max over heads of the raw logit, minus ``bias`` [MCL] (this layer's
    calibration row, indexed by the row-to-key distance in positions; None = uncalibrated).
    Rows are then averaged; a key only counts the rows that come after it in sequence order.
    """
    rows = queries.shape[2]
    length = keys.shape[2]
    per_row = torch.stack(
        [last_token_logits(queries[:, :, r : r + 1], keys, scaling).amax(dim=0) for r in range(rows)]
    )  # [R, T]
    query_index = torch.arange(length - rows, length)
    if bias is not None:
        query_pos = position_ids[query_index]
        distance = (query_pos[:, None] - position_ids[None, :]).clamp(0, bias.numel() - 1)
        per_row = per_row - bias.to(per_row.device)[distance.to(per_row.device)]
    visible = (query_index[:, None] >= torch.arange(length)[None, :]).to(per_row.device)
    return (per_row * visible).sum(0) / visible.sum(0).clamp(min=1)


def pool_scores(scores: torch.Tensor, reducible: torch.Tensor, kernel: int) -> torch.Tensor:
    """Max-pool document scores [T] over ``kernel`` neighbours so multi-token units survive together.

    Salient facts span several tokens (SmolLM2 splits numbers into single digits); scoring each
    token alone keeps some digits of a number and drops others. Prefix/suffix scores are
    excluded from the pool so they cannot lift the document tokens next to them.
    """
    if kernel <= 1:
        return scores
    masked = scores.float().masked_fill(~reducible.to(scores.device), float("-inf"))
    pooled = torch.nn.functional.max_pool1d(masked[None, None], kernel, stride=1, padding=kernel // 2)[0, 0]
    return pooled[: scores.numel()]


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


def pool_words(scores: torch.Tensor, reducible: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Give every document token the best score [T] of its word, so words are kept or dropped whole.

    ``words`` [T] is the document word index of each token (negative on prefix/suffix tokens,
    which keep their own scores).
    """
    doc = reducible.to(scores.device) & (words >= 0).to(scores.device)
    if not bool(doc.any()):
        return scores
    groups = words.to(scores.device)[doc]
    _, inverse = torch.unique(groups, return_inverse=True)
    best = torch.full((int(inverse.max()) + 1,), float("-inf"), device=scores.device)
    best = best.scatter_reduce(0, inverse, scores[doc].float(), reduce="amax")
    pooled = scores.clone().float()
    pooled[doc] = best[inverse]
    return pooled


def score_tokens(
    scorer: Scorer,
    queries: torch.Tensor,
    keys: torch.Tensor,
    scaling: float,
    position_ids: torch.Tensor,
    reducible: torch.Tensor,
    bias: torch.Tensor | None,
    pooling: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Scores [T] under the named scorer; ``random`` is the paper's ablation baseline."""
    if scorer == "random":
        return torch.rand(keys.shape[2], generator=generator)
    scores = significance(queries, keys, scaling, position_ids, bias if scorer == "calibrated" else None)
    return pool_scores(scores, reducible, pooling)


def remember(scores: torch.Tensor, chunk) -> torch.Tensor:
    """Combine this node's scores [T] with the best each token got at lower levels.

    Scores of different layers live on different scales, so each node's document scores are
    standardised first (zero mean, unit variance). The running max is stored on the chunk, so a
    token judged important in its leaf's clean context is not lost to a noisier merged judgement.
    """
    chunk.memory = torch.maximum(chunk.memory, standardise(scores, chunk.reducible))
    return chunk.memory.clone()


def standardise(scores: torch.Tensor, reducible: torch.Tensor) -> torch.Tensor:
    """Scores [T] shifted and scaled so the document tokens' scores have zero mean and unit variance."""
    doc = scores[reducible].float()
    return (scores.float() - doc.mean()) / doc.std().clamp(min=1e-6)
