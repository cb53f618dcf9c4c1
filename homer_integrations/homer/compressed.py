"""``CompressedDocument``: a document's compressed K/V cache, its statistics, and its serial form."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch
from transformers import DynamicCache

from homer_integrations.homer.kv import cache_from_tensors, tensors_nbytes

SERIAL_FORMAT = "homer-compressed-document"
SERIAL_VERSION = 1


@dataclass(frozen=True)
class CompressionStats:
    """What one compression took and produced.

    ``peak_kv_bytes`` is the most K/V bytes alive at once while compressing (the tree's working
    set; model weights and activations not included).
    """

    document_tokens: int
    prompt_tokens: int
    cache_tokens: int
    cache_bytes: int
    seconds: float
    peak_kv_bytes: int
    tree_height: int
    leaves: int
    max_chunk_len: int

    @property
    def compression_ratio(self) -> float:
        return self.prompt_tokens / max(1, self.cache_tokens)


@dataclass(eq=False)
class CompressedDocument:
    """A document compressed once, answerable many times. Never mutated by answering.

    Attributes:
        key: the document-cache key (model, settings, calibration, mode, affixes, text).
        keys, values: per decoder layer, [1, Hkv, K, d] each.
        position_ids: [K] RoPE positions of the cached tokens.
        origin: [K] document token index of each cached token, -1 for prefix/suffix tokens.
        last_position: what follows the cache starts at ``last_position + 1``.
        next_token_logits: [V] logits after the last cached token (query-aware mode), else None.
        question: the question compressed into the suffix (query-aware mode), else None.
        stats: ``CompressionStats``.
    """

    key: str
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    position_ids: torch.Tensor
    origin: torch.Tensor
    last_position: int
    next_token_logits: torch.Tensor | None
    question: str | None
    stats: CompressionStats

    @property
    def num_tokens(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        return tensors_nbytes(self.keys) + tensors_nbytes(self.values)

    def to_cache(self, device: torch.device | None = None) -> DynamicCache:
        """A fresh ``DynamicCache`` over the stored tensors (moved to ``device`` if given, a copy then);
        decoding grows it without touching them."""
        if device is not None and self.keys[0].device != device:
            return cache_from_tensors([k.to(device) for k in self.keys], [v.to(device) for v in self.values])
        return cache_from_tensors(self.keys, self.values)

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and string metadata for ``safetensors.torch.save_file``."""
        tensors = {f"k.{i}": k[0].contiguous() for i, k in enumerate(self.keys)}
        tensors |= {f"v.{i}": v[0].contiguous() for i, v in enumerate(self.values)}
        tensors["position_ids"] = self.position_ids.contiguous()
        tensors["origin"] = self.origin.contiguous()
        if self.next_token_logits is not None:
            tensors["next_token_logits"] = self.next_token_logits.contiguous()
        meta = {
            "format": SERIAL_FORMAT,
            "version": str(SERIAL_VERSION),
            "key": self.key,
            "layers": str(len(self.keys)),
            "last_position": str(self.last_position),
            "question": json.dumps(self.question),
            "stats": json.dumps(asdict(self.stats)),
        }
        return tensors, meta

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> CompressedDocument:
        """Inverse of ``to_tensors``; raises ``ValueError`` on anything foreign, old or inconsistent."""
        if meta.get("format") != SERIAL_FORMAT:
            raise ValueError(f"not a compressed document (format {meta.get('format')!r})")
        if meta.get("version") != str(SERIAL_VERSION):
            raise ValueError(f"compressed document format version {meta.get('version')!r} is not {SERIAL_VERSION}")
        try:
            layers = int(meta["layers"])
            keys = tuple(tensors[f"k.{i}"][None] for i in range(layers))
            values = tuple(tensors[f"v.{i}"][None] for i in range(layers))
            stats = CompressionStats(**json.loads(meta["stats"]))
            doc = cls(
                key=meta["key"],
                keys=keys,
                values=values,
                position_ids=tensors["position_ids"],
                origin=tensors["origin"],
                last_position=int(meta["last_position"]),
                next_token_logits=tensors.get("next_token_logits"),
                question=json.loads(meta["question"]),
                stats=stats,
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"incomplete compressed document: {exc}") from exc
        lengths = {t.shape[2] for t in keys + values} | {doc.position_ids.numel(), doc.origin.numel()}
        if len(lengths) != 1:
            raise ValueError(f"inconsistent cache lengths {sorted(lengths)}")
        return doc
