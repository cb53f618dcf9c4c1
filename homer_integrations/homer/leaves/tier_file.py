"""A ``LeafTier``'s two file forms, as safetensors tensors and string metadata.

Whole (``whole_tensors``): every leaf layer's K/V over the whole document in one tensor [Hkv, L, d] (and
the hidden states [L, D]), each piece a view of its stretch once read back (``named``), so a tier built
into, or mapped from, one file is never copied. By its leaves (``head_tensors``): the prefix's tensors
and each leaf's content key; the pieces are ``leaf_entry.LeafEntry`` entries of their own, read back
through a ``piece`` function (``tier_from_tensors``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.compressed import check_serial
from homer_integrations.homer.leaves.leaf_tier import LeafPiece, LeafTier

SERIAL_FORMAT = "homer-leaf-tier"
SERIAL_VERSION = 1

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""Tensor name -> (shape, dtype): what a tier of given dimensions holds (``layout``)."""
Allocate = Callable[[Layout], "dict[str, torch.Tensor] | None"]
"""Storage for a tier about to be built: a tensor per name of the layout, uninitialised (views of a
file that will become the stored entry, say); None: the builder's default, process memory."""


def plan_fields(plan: ChunkPlan) -> dict:
    """``plan``'s fields for JSON; an even plan's without ``bounds``, as tiers stored before bounds existed."""
    fields = asdict(plan)
    if plan.bounds is None:
        del fields["bounds"]
    return fields


def metadata(tier: LeafTier) -> dict[str, str]:
    """The string metadata both forms carry."""
    return {
        "format": SERIAL_FORMAT,
        "version": str(SERIAL_VERSION),
        "key": tier.key,
        "leaf_layers": str(tier.leaf_layers),
        "plan": json.dumps(plan_fields(tier.plan)),
        "seconds": repr(tier.seconds),
    }


def prefix_tensors(tier: LeafTier) -> dict[str, torch.Tensor]:
    """The prefix's K/V (``pk.i``, ``pv.i`` [Hkv, P, d]) and hidden states [P, D], and the word ids [L]."""
    tensors = {f"pk.{i}": t[0].contiguous() for i, t in enumerate(tier.prefix_keys)}
    tensors |= {f"pv.{i}": t[0].contiguous() for i, t in enumerate(tier.prefix_values)}
    tensors["prefix_hidden"] = tier.prefix_hidden[0].contiguous()
    if tier.word_ids is not None:
        tensors["word_ids"] = tier.word_ids.contiguous()
    return tensors


def whole_tensors(tier: LeafTier) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The whole form: the tier's storage as it is, or pieces held apart joined into it."""
    if tier.storage is not None:
        return {name: t.contiguous() for name, t in tier.storage.items()}, metadata(tier)
    join = lambda ts, dim: torch.cat(list(ts), dim=dim)[0].contiguous()  # noqa: E731
    tensors = prefix_tensors(tier)
    for i in range(tier.leaf_layers):
        tensors[f"k.{i}"] = join((p.keys[i] for p in tier.pieces), 2)
        tensors[f"v.{i}"] = join((p.values[i] for p in tier.pieces), 2)
    tensors["hidden"] = join((p.hidden for p in tier.pieces), 1)
    return tensors, metadata(tier)


def head_tensors(tier: LeafTier) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The form by its leaves: the prefix's tensors, and metadata naming each leaf's content key in
    ``leaves`` (its piece stored apart under that key)."""
    if tier.leaf_keys is None or len(tier.leaf_keys) != len(tier.pieces):
        raise ValueError("a tier without a content key for each leaf is stored whole")
    return prefix_tensors(tier), metadata(tier) | {"leaves": json.dumps(list(tier.leaf_keys))}


def layout(
    plan: ChunkPlan, leaf_layers: int, kv_heads: int, head_dim: int, hidden_size: int, dtype: torch.dtype, words: bool
) -> Layout:
    """Name -> (shape, dtype) of every tensor of the whole form of a tier of these dimensions (what ``named``
    takes), so storage for a tier can be laid out before it is built."""
    P, L = plan.prefix_len, plan.document_len
    names: Layout = {"word_ids": ((L,), torch.long)} if words else {}
    for kind, n in (("pk", P), ("pv", P), ("k", L), ("v", L)):
        names |= {f"{kind}.{i}": ((kv_heads, n, head_dim), dtype) for i in range(leaf_layers)}
    return names | {"prefix_hidden": ((P, hidden_size), dtype), "hidden": ((L, hidden_size), dtype)}


def named(
    tensors: dict[str, torch.Tensor], key: str, plan: ChunkPlan, leaf_layers: int, seconds: float = 0.0
) -> LeafTier:
    """The tier whose whole form is ``tensors``, each piece a view of its stretch of the document (nothing
    copied); raises ``ValueError`` if they do not cover the document."""
    L = plan.document_len
    whole = [tensors[f"{kind}.{i}"] for kind in "kv" for i in range(leaf_layers)]
    if any(t.dim() != 3 or t.shape[1] != L for t in whole) or tensors["hidden"].dim() != 2:
        raise ValueError(f"leaf tier K/V are not [Hkv, {L}, d] of one head layout")
    pieces = tuple(
        LeafPiece(
            keys=tuple(tensors[f"k.{i}"][None, :, span] for i in range(leaf_layers)),
            values=tuple(tensors[f"v.{i}"][None, :, span] for i in range(leaf_layers)),
            hidden=tensors["hidden"][None, span],
        )
        for span in map(plan.piece, range(plan.num_leaves))
    )
    return LeafTier(
        key=key,
        plan=plan,
        leaf_layers=leaf_layers,
        prefix_keys=tuple(tensors[f"pk.{i}"][None] for i in range(leaf_layers)),
        prefix_values=tuple(tensors[f"pv.{i}"][None] for i in range(leaf_layers)),
        prefix_hidden=tensors["prefix_hidden"][None],
        pieces=pieces,
        word_ids=tensors.get("word_ids"),
        seconds=seconds,
        storage=tensors,
    )


def tier_from_tensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, str], piece: Callable[[str], LeafPiece] | None = None
) -> LeafTier:
    """Inverse of ``whole_tensors`` and ``head_tensors`` (whose pieces ``piece(content key)`` gives, raising
    what it raises); raises ``ValueError`` on anything foreign, old or inconsistent."""
    check_serial(meta, SERIAL_FORMAT, SERIAL_VERSION, "leaf tier")
    try:
        plan = ChunkPlan(**json.loads(meta["plan"]))
        layers, seconds = int(meta["leaf_layers"]), float(meta.get("seconds", "0"))
        if "leaves" not in meta:
            tier = named(tensors, meta["key"], plan, layers, seconds)
        else:
            keys = json.loads(meta["leaves"])
            if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
                raise ValueError("its leaves are not a list of content keys")
            if piece is None:
                raise ValueError("the tier is stored by its leaves and nothing reads them here")
            tier = LeafTier(
                key=meta["key"],
                plan=plan,
                leaf_layers=layers,
                prefix_keys=tuple(tensors[f"pk.{i}"][None] for i in range(layers)),
                prefix_values=tuple(tensors[f"pv.{i}"][None] for i in range(layers)),
                prefix_hidden=tensors["prefix_hidden"][None],
                pieces=tuple(piece(k) for k in keys),
                word_ids=tensors.get("word_ids"),
                seconds=seconds,
                leaf_keys=tuple(keys),
            )
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"incomplete leaf tier: {exc}") from exc
    tier.check()
    return tier
