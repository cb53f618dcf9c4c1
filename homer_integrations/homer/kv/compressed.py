"""``CompressedDocument``: a document's compressed K/V cache, its statistics, and its serial form."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from transformers import DynamicCache

from homer_integrations.homer.kv.dynamic import cache_from_tensors, tensors_nbytes
from homer_integrations.homer.kv.headwise import headwise_cache
from homer_integrations.homer.kv.kept import kept_cache

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
        keys, values: per decoder layer, [1, Hkv, K, d] each; in a head-wise root (``head_lengths``
            set) [n_l, d], head 0's tokens then head 1's ... (``kv.headwise``).
        position_ids: [K] RoPE positions of the cached tokens (head-wise: of the tokens some head keeps).
        origin: [K] document token index of each cached token, -1 for prefix/suffix tokens.
        last_position: what follows the cache starts at ``last_position + 1``.
        next_token_logits: [V] logits after the last cached token (query-aware mode), else None.
        question: the question compressed into the suffix (query-aware mode), else None.
        stats: ``CompressionStats``.
        head_lengths: [L, Hkv] tokens each layer's K/V heads keep (head-wise root), else None.
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
    head_lengths: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Cached tokens a head (head-wise: on average, rounded up; what the K/V bytes are worth)."""
        return cached_tokens(self.keys, self.head_lengths)

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

    def to_cache(
        self,
        device: torch.device | None = None,
        tail: int | None = None,
        attended: torch.Tensor | None = None,
        attended_from: int = 0,
        deferred: list[Callable[[], None]] | None = None,
    ) -> DynamicCache:
        """A fresh ``DynamicCache`` over the stored tensors (moved to ``device`` if given, a copy then);
        decoding grows it without touching them. ``tail``: the rows a question and its answer will add; a dense
        cache is then made of ``kept.KeptLayer`` s (no per-token copy of the stored K/V; the model must decode
        through the registered attention, ``kept.kept_decoding``), which add the attention each stored token
        receives in layers ``attended_from`` and up into ``attended`` [num_tokens] if given (the sums a fused read
        needs a product of its own for left in ``deferred`` if given: ``kept.kept_cache``)."""
        keys, values = self.keys, self.values
        if device is not None and keys[0].device != device:
            keys, values = [k.to(device) for k in keys], [v.to(device) for v in values]
        if self.head_lengths is not None:
            return headwise_cache(keys, values, self.head_lengths)
        if tail is not None:
            return kept_cache(keys, values, tail, attended, attended_from, deferred)
        return cache_from_tensors(keys, values)

    def to_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and string metadata for ``safetensors.torch.save_file``."""
        flat = self.head_lengths is not None
        tensors = {f"k.{i}": (k if flat else k[0]).contiguous() for i, k in enumerate(self.keys)}
        tensors |= {f"v.{i}": (v if flat else v[0]).contiguous() for i, v in enumerate(self.values)}
        if flat:
            tensors["head_lengths"] = self.head_lengths.contiguous()
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
        check_serial(meta, SERIAL_FORMAT, SERIAL_VERSION, "compressed document")
        try:
            layers = int(meta["layers"])
            head_lengths = tensors.get("head_lengths")
            lift = (lambda t: t) if head_lengths is not None else (lambda t: t[None])
            keys = tuple(lift(tensors[f"k.{i}"]) for i in range(layers))
            values = tuple(lift(tensors[f"v.{i}"]) for i in range(layers))
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
                head_lengths=head_lengths,
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"incomplete compressed document: {exc}") from exc
        check_layout(doc)
        return doc


@dataclass(frozen=True)
class CacheSpec:
    """What a model's compressed documents look like, to check documents read from disk against.

    K/V per layer: ``num_layers`` tensors [1, num_kv_heads, K, head_dim] of ``dtype``; position ids
    in [0, max_positions) (a tree or flat root keeps every position below ``max_chunk_len``, a root
    re-read by a prefill below the model's window); K <= ``max_tokens``
    (the final cache length) when known; next-token logits [vocab_size] when known.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    max_positions: int
    max_tokens: int | None = None
    vocab_size: int | None = None


def check_serial(meta: dict[str, str], fmt: str, version: int, what: str) -> None:
    """Raise ``ValueError`` unless safetensors metadata ``meta`` names format ``fmt`` at ``version`` (a ``what``)."""
    if meta.get("format") != fmt:
        raise ValueError(f"not a {what} (format {meta.get('format')!r})")
    if meta.get("version") != str(version):
        raise ValueError(f"{what} format version {meta.get('version')!r} is not {version}")


def cached_tokens(keys: tuple[torch.Tensor, ...] | list[torch.Tensor], head_lengths: torch.Tensor | None) -> int:
    """Tokens a head holds: K of dense [1, Hkv, K, d] keys, or the mean of ``head_lengths`` rounded up."""
    if head_lengths is None:
        return keys[0].shape[2]
    return -(-int(head_lengths.sum()) // max(1, head_lengths.numel()))


def check_layout(doc: CompressedDocument) -> None:
    """Raise ``ValueError`` unless the K/V tensors, positions and origins fit together: dense, every
    K/V [1, Hkv, K, d] of one shape with K positions and origins; head-wise, ``head_lengths`` [L, Hkv]
    integers >= 1 and layer l's K/V [sum(head_lengths[l]), d], one head_dim."""
    kv = doc.keys + doc.values
    lengths = doc.head_lengths
    if not kv:
        raise ValueError("the cache holds no layers")
    if doc.position_ids.shape != doc.origin.shape or doc.position_ids.dim() != 1:
        shapes = f"{tuple(doc.position_ids.shape)} positions, {tuple(doc.origin.shape)} origins"
        raise ValueError(f"inconsistent cache lengths: {shapes}")
    if lengths is None:
        if any(t.dim() != 4 for t in kv) or len({t.shape for t in kv}) != 1:
            raise ValueError("key/value tensors are not all [1, heads, tokens, head_dim] of one shape")
        if kv[0].shape[2] != doc.position_ids.numel():
            tokens, positions = kv[0].shape[2], doc.position_ids.numel()
            raise ValueError(f"inconsistent cache lengths: {tokens} cached tokens, {positions} positions")
        return
    if lengths.dtype not in _INTEGER_DTYPES or lengths.dim() != 2 or lengths.shape[0] != len(doc.keys):
        shape = tuple(lengths.shape)
        raise ValueError(f"head lengths are {lengths.dtype} {shape}, not [{len(doc.keys)} layers, heads]")
    if lengths.numel() == 0 or int(lengths.min()) < 1:
        raise ValueError("a head of the head-wise cache keeps no token")
    if any(t.dim() != 2 for t in kv) or len({t.shape[1] for t in kv}) != 1:
        raise ValueError("head-wise key/value tensors are not all [tokens, head_dim]")
    rows = lengths.sum(1).tolist()
    for layer, (k, v) in enumerate(zip(doc.keys, doc.values, strict=True)):
        if k.shape[0] != rows[layer] or v.shape[0] != rows[layer]:
            held = f"{k.shape[0]}/{v.shape[0]}"
            raise ValueError(f"layer {layer} holds {held} key/value rows, its heads keep {rows[layer]}")


def check_consistent(doc: CompressedDocument) -> None:
    """Model-independent sanity of ``doc``; raises ``ValueError`` with the reason.

    At least one cached token; finite K/V and logits; integer position ids >= 0 with
    ``last_position == position_ids.max()``; integer origins in [-1, document_tokens).
    """
    check_layout(doc)
    if doc.num_tokens < 1:
        raise ValueError("the cache holds no tokens")
    tokens = doc.position_ids.numel()
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
    check_consistent(doc)
    if doc.head_lengths is not None and doc.head_lengths.shape[1] != spec.num_kv_heads:
        raise ValueError(f"head lengths for {doc.head_lengths.shape[1]} K/V heads, the model has {spec.num_kv_heads}")
    for i, t in enumerate((*doc.keys, *doc.values)):
        want = (1, spec.num_kv_heads, doc.num_tokens, spec.head_dim)
        if doc.head_lengths is not None:
            want = (int(doc.head_lengths[i % len(doc.keys)].sum()), spec.head_dim)
        if tuple(t.shape) != want or t.dtype != spec.dtype:
            raise ValueError(f"a key/value tensor is {t.dtype} {tuple(t.shape)}, the model needs {spec.dtype} {want}")
    if doc.last_position >= spec.max_positions:
        raise ValueError(f"last_position {doc.last_position} is not below the position limit {spec.max_positions}")
    if spec.max_tokens is not None and doc.num_tokens > spec.max_tokens:
        raise ValueError(f"{doc.num_tokens} cached tokens, over the final cache length {spec.max_tokens}")
    logits = doc.next_token_logits
    if logits is not None and spec.vocab_size is not None and tuple(logits.shape) != (spec.vocab_size,):
        raise ValueError(f"next-token logits are {tuple(logits.shape)}, the vocabulary has {spec.vocab_size} tokens")
