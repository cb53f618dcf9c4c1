"""Layer schedule: which decoder layers each level of the merge tree runs (paper, section 3)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerSchedule:
    """Contiguous layer ranges per tree level; level 0 are the leaves, level ``height`` the root.

    ``levels[k]`` is the ``range`` of layer indices a node at height ``k`` runs. The ranges are
    disjoint, in order, and together cover ``range(num_layers)``.
    """

    num_layers: int
    warmup_layers: int
    height: int
    levels: tuple[range, ...]

    @classmethod
    def build(cls, num_layers: int, warmup_layers: int, height: int) -> LayerSchedule:
        """The published schedule: leaves get ``W + lo + lpc`` layers, every merge level ``lpc``.

        ``M = num_layers - W`` merging layers are shared evenly by the ``height + 1`` levels
        (``lpc = M // (height + 1)``); the remainder ``lo`` goes to the leaves.
        """
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not 0 <= warmup_layers < num_layers:
            raise ValueError(f"warmup_layers must be in [0, {num_layers - 1}], got {warmup_layers}")
        if height < 0:
            raise ValueError(f"height must be >= 0, got {height}")
        merging = num_layers - warmup_layers
        if merging < height + 1:
            raise ValueError(
                f"{merging} merging layers cannot serve a tree of height {height}: every level needs at "
                f"least one layer; lower warmup_layers or raise max_chunk_len"
            )
        per_level = merging // (height + 1)
        leftover = merging - per_level * (height + 1)
        first = warmup_layers + leftover + per_level
        levels = [range(0, first)]
        for k in range(1, height + 1):
            start = warmup_layers + leftover + per_level * k
            levels.append(range(start, start + per_level))
        return cls(num_layers, warmup_layers, height, tuple(levels))

    def layers_at(self, height: int) -> range:
        """Layer indices run by a node at ``height`` (0 = leaf)."""
        return self.levels[height]


def fit_schedule(num_layers: int, warmup_layers: int, height: int) -> LayerSchedule:
    """The schedule of a tree of ``height`` on ``num_layers`` layers; warm-up is lowered (with a warning)
    where the tree's levels need its layers."""
    if height + 1 > num_layers:
        raise ValueError(
            f"the document needs a merge tree of height {height} (up to {2**height} chunks), but the model has "
            f"only {num_layers} layers for its {height + 1} levels; raise max_chunk_len"
        )
    warmup = min(warmup_layers, num_layers - height - 1)
    if warmup < warmup_layers:
        logger.warning(
            "a tree of height %d needs %d merging layers: warm-up lowered from %d to %d layers for "
            "this document (raise max_chunk_len to keep it)",
            height,
            height + 1,
            warmup_layers,
            warmup,
        )
    return LayerSchedule.build(num_layers, warmup, height)
