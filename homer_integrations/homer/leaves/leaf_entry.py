"""``LeafEntry``: one leaf's piece kept on its own under its content key, shared by every tier that holds it.

A leaf's K/V and hidden states depend only on the model, the settings, the prefix and the leaf's own
tokens (``leaf_reuse``), so a leaf is named by a content key and stored once, however many documents
(or versions of one) hold it. A tier stored by its leaves (``LeafTier.leaf_keys``) then keeps only its
prefix and the list of its leaves' keys; its pieces are these entries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from homer_integrations.homer.kv.compressed import CacheSpec, check_serial
from homer_integrations.homer.kv.dynamic import tensors_nbytes
from homer_integrations.homer.leaves.leaf_tier import LeafPiece

SERIAL_FORMAT = "homer-leaf-piece"
SERIAL_VERSION = 1


@dataclass(eq=False)
class LeafEntry:
    """Leaf piece ``piece`` (per leaf layer K/V [1, Hkv, n, d], hidden [1, n, D]) under content key ``key``.

    ``mapped``: its tensors are views of a memory-mapped cache file."""

    key: str
    piece: LeafPiece
    seconds: float = 0.0
    mapped: bool = False

    @property
    def num_tokens(self) -> int:
        return self.piece.length

    @property
    def document_tokens(self) -> int:
        return self.piece.length

    @property
    def nbytes(self) -> int:
        return tensors_nbytes((*self.piece.keys, *self.piece.values, self.piece.hidden))

    @property
    def dtype(self) -> torch.dtype:
        return self.piece.hidden.dtype

    @property
    def device(self) -> torch.device:
        return self.piece.hidden.device

    def to(self, device: torch.device) -> LeafEntry:
        """A copy on ``device`` (the same object when it is already there)."""
        if self.device == device:
            return self
        move = lambda ts: tuple(t.to(device) for t in ts)  # noqa: E731
        piece = LeafPiece(move(self.piece.keys), move(self.piece.values), self.piece.hidden.to(device))
        return replace(self, piece=piece, mapped=False)

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors (``k.i``, ``v.i`` [Hkv, n, d], ``hidden`` [n, D]) and string metadata for safetensors."""
        tensors = {f"k.{i}": t[0].contiguous() for i, t in enumerate(self.piece.keys)}
        tensors |= {f"v.{i}": t[0].contiguous() for i, t in enumerate(self.piece.values)}
        tensors["hidden"] = self.piece.hidden[0].contiguous()
        meta = {
            "format": SERIAL_FORMAT,
            "version": str(SERIAL_VERSION),
            "key": self.key,
            "leaf_layers": str(len(self.piece.keys)),
            "seconds": repr(self.seconds),
        }
        return tensors, meta

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> LeafEntry:
        """Inverse of ``to_tensors`` (views, not copies); raises ``ValueError`` on anything foreign or inconsistent."""
        check_serial(meta, SERIAL_FORMAT, SERIAL_VERSION, "leaf piece")
        try:
            layers = int(meta["leaf_layers"])
            expected = {f"{kind}.{i}" for kind in "kv" for i in range(layers)} | {"hidden"}
            if layers < 1 or set(tensors) != expected:
                raise ValueError(f"unexpected tensors {sorted(set(tensors) ^ expected)[:4]} for {layers} layers")
            piece = LeafPiece(
                keys=tuple(tensors[f"k.{i}"][None] for i in range(layers)),
                values=tuple(tensors[f"v.{i}"][None] for i in range(layers)),
                hidden=tensors["hidden"][None],
            )
            entry = cls(key=meta["key"], piece=piece, seconds=float(meta.get("seconds", "0")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"incomplete leaf piece: {exc}") from exc
        entry.check()
        return entry

    def check(self) -> None:
        """Raise ``ValueError`` unless K/V are [1, Hkv, n, d] of one layout, hidden [1, n, D], all finite."""
        piece = self.piece
        kv = piece.keys + piece.values
        if piece.hidden.dim() != 3 or any(t.dim() != 4 or t.shape[2] != piece.length for t in kv):
            raise ValueError(f"leaf piece K/V are not [1, Hkv, {piece.length}, d] beside hidden states of its length")
        if len({(t.shape[1], t.shape[3], t.dtype) for t in kv}) != 1:
            raise ValueError("leaf piece K/V are not of one head layout and dtype")
        if not all(t.dtype.is_floating_point and bool(torch.isfinite(t).all()) for t in (*kv, piece.hidden)):
            raise ValueError("leaf piece tensors hold NaN, infinite or non-float values")

    def validate(self, spec: CacheSpec) -> None:
        """Raise ``ValueError`` unless a model of ``spec`` can read this piece (after ``check``)."""
        self.check()
        t = self.piece.keys[0]
        if (t.shape[1], t.shape[3], t.dtype) != (spec.num_kv_heads, spec.head_dim, spec.dtype):
            raise ValueError(
                f"leaf piece K/V are {t.dtype} {tuple(t.shape)}, the model needs {spec.dtype} "
                f"({spec.num_kv_heads}, {spec.head_dim})"
            )
        if len(self.piece.keys) > spec.num_layers:
            raise ValueError(f"a leaf piece of {len(self.piece.keys)} layers for a model of {spec.num_layers}")
