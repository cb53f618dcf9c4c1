"""``LeafTier``: the question-independent work of every leaf, kept so a question redoes only the rest.

In a leaf (prefix + piece + suffix, causal attention) the prefix and piece tokens never attend to
the suffix, so their K/V in every leaf layer and their hidden states after the leaf layers are the
same whatever the question. The tier keeps exactly that; a question then runs only its suffix
tokens through the leaf layers against these K/V, prunes each leaf with its own scores, merges and
runs the upper levels (``leaf_pass.LeafPass``, then ``tree`` or ``flat``). The prefix is identical in every leaf (same
tokens, same positions, nothing before it), so it is kept once.

The split is planned for a suffix of ``plan.planned_suffix_len`` tokens (the shared document suffix
); every question reuses that split.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from homer_integrations.homer.chunking import ChunkPlan
from homer_integrations.homer.compressed import CacheSpec
from homer_integrations.homer.kv import tensors_nbytes

SERIAL_FORMAT = "homer-leaf-tier"
SERIAL_VERSION = 1

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""Tensor name -> (shape, dtype): what a tier of given dimensions holds (``LeafTier.layout``)."""
Allocate = Callable[[Layout], "dict[str, torch.Tensor] | None"]
"""Storage for a tier about to be built: a tensor per name of the layout, uninitialised (views of a
file that will become the stored entry, say); None: the builder's default, process memory."""


def plan_fields(plan: ChunkPlan) -> dict:
    """``plan``'s fields for JSON; an even plan's without ``bounds``, as tiers stored before bounds existed."""
    fields = asdict(plan)
    if plan.bounds is None:
        del fields["bounds"]
    return fields


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


@dataclass(eq=False)
class LeafTier:
    """Every leaf's question-independent K/V and hidden states for one document.

    Attributes:
        key: the document-cache key this tier was built for.
        plan: the split (``suffix_len`` 0; a question's suffix is set with ``plan.with_suffix``).
        leaf_layers: Lw, the leaves run layers ``0..Lw-1`` (the schedule's level 0).
        prefix_keys, prefix_values: per leaf layer [1, Hkv, P, d].
        prefix_hidden: [1, P, D] after the leaf layers.
        keys, values: per leaf layer [1, Hkv, L, d], the pieces of all leaves in document order.
        hidden: [1, L, D] after the leaf layers.
        word_ids: [L] unit index of each document token (word/sentence pruning), or None.
        seconds: wall time spent building it.
        mapped: the tensors are views of a memory-mapped cache file, not process memory.
    """

    key: str
    plan: ChunkPlan
    leaf_layers: int
    prefix_keys: tuple[torch.Tensor, ...]
    prefix_values: tuple[torch.Tensor, ...]
    prefix_hidden: torch.Tensor
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor
    word_ids: torch.Tensor | None
    seconds: float = 0.0
    mapped: bool = False

    @property
    def num_tokens(self) -> int:
        """Tokens the tier holds K/V for: the prefix once and every document token."""
        return self.plan.prefix_len + self.plan.document_len

    @property
    def document_tokens(self) -> int:
        return self.plan.document_len

    def to(self, device: torch.device) -> LeafTier:
        """A copy on ``device`` (the same object when it is already there)."""
        if self.hidden.device == device:
            return self
        move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        return replace(
            self,
            mapped=False,
            prefix_keys=move(self.prefix_keys),
            prefix_values=move(self.prefix_values),
            prefix_hidden=self.prefix_hidden.to(device),
            keys=move(self.keys),
            values=move(self.values),
            hidden=self.hidden.to(device),
        )

    @property
    def nbytes(self) -> int:
        extra = [self.prefix_hidden, self.hidden] + ([] if self.word_ids is None else [self.word_ids])
        kv = self.prefix_keys + self.prefix_values + self.keys + self.values
        return tensors_nbytes(kv) + tensors_nbytes(extra)

    def leaf(self, index: int) -> LeafSlice:
        """Leaf ``index``'s prefix + piece, as the leaf layers left them."""
        span = self.plan.piece(index)
        P = self.plan.prefix_len
        n = span.stop - span.start

        def cat(prefix: torch.Tensor, whole: torch.Tensor, dim: int) -> torch.Tensor:
            return torch.cat([prefix, whole.narrow(dim, span.start, n)], dim=dim)

        return LeafSlice(
            keys=[cat(p, k, 2) for p, k in zip(self.prefix_keys, self.keys, strict=True)],
            values=[cat(p, v, 2) for p, v in zip(self.prefix_values, self.values, strict=True)],
            hidden=cat(self.prefix_hidden, self.hidden, 1),
            origin=torch.cat([torch.full((P,), -1), torch.arange(span.start, span.stop)]),
            position_ids=torch.arange(P + n),
        )

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and string metadata for ``safetensors.torch.save_file``."""
        tensors = {f"pk.{i}": t[0].contiguous() for i, t in enumerate(self.prefix_keys)}
        tensors |= {f"pv.{i}": t[0].contiguous() for i, t in enumerate(self.prefix_values)}
        tensors |= {f"k.{i}": t[0].contiguous() for i, t in enumerate(self.keys)}
        tensors |= {f"v.{i}": t[0].contiguous() for i, t in enumerate(self.values)}
        tensors["prefix_hidden"] = self.prefix_hidden[0].contiguous()
        tensors["hidden"] = self.hidden[0].contiguous()
        if self.word_ids is not None:
            tensors["word_ids"] = self.word_ids.contiguous()
        meta = {
            "format": SERIAL_FORMAT,
            "version": str(SERIAL_VERSION),
            "key": self.key,
            "leaf_layers": str(self.leaf_layers),
            "plan": json.dumps(plan_fields(self.plan)),
            "seconds": repr(self.seconds),
        }
        return tensors, meta

    @staticmethod
    def layout(
        plan: ChunkPlan,
        leaf_layers: int,
        kv_heads: int,
        head_dim: int,
        hidden_size: int,
        dtype: torch.dtype,
        words: bool,
    ) -> Layout:
        """Name -> (shape, dtype) of every tensor ``to_tensors`` gives for a tier of these dimensions
        (what ``named`` takes), so storage for a tier can be laid out before it is built."""
        P, L = plan.prefix_len, plan.document_len
        names: Layout = {"word_ids": ((L,), torch.long)} if words else {}
        for kind, n in (("pk", P), ("pv", P), ("k", L), ("v", L)):
            names |= {f"{kind}.{i}": ((kv_heads, n, head_dim), dtype) for i in range(leaf_layers)}
        return names | {"prefix_hidden": ((P, hidden_size), dtype), "hidden": ((L, hidden_size), dtype)}

    @classmethod
    def named(
        cls, tensors: dict[str, torch.Tensor], key: str, plan: ChunkPlan, leaf_layers: int, seconds: float = 0.0
    ) -> LeafTier:
        """The tier whose tensors are ``tensors`` under ``to_tensors``' names (views, not copies)."""
        return cls(
            key=key,
            plan=plan,
            leaf_layers=leaf_layers,
            prefix_keys=tuple(tensors[f"pk.{i}"][None] for i in range(leaf_layers)),
            prefix_values=tuple(tensors[f"pv.{i}"][None] for i in range(leaf_layers)),
            prefix_hidden=tensors["prefix_hidden"][None],
            keys=tuple(tensors[f"k.{i}"][None] for i in range(leaf_layers)),
            values=tuple(tensors[f"v.{i}"][None] for i in range(leaf_layers)),
            hidden=tensors["hidden"][None],
            word_ids=tensors.get("word_ids"),
            seconds=seconds,
        )

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> LeafTier:
        """Inverse of ``to_tensors``; raises ``ValueError`` on anything foreign, old or inconsistent."""
        if meta.get("format") != SERIAL_FORMAT:
            raise ValueError(f"not a leaf tier (format {meta.get('format')!r})")
        if meta.get("version") != str(SERIAL_VERSION):
            raise ValueError(f"leaf tier format version {meta.get('version')!r} is not {SERIAL_VERSION}")
        try:
            plan = ChunkPlan(**json.loads(meta["plan"]))
            tier = cls.named(tensors, meta["key"], plan, int(meta["leaf_layers"]), float(meta.get("seconds", "0")))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"incomplete leaf tier: {exc}") from exc
        tier.check()
        return tier

    def check(self) -> None:
        """Raise ``ValueError`` unless every tensor has the shape the plan implies."""
        P, L = self.plan.prefix_len, self.plan.document_len
        kv = self.keys + self.values
        pkv = self.prefix_keys + self.prefix_values
        if self.leaf_layers < 1 or len(self.keys) != self.leaf_layers or len(self.prefix_keys) != self.leaf_layers:
            raise ValueError(f"a leaf tier of {self.leaf_layers} layers holds {len(self.keys)}")
        if any(t.dim() != 4 or t.shape[2] != L for t in kv) or len({(t.shape[1], t.shape[3]) for t in kv + pkv}) != 1:
            raise ValueError(f"leaf tier K/V are not [1, Hkv, {L}, d] of one head layout")
        if any(t.shape[2] != P for t in pkv) or self.prefix_hidden.shape[1] != P or self.hidden.shape[1] != L:
            raise ValueError(f"leaf tier prefix/hidden lengths do not match the plan ({P} + {L} tokens)")
        if self.word_ids is not None and self.word_ids.shape != (L,):
            raise ValueError("leaf tier word ids do not cover the document")
        floats = [*kv, *pkv, self.hidden, self.prefix_hidden]
        if not all(t.dtype.is_floating_point and bool(torch.isfinite(t).all()) for t in floats):
            raise ValueError("leaf tier tensors hold NaN, infinite or non-float values")

    def validate(self, spec: CacheSpec) -> None:
        """Raise ``ValueError`` unless a model of ``spec`` can replay this tier (after ``check``)."""
        self.check()
        if self.leaf_layers >= spec.num_layers:
            raise ValueError(f"a leaf tier of {self.leaf_layers} layers for a model of {spec.num_layers}")
        want = (spec.num_kv_heads, spec.head_dim)
        for t in self.keys + self.values + self.prefix_keys + self.prefix_values:
            if (t.shape[1], t.shape[3]) != want or t.dtype != spec.dtype:
                raise ValueError(f"leaf tier K/V are {t.dtype} {tuple(t.shape)}, the model needs {spec.dtype} {want}")
        if self.plan.max_chunk_len != spec.max_positions:
            raise ValueError(f"leaf tier planned for max_chunk_len {self.plan.max_chunk_len}, not {spec.max_positions}")
