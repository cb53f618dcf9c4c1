"""``LeafTier``: the question-independent work of every leaf, kept so a question redoes only the rest.

In a leaf (prefix + piece + suffix, causal attention) the prefix and piece tokens never attend to
the suffix, so their K/V in every leaf layer and their hidden states after the leaf layers are the
same whatever the question. The tier keeps exactly that; a question then runs only its suffix
tokens through the leaf layers against these K/V, prunes each leaf with its own scores, merges and
runs the upper levels (``leaf_pass.LeafPass``, then ``tree`` or ``flat``). The prefix is identical in every leaf (same
tokens, same positions, nothing before it), so it is kept once.

The split is planned for a suffix of ``plan.planned_suffix_len`` tokens (the shared document suffix
); every question reuses that split. How a tier is stored: ``tier_file``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.compressed import CacheSpec
from homer_integrations.homer.kv.dynamic import tensors_nbytes


@dataclass(frozen=True)
class LeafSlice:
    """One leaf's stored part, ready to extend with a suffix.

    Attributes:
        keys, values: per leaf layer, [1, Hkv, P + n, d] (prefix then the piece's n tokens).
        hidden: [1, P + n, D] after the leaf layers (attention and MLP).
        origin: [P + n] document index of each token, -1 on the prefix.
        position_ids: [P + n] positions 0..P+n-1.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    hidden: torch.Tensor
    origin: torch.Tensor
    position_ids: torch.Tensor


@dataclass(frozen=True)
class LeafPiece:
    """One leaf's document tokens as the leaf layers left them: what a tier holds per leaf.

    Attributes:
        keys, values: per leaf layer [1, Hkv, n, d].
        hidden: [1, n, D] after the leaf layers.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor

    @property
    def length(self) -> int:
        return self.hidden.shape[1]

    def write(
        self, hidden: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], rows: slice
    ) -> None:
        """Fill this piece from ``hidden`` [1, n, D] and the ``rows`` of ``keys``/``values`` (per leaf
        layer [1, Hkv, T, d]) that hold its tokens."""
        self.hidden.copy_(hidden)
        for mine, theirs in zip(self.keys + self.values, tuple(keys) + tuple(values), strict=True):
            mine.copy_(theirs[:, :, rows])


@dataclass(eq=False)
class LeafTier:
    """Every leaf's question-independent K/V and hidden states for one document.

    Attributes:
        key: the document-cache key this tier was built for.
        plan: the split (``suffix_len`` 0; a question's suffix is set with ``plan.with_suffix``).
        leaf_layers: Lw, the leaves run layers ``0..Lw-1`` (the schedule's level 0).
        prefix_keys, prefix_values: per leaf layer [1, Hkv, P, d].
        prefix_hidden: [1, P, D] after the leaf layers.
        pieces: per leaf, its document tokens' K/V and hidden states (``LeafPiece``), in document order.
        word_ids: [L] unit index of each document token (word/sentence pruning), or None.
        seconds: wall time spent building it.
        mapped: the tensors are views of a memory-mapped cache file, not process memory.
        storage: the tensors of the whole file form (``tier_file``: per layer [Hkv, L, d] over the whole
            document) that the pieces are views of, or None when the pieces are held apart.
        leaf_keys: each leaf's content key (``leaf_reuse``), where the tier is stored by its leaves
            (``tier_file.head_tensors``: every piece a ``leaf_entry.LeafEntry`` of its own), else None.
    """

    key: str
    plan: ChunkPlan
    leaf_layers: int
    prefix_keys: tuple[torch.Tensor, ...]
    prefix_values: tuple[torch.Tensor, ...]
    prefix_hidden: torch.Tensor
    pieces: tuple[LeafPiece, ...]
    word_ids: torch.Tensor | None
    seconds: float = 0.0
    mapped: bool = False
    storage: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    leaf_keys: tuple[str, ...] | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens the tier holds K/V for: the prefix once and every document token."""
        return self.plan.prefix_len + self.plan.document_len

    @property
    def document_tokens(self) -> int:
        return self.plan.document_len

    @property
    def device(self) -> torch.device:
        return self.prefix_hidden.device

    @property
    def dtype(self) -> torch.dtype:
        return self.prefix_hidden.dtype

    def to(self, device: torch.device) -> LeafTier:
        """A copy on ``device`` (the same object when it is already there)."""
        if self.device == device:
            return self
        move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        return replace(
            self,
            mapped=False,
            storage=None,
            prefix_keys=move(self.prefix_keys),
            prefix_values=move(self.prefix_values),
            prefix_hidden=self.prefix_hidden.to(device),
            pieces=tuple(LeafPiece(move(p.keys), move(p.values), p.hidden.to(device)) for p in self.pieces),
        )

    @property
    def nbytes(self) -> int:
        extra = [self.prefix_hidden] + ([] if self.word_ids is None else [self.word_ids])
        pieces = [t for p in self.pieces for t in (*p.keys, *p.values, p.hidden)]
        return tensors_nbytes(self.prefix_keys + self.prefix_values) + tensors_nbytes(extra + pieces)

    def leaf(self, index: int) -> LeafSlice:
        """Leaf ``index``'s prefix + piece, as the leaf layers left them."""
        span = self.plan.piece(index)
        piece = self.pieces[index]
        P = self.plan.prefix_len
        return LeafSlice(
            keys=[torch.cat([p, k], dim=2) for p, k in zip(self.prefix_keys, piece.keys, strict=True)],
            values=[torch.cat([p, v], dim=2) for p, v in zip(self.prefix_values, piece.values, strict=True)],
            hidden=torch.cat([self.prefix_hidden, piece.hidden], dim=1),
            origin=torch.cat([torch.full((P,), -1), torch.arange(span.start, span.stop)]),
            position_ids=torch.arange(P + piece.length),
        )

    def document_rows(self, kept: torch.Tensor) -> LeafPiece:
        """The rows of document tokens ``kept`` ([K] ascending indices) gathered from every piece: K/V per
        leaf layer [1, Hkv, K, d], hidden [1, K, D]."""
        starts = torch.tensor([self.plan.piece(i).start for i in range(self.plan.num_leaves)])
        leaf_of = torch.searchsorted(starts, kept, right=True) - 1
        parts = []
        for index in leaf_of.unique().tolist():
            rows = (kept[leaf_of == index] - starts[index]).to(self.device)
            piece = self.pieces[index]
            parts.append(
                LeafPiece(
                    tuple(k.index_select(2, rows) for k in piece.keys),
                    tuple(v.index_select(2, rows) for v in piece.values),
                    piece.hidden.index_select(1, rows),
                )
            )
        if len(parts) == 1:
            return parts[0]
        cat = lambda ts, dim: torch.cat(list(ts), dim=dim)  # noqa: E731
        return LeafPiece(
            tuple(cat(layer, 2) for layer in zip(*(p.keys for p in parts), strict=True)),
            tuple(cat(layer, 2) for layer in zip(*(p.values for p in parts), strict=True)),
            cat((p.hidden for p in parts), 1),
        )

    def check(self) -> None:
        """Raise ``ValueError`` unless every tensor has the shape the plan implies."""
        P, L = self.plan.prefix_len, self.plan.document_len
        pkv = self.prefix_keys + self.prefix_values
        layers = {len(t) for p in self.pieces for t in (p.keys, p.values)}
        layers |= {len(self.prefix_keys), len(self.prefix_values)}
        if self.leaf_layers < 1 or layers != {self.leaf_layers}:
            raise ValueError(f"a leaf tier of {self.leaf_layers} layers holds {sorted(layers)}")
        lengths = [span.stop - span.start for span in map(self.plan.piece, range(self.plan.num_leaves))]
        if len(self.pieces) != len(lengths) or sum(lengths) != L:
            raise ValueError(f"a leaf tier of {len(self.pieces)} pieces for a split into {len(lengths)} of {L} tokens")
        kv = [t for p in self.pieces for t in p.keys + p.values]
        pieces = zip(self.pieces, lengths, strict=True)
        shaped = all((t.dim(), t.shape[2]) == (4, n) for p, n in pieces for t in p.keys + p.values)
        if not shaped or len({(t.shape[1], t.shape[3]) for t in kv + list(pkv)}) != 1:
            raise ValueError(f"leaf tier K/V are not [1, Hkv, n, d] per piece of one head layout ({L} tokens)")
        if any(t.shape[2] != P for t in pkv) or self.prefix_hidden.shape[1] != P:
            raise ValueError(f"leaf tier prefix/hidden lengths do not match the plan ({P} + {L} tokens)")
        if any(p.hidden.dim() != 3 or p.length != n for p, n in zip(self.pieces, lengths, strict=True)):
            raise ValueError(f"leaf tier prefix/hidden lengths do not match the plan ({P} + {L} tokens)")
        if self.word_ids is not None and self.word_ids.shape != (L,):
            raise ValueError("leaf tier word ids do not cover the document")
        floats = [*kv, *pkv, self.prefix_hidden, *(p.hidden for p in self.pieces)]
        if not all(t.dtype.is_floating_point and bool(torch.isfinite(t).all()) for t in floats):
            raise ValueError("leaf tier tensors hold NaN, infinite or non-float values")

    def validate(self, spec: CacheSpec) -> None:
        """Raise ``ValueError`` unless a model of ``spec`` can replay this tier (after ``check``)."""
        self.check()
        if self.leaf_layers > spec.num_layers or (self.leaf_layers == spec.num_layers and self.plan.num_leaves > 1):
            # one leaf is the whole tree: its tier runs every layer; more leaves leave layers to merge in
            raise ValueError(
                f"a leaf tier of {self.leaf_layers} layers and {self.plan.num_leaves} leaves for a model of "
                f"{spec.num_layers}"
            )
        want = (spec.num_kv_heads, spec.head_dim)
        for t in [*self.prefix_keys, *self.prefix_values, *(t for p in self.pieces for t in p.keys + p.values)]:
            if (t.shape[1], t.shape[3]) != want or t.dtype != spec.dtype:
                raise ValueError(f"leaf tier K/V are {t.dtype} {tuple(t.shape)}, the model needs {spec.dtype} {want}")
        if self.plan.max_chunk_len != spec.max_positions:
            raise ValueError(f"leaf tier planned for max_chunk_len {self.plan.max_chunk_len}, not {spec.max_positions}")
