"""``CompressedDocument``: a document's compressed K/V cache, its statistics, and its serial form."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

import torch
from transformers import DynamicCache

from homer_integrations.homer.kv import cache_from_tensors, tensors_nbytes

SERIAL_FORMAT = "homer-compressed-document"
SERIAL_VERSION = 1
_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


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

    @property
    def document_tokens(self) -> int:
        return self.stats.document_tokens

    def to(self, device: torch.device) -> CompressedDocument:
        """A copy on ``device`` (the same object when it is already there)."""
        if self.keys[0].device == device:
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(
            self,
            keys=tuple(map(move, self.keys)),
            values=tuple(map(move, self.values)),
            position_ids=move(self.position_ids),
            origin=move(self.origin),
            next_token_logits=move(self.next_token_logits),
        )

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


@dataclass(frozen=True)
class CacheSpec:
    """What a model's compressed documents look like, to check documents read from disk against.

    K/V per layer: ``num_layers`` tensors [1, num_kv_heads, K, head_dim] of ``dtype``; position ids
    in [0, max_positions) (HOMER keeps every position below ``max_chunk_len``); K <= ``max_tokens``
    (the final cache length) when known; next-token logits [vocab_size] when known.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    max_positions: int
    max_tokens: int | None = None
    vocab_size: int | None = None


def check_consistent(doc: CompressedDocument) -> None:
    """Model-independent sanity of ``doc``; raises ``ValueError`` with the reason.

    At least one cached token; finite K/V and logits; integer position ids >= 0 with
    ``last_position == position_ids.max()``; integer origins in [-1, document_tokens).
    """
    if not doc.keys or doc.keys[0].dim() != 4 or doc.num_tokens < 1:
        raise ValueError("the cache holds no tokens")
    tokens = doc.num_tokens
    for name, t in (("position ids", doc.position_ids), ("origins", doc.origin)):
        if t.dtype not in _INTEGER_DTYPES or t.shape != (tokens,):
            raise ValueError(f"{name} are {t.dtype} {tuple(t.shape)}, not {tokens} integers")
    low, high = int(doc.position_ids.min()), int(doc.position_ids.max())
    if low < 0 or doc.last_position != high:
        raise ValueError(f"positions span [{low}, {high}] but last_position is {doc.last_position}")
    low, high, limit = int(doc.origin.min()), int(doc.origin.max()), doc.stats.document_tokens
    if low < -1 or high >= limit:
        raise ValueError(f"origins span [{low}, {high}], outside [-1, {limit}) for {limit} document tokens")
    tensors = [*doc.keys, *doc.values]
    if doc.next_token_logits is not None:
        tensors.append(doc.next_token_logits)
    if not all(t.dtype.is_floating_point for t in tensors):
        raise ValueError("key/value tensors or logits are not floating point")
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise ValueError("key/value tensors or logits hold NaN or infinite values")


def validate(doc: CompressedDocument, spec: CacheSpec) -> None:
    """Raise ``ValueError`` naming the first way ``doc`` is not a document ``spec``'s model can use."""
    if len(doc.keys) != spec.num_layers or len(doc.values) != spec.num_layers:
        raise ValueError(f"{len(doc.keys)}/{len(doc.values)} key/value layers, the model has {spec.num_layers}")
    want = (1, spec.num_kv_heads, doc.num_tokens, spec.head_dim)
    for t in (*doc.keys, *doc.values):
        if tuple(t.shape) != want or t.dtype != spec.dtype:
            raise ValueError(f"a key/value tensor is {t.dtype} {tuple(t.shape)}, the model needs {spec.dtype} {want}")
    check_consistent(doc)
    if doc.last_position >= spec.max_positions:
        raise ValueError(f"last_position {doc.last_position} is not below max_chunk_len {spec.max_positions}")
    if spec.max_tokens is not None and doc.num_tokens > spec.max_tokens:
        raise ValueError(f"{doc.num_tokens} cached tokens, over the final cache length {spec.max_tokens}")
    logits = doc.next_token_logits
    if logits is not None and spec.vocab_size is not None and tuple(logits.shape) != (spec.vocab_size,):
        raise ValueError(f"next-token logits are {tuple(logits.shape)}, the vocabulary has {spec.vocab_size} tokens")
