"""Scorers: how a node rates its tokens before pruning (one hook, called in the node's layers).

A scorer sees the queries of the last rows of the node (its suffix) and the keys of one layer,
and returns one score per token; higher survives. The compressor asks ``scores_at`` which of a
node's layers to score, hands each such layer a ``ScoreInput`` and folds the per-layer scores
with ``combine``. Post-processing (pooling, word units, memory) lives in ``score_units``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from homer_integrations.homer.scoring.pruning import standardise


@dataclass(frozen=True)
class ScoreInput:
    """What one layer of a node shows its scorer.

    Attributes:
        queries: [1, H, R, d] rotated queries of the node's last R rows (R = ``Scorer.rows``).
        keys: [1, Hkv, T, d] rotated keys of every token of the node in this layer.
        position_ids: [T] positions of the node's tokens.
        reducible: [T] True on document tokens.
        layer: the decoder layer.
        scaling: the attention's logit scale (1/sqrt(d) for most models).
        bias: [max_chunk_len] this layer's calibration row, or None when there is none.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    position_ids: torch.Tensor
    reducible: torch.Tensor
    layer: int
    scaling: float
    bias: torch.Tensor | None


class Scorer:
    """Base of every scorer: scores the node's last layer from its last row."""

    rows: int = 1
    """Query rows (from the end of the node, all inside its suffix) the scorer reads."""

    needs_calibration: bool = False

    probes: bool = False
    """Whether leaves are scored by probe rows (``probe_ids``) instead of their own last rows."""

    def scores_at(self, layer: int, layers: range) -> bool:
        """Whether ``layer`` of a node that runs ``layers`` is scored (default: only the last)."""
        return layer == layers[-1]

    def combine(self, per_layer: list[torch.Tensor], reducible: torch.Tensor) -> torch.Tensor:
        """One score [T] from the scores of every scored layer (default: the last one)."""
        return per_layer[-1]

    def with_question(self) -> Scorer:
        """The scorer a node uses when its suffix holds a question (default: this one)."""
        return self

    def probe_ids(self, piece_ids: torch.Tensor) -> torch.Tensor | None:
        """Token ids [R] a leaf of document tokens ``piece_ids`` appends after its suffix to be scored by
        (their queries score it, then they are dropped); None (default): the node's own rows score it."""
        return None

    def probe_scores(self, x: ScoreInput, length: int) -> torch.Tensor:
        """Scores [length] of a leaf's tokens from its probe rows (``x.keys`` holds leaf and probe keys)."""
        raise NotImplementedError

    def probe_scores_at(self, layer: int, layers: range) -> bool:
        """Whether the probe rows score ``layer`` of a leaf that runs ``layers`` (default: only the last)."""
        return layer == layers[-1]

    def probe_last(self, layers: range) -> int:
        """The last of a leaf's ``layers`` the probe rows score: they run no further."""
        return max(layer for layer in layers if self.probe_scores_at(layer, layers))

    def probe_combine(self, per_layer: list[torch.Tensor]) -> torch.Tensor:
        """One score [T] from the probe scores of every probed layer (default: the best layer's)."""
        return torch.stack(per_layer).amax(0)

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        raise NotImplementedError


def attention_logits(query: torch.Tensor, keys: torch.Tensor, scaling: float) -> torch.Tensor:
    """Raw attention logits of one row: query [1, H, 1, d], keys [1, Hkv, T, d] -> [H, T].

    Grouped-query attention: query head ``h`` reads key head ``h // (H // Hkv)``, the layout
    of transformers' ``repeat_kv``.
    """
    heads, kv_heads = query.shape[1], keys.shape[1]
    group = heads // kv_heads
    q = query[0, :, 0].float().view(kv_heads, group, -1)  # [Hkv, G, d]
    k = keys[0].float()  # [Hkv, T, d]
    return torch.einsum("hgd,htd->hgt", q, k).reshape(heads, -1) * scaling


BLOCK_FLOATS = 1 << 23
"""Most softmax entries (H x rows x keys) ``log_max_attention`` holds at once: 32 MiB in float32,
so a reconstruction probe of a 4k leaf (8k keys) scores in blocks of ~70 rows, not one 8k x 8k map."""


def log_max_attention(x: ScoreInput, length: int, block: int = 256, per_head: bool = False) -> torch.Tensor:
    """Log of the most attention (softmax probability, max over rows and heads) each of the first
    ``length`` keys receives from the R query rows, which sit at the end of the keys (causal) -> [length];
    ``per_head``: max over rows and each K/V head's query group only -> [Hkv, length].

    A block of rows reads the keys up to its last row only (the later ones are masked for all of its rows,
    and a softmax gives them exactly 0) and masks its own triangle: the rows of a probe after its cache skip
    about half of the probe's own keys (``research/headwise_speed.py``)."""
    rows, keys = x.queries.shape[2], x.keys.shape[2]
    heads, kv_heads = x.queries.shape[1], x.keys.shape[1]
    block = max(1, min(block, BLOCK_FLOATS // (heads * keys)))
    k = x.keys[0].float()  # [Hkv, K, d]
    best = torch.full((kv_heads, length) if per_head else (length,), float("-inf"), device=k.device)
    reduce = (1, 2) if per_head else (0, 1, 2)
    first = keys - rows  # the key of row 0
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        seen = first + stop  # keys any row of the block sees
        q = x.queries[0, :, start:stop].float().view(kv_heads, heads // kv_heads, stop - start, -1)
        logits = torch.einsum("hgrd,hkd->hgrk", q, k[:, :seen]).mul_(x.scaling)  # [Hkv, G, b, seen]
        unseen = torch.ones(stop - start, stop - start, dtype=torch.bool, device=k.device).triu_(1)  # [b, b]
        logits[..., first + start : seen].masked_fill_(unseen, float("-inf"))
        probs = logits.softmax(-1)[..., :length]
        scored = min(length, seen)  # keys past ``seen`` get 0 from this block: the final clamp covers them
        if per_head:
            best[:, :scored] = torch.maximum(best[:, :scored], probs.amax(dim=reduce))
        else:
            best[:scored] = torch.maximum(best[:scored], probs.amax(dim=reduce))
        del logits, probs
    return best.clamp(min=1e-12).log()


@dataclass(frozen=True)
class LastTokenScorer(Scorer):
    """The paper's significance: the raw attention logit of the last row to each token, maxed over
    heads, minus the calibration bias of their distance (which removes last-token attention's pull
    toward nearby positions). With ``rows`` > 1 the rows' scores are averaged, each key counting only
    the rows after it; ``calibrated=False`` is the paper's uncalibrated ablation."""

    calibrated: bool = True
    rows: int = 1

    @property
    def needs_calibration(self) -> bool:  # type: ignore[override]
        return self.calibrated

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        rows, length = x.queries.shape[2], x.keys.shape[2]
        per_row = torch.stack(
            [attention_logits(x.queries[:, :, r : r + 1], x.keys, x.scaling).amax(dim=0) for r in range(rows)]
        )  # [R, T]
        query_index = torch.arange(length - rows, length)
        if self.calibrated:
            if x.bias is None:
                raise ValueError("the calibrated scorer needs a calibration bias to prune")
            distance = (x.position_ids[query_index][:, None] - x.position_ids[None, :]).clamp(0, x.bias.numel() - 1)
            per_row = per_row - x.bias.to(per_row.device)[distance.to(per_row.device)]
        visible = (query_index[:, None] >= torch.arange(length)[None, :]).to(per_row.device)
        return (per_row * visible).sum(0) / visible.sum(0).clamp(min=1)


@dataclass(frozen=True)
class QuestionAttentionScorer(Scorer):
    """Every suffix row (the question and the template around it) scores: a token's score is the log of
    the most attention (softmax, max over rows and heads) it receives from any of them. KVzip's
    reconstruction score with the question as the probe; SnapKV's observation window with a max
    instead of a mean. No calibration: a softmax over the node's own keys is already comparable
    within the node."""

    rows: int = 1 << 20
    """All suffix rows (``HomerCompressor`` caps the rows at the suffix length)."""
    block: int = field(default=256, compare=False, repr=False)

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        return log_max_attention(x, x.keys.shape[2], self.block)


@dataclass(frozen=True)
class RandomScorer(Scorer):
    """The paper's ablation baseline: uniform random scores, reproducible per (seed, layer, length)."""

    seed: int = 0

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + x.layer * 10_007 + x.keys.shape[2])
        return torch.rand(x.keys.shape[2], generator=g)


@dataclass(frozen=True)
class EveryLayer(Scorer):
    """Wraps a scorer to score every layer a node runs and average the standardised scores (a leaf
    runs many layers, and no single one of them need be the layer that notices a fact)."""

    inner: Scorer

    @property
    def rows(self) -> int:  # type: ignore[override]
        return self.inner.rows

    @property
    def needs_calibration(self) -> bool:  # type: ignore[override]
        return self.inner.needs_calibration

    def scores_at(self, layer: int, layers: range) -> bool:
        return True

    def combine(self, per_layer: list[torch.Tensor], reducible: torch.Tensor) -> torch.Tensor:
        return torch.stack([standardise(s.cpu(), reducible) for s in per_layer]).mean(0)

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        return self.inner(x)


@dataclass(frozen=True)
class ReconstructionScorer(Scorer):
    """Question-agnostic context-reconstruction score (KVzip, Kim et al. 2025), for leaves.

    After a leaf's suffix the model is asked to repeat the leaf's document piece, teacher-forced:
    probe rows ``prompt_ids`` + the piece's own ids run through the leaf layers against the leaf's
    K/V. A token's score is the log of the most attention (softmax probability, max over probe rows
    and heads) it receives while being reconstructed. Merged nodes have no single piece to repeat;
    they are scored by ``merged`` (with score memory, the leaves' judgement carries up).

    With ``every_layer`` every leaf layer is probed and a token keeps its best layer's score, as KVzip
    scores every layer. It ranks a fact's value higher in its leaf (``research/reconstruction_ranks.py``)
    but answered no better on the two-tier test at about 1.8x the probe cost, so the default probes
    the last leaf layer only (``benchmarks/ablations.py`` ``reconstruction_every_layer``).
    """

    prompt_ids: tuple[int, ...] = ()
    merged: Scorer = field(default_factory=LastTokenScorer)
    every_layer: bool = False
    probe_layer: int | None = None
    """The model layer the probe scores at (None: the leaves' last layer; never past it). The probe
    rows stop there, so an earlier layer costs proportionally less."""
    probes: bool = field(default=True, init=False, repr=False)
    block: int = field(default=256, compare=False, repr=False)
    """Probe rows per softmax block (memory: H x block x keys floats)."""

    @property
    def rows(self) -> int:  # type: ignore[override]
        return self.merged.rows

    @property
    def needs_calibration(self) -> bool:  # type: ignore[override]
        return self.merged.needs_calibration

    def with_question(self) -> Scorer:
        """A question in the suffix scores better than a question-agnostic repeat: ``merged`` scores."""
        return self.merged

    def scores_at(self, layer: int, layers: range) -> bool:
        return self.merged.scores_at(layer, layers)

    def combine(self, per_layer: list[torch.Tensor], reducible: torch.Tensor) -> torch.Tensor:
        return self.merged.combine(per_layer, reducible)

    def probe_scores_at(self, layer: int, layers: range) -> bool:
        last = layers[-1] if self.probe_layer is None else min(max(self.probe_layer, layers[0]), layers[-1])
        return layer == last or (self.every_layer and layer < last)

    def probe_ids(self, piece_ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tensor(self.prompt_ids, dtype=torch.long), piece_ids.cpu()])

    def probe_scores(self, x: ScoreInput, length: int) -> torch.Tensor:
        return log_max_attention(x, length, self.block).cpu()

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        return self.merged(x)
