"""Splitting a prompt into the leaves of the merge tree (paper, section 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import pairwise

import torch


@dataclass(frozen=True)
class ChunkPlan:
    """How a document of ``document_len`` tokens is split into leaves: ``2**height`` even pieces, or the
    pieces between explicit ``bounds`` (a content-defined split, ``content_split``).

    Attributes:
        prefix_len, suffix_len: P and S, the affix lengths every leaf carries.
        document_len: L, the number of document tokens.
        planned_suffix_len: the suffix length the split was planned for (>= S when planned with
            a reserve): a leaf tier plans once for any question's suffix up to this length.
        max_chunk_len: MCL; no leaf is longer and no position id reaches it.
        height: tree height h; 0 when the whole prompt fits one chunk.
        piece_len: E, the longest piece (ceil(L / 2**h) when even); every leaf's suffix starts at P + E.
        bounds: None (even pieces), or the pieces' starts then the final stop L: leaf i holds
            ``bounds[i]:bounds[i+1]``, and ``height`` is ceil(log2 of their number).
    """

    prefix_len: int
    suffix_len: int
    document_len: int
    max_chunk_len: int
    height: int
    piece_len: int
    planned_suffix_len: int
    bounds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.bounds is not None and not isinstance(self.bounds, tuple):
            object.__setattr__(self, "bounds", tuple(self.bounds))  # read back from JSON as a list

    @classmethod
    def build(
        cls, prefix_len: int, document_len: int, suffix_len: int, max_chunk_len: int, suffix_reserve: int = 0
    ) -> ChunkPlan:
        """Plan the split; ``suffix_reserve`` plans for a suffix of at least that many tokens."""
        planned = max(suffix_len, suffix_reserve)
        effective = max_chunk_len - prefix_len - planned
        if effective < 2:
            raise ValueError(
                f"prefix ({prefix_len}) + suffix ({planned}) tokens leave {effective} document tokens "
                f"per chunk of max_chunk_len={max_chunk_len}; shorten them or raise max_chunk_len"
            )
        if document_len < 1:
            raise ValueError("the document has no tokens")
        leaves_needed = math.ceil(document_len / effective)
        height = math.ceil(math.log2(leaves_needed)) if leaves_needed > 1 else 0
        piece_len = math.ceil(document_len / 2**height)
        return cls(prefix_len, suffix_len, document_len, max_chunk_len, height, piece_len, planned)

    @classmethod
    def between(
        cls, bounds: tuple[int, ...], prefix_len: int, suffix_len: int, max_chunk_len: int, suffix_reserve: int = 0
    ) -> ChunkPlan:
        """The split into the pieces between ``bounds`` (starts, then the stop L); each must hold 1 to
        ``effective_len`` tokens. Planned as ``build`` plans."""
        even = cls.build(prefix_len, bounds[-1], suffix_len, max_chunk_len, suffix_reserve)
        lengths = [b - a for a, b in pairwise(bounds)]
        if bounds[0] != 0 or not lengths or min(lengths) < 1 or max(lengths) > even.effective_len:
            raise ValueError(f"pieces must tile the document with 1..{even.effective_len} tokens each: {bounds}")
        height = math.ceil(math.log2(len(lengths)))
        return replace(even, height=height, piece_len=max(lengths), bounds=tuple(bounds))

    def with_suffix(self, suffix_len: int) -> ChunkPlan:
        """The same split carrying a suffix of ``suffix_len`` tokens (a question asked of a leaf tier).

        A suffix longer than the planned one makes merged nodes that many tokens longer than MCL.
        """
        return replace(self, suffix_len=suffix_len)

    @property
    def num_leaves(self) -> int:
        return 2**self.height if self.bounds is None else len(self.bounds) - 1

    @property
    def effective_len(self) -> int:
        """Document tokens one chunk can hold next to the affixes: MCL - P - S (S as planned)."""
        return self.max_chunk_len - self.prefix_len - self.planned_suffix_len

    @property
    def child_target_len(self) -> int:
        """Length every child is pruned to, so that two merged children fit MCL: P + eff//2 + S."""
        return self.prefix_len + self.effective_len // 2 + self.suffix_len

    def piece(self, index: int) -> slice:
        """Document token slice held by leaf ``index``.

        Pieces differ in length by at most one token (the first ``L % n`` get ``E``, the rest
        ``E - 1``), so no leaf is ever empty: ``n <= L`` whenever ``effective_len >= 2``. With
        ``bounds``, the pieces between them.
        """
        if self.bounds is not None:
            return slice(self.bounds[index], self.bounds[index + 1])
        base, extra = divmod(self.document_len, self.num_leaves)
        start = index * base + min(index, extra)
        return slice(start, start + base + (1 if index < extra else 0))


def halves(count: int) -> tuple[int, int]:
    """How a tree node over ``count`` leaves splits them: the left child gets the larger half; (1, 0) is a
    node with a single child (a leaf count that is not a power of two)."""
    return (count + 1) // 2, count // 2


@dataclass
class LeafInput:
    """Token ids and bookkeeping of one leaf, before any layer runs.

    Shapes: ``input_ids`` [T], ``position_ids`` [T], ``reducible`` [T] (True on document tokens),
    ``origin`` [T] (document index of each token, -1 on prefix and suffix).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    reducible: torch.Tensor
    origin: torch.Tensor
    prefix_len: int
    suffix_len: int


def make_leaves(
    prefix_ids: torch.Tensor, document_ids: torch.Tensor, suffix_ids: torch.Tensor, plan: ChunkPlan
) -> list[LeafInput]:
    """Leaf ``i`` = prefix + document[piece i] + suffix, all leaves on the same position ids.

    Prefix positions are ``0..P-1``, the document ``P..``, and the suffix always starts at
    ``P + E`` (E = ``plan.piece_len``), also after a shorter last piece, so every leaf's suffix sits
    at the same positions. Shapes: the three inputs are 1-D token id tensors.
    """
    P, S, E = plan.prefix_len, plan.suffix_len, plan.piece_len
    leaves = []
    for i in range(plan.num_leaves):
        span = plan.piece(i)
        piece = document_ids[span]
        n = piece.numel()
        positions = torch.cat([torch.arange(P), torch.arange(P, P + n), torch.arange(P + E, P + E + S)])
        reducible = torch.cat(
            [
                torch.zeros(P, dtype=torch.bool),
                torch.ones(n, dtype=torch.bool),
                torch.zeros(S, dtype=torch.bool),
            ]
        )
        origin = torch.cat([torch.full((P,), -1), torch.arange(span.start, span.stop), torch.full((S,), -1)])
        leaves.append(LeafInput(torch.cat([prefix_ids, piece, suffix_ids]), positions, reducible, origin, P, S))
    return leaves
