"""``HomerModel``: the one engine object. It owns the model, the tokenizer and the document cache.

Everything above it (CLI, LangChain, LlamaIndex) calls these methods; nothing below it knows
any framework.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.cache.keys import DocumentKeys
from homer_integrations.cache.store import Store
from homer_integrations.document_cache import CacheSource, DocumentCache
from homer_integrations.homer.calibration import Calibration, CalibrationStore
from homer_integrations.homer.compressed import CacheSpec, CompressedDocument, CompressionStats
from homer_integrations.homer.compressor import CompressionResult, CompressorSettings, PruneObserver
from homer_integrations.homer.config import HomerConfig, Mode, ModelDefaults, check_mode
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.fingerprint import tokenizer_fingerprint, weights_fingerprint
from homer_integrations.homer.generation import DecodeState, FinishReason, GenerationOptions, decode
from homer_integrations.homer.leaf_tier import LeafTier
from homer_integrations.homer.prompt import (
    PromptText,
    PromptTexts,
    encode,
    markup,
    render_chat,
    render_layout,
    unit_ids,
)
from homer_integrations.homer.replay import TierCompressor
from homer_integrations.homer.scoring import REPEAT_PROMPT, Scoring
from homer_integrations.models import DEFAULT_MODEL, embedded_defaults, load_model
from homer_integrations.paths import PACKAGE_DATA, cache_root
from homer_integrations.quantization import Quantization

logger = logging.getLogger(__name__)

ALGORITHM_VERSION = 1
"""Bumped whenever compression changes its output for the same settings: old cache entries then miss."""


@dataclass
class AnswerInfo:
    """What one answer cost and where its cache came from; complete once the stream is exhausted.

    ``cache_source`` is ``memory``, ``disk`` or ``computed`` for answers over a document, None
    for plain prompts. ``input_tokens`` are the tokens fed after the cache (question, chat
    turns); ``document_tokens`` the tokens the cache stands for. ``mode`` says which tier served:
    ``shared`` (the one compressed root) or ``query_aware`` (pruning and the upper levels replayed
    from the leaf tier with this question). ``compress_seconds`` is everything before the question
    was fed (lookups, compression or replay); ``document_seconds`` the part of it spent computing
    the cached entry (the shared root or the leaf tier), 0 when it came from the cache.
    """

    cache_source: CacheSource | None = None
    document_tokens: int = 0
    cache_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: FinishReason | None = None
    compression: CompressionStats | None = None
    compress_seconds: float = 0.0
    time_to_first_token: float | None = None
    total_seconds: float = 0.0
    mode: Mode | None = None
    document_seconds: float = 0.0


class AnswerStream(Iterator[str]):
    """Text pieces of an answer; ``info`` is complete once iteration ends."""

    def __init__(self, pieces: Iterator[str], info: AnswerInfo, state: DecodeState, started: float) -> None:
        self._pieces = pieces
        self.info = info
        self._state = state
        self._started = started

    def __next__(self) -> str:
        try:
            return next(self._pieces)
        except StopIteration:
            self.info.output_tokens = len(self._state.token_ids)
            self.info.finish_reason = self._state.finish_reason
            if self._state.first_token_seconds is not None and self.info.time_to_first_token is None:
                self.info.time_to_first_token = self.info.compress_seconds + self._state.first_token_seconds
            self.info.total_seconds = time.perf_counter() - self._started
            raise

    def text(self) -> str:
        """Consume the stream and return the whole answer."""
        return "".join(self)


class HomerModel:
    """A local causal LM that answers questions about whole long documents through HOMER.

    Args:
        model, tokenizer: a ``*ForCausalLM`` of a supported family (``homer.architectures``: Llama,
            Mistral, Qwen2/3, Phi-3, Gemma-3 text) and its tokenizer.
        config: ``HomerConfig``; unset fields take this model's defaults.
        model_name: reported to frameworks (``response_metadata["model_name"]`` etc.).
        document_cache: where compressed documents live (default: in memory, 2 GiB).
        store: instead of ``document_cache``: a directory or a URL fsspec knows (``s3://bucket/prefix``)
            that holds compressed documents for every process with the same model and settings.
        disk_budget: most bytes a local ``store`` keeps (least recently used go first); alone, it
            turns on the default local directory.
        progress: show progress bars for compression and calibration.
        scoring: what pruning ranks by (default: ``Scoring.from_config(config)``, the package's
            recipe; shared roots then use ``with_reconstruction`` when ``shared_scorer`` says so);
            for research and the ablations in ``benchmarks/``. It is part of every cache key, and
            query-aware compressions use its ``with_question()``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: HomerConfig | None = None,
        *,
        model_name: str | None = None,
        defaults: ModelDefaults | None = None,
        document_cache: DocumentCache | None = None,
        calibration_dir: Path | None = None,
        progress: bool | None = None,
        scoring: Scoring | None = None,
        store: str | Path | Store | None = None,
        disk_budget: int | None = None,
    ) -> None:
        if document_cache is not None and (store is not None or disk_budget is not None):
            raise ValueError("pass document_cache= or store=/disk_budget=, not both")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stack = DecoderStack(model)  # raises UnsupportedModelError first
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
        max_positions = int(getattr(model.config, "max_position_embeddings", 4096))
        defaults = (
            defaults or embedded_defaults(model_name) or ModelDefaults.for_model(self.stack.num_layers, max_positions)
        )
        self.config = (config or HomerConfig()).resolve(self.stack.num_layers, max_positions, defaults)
        recipe = scoring or Scoring.from_config(self.config)
        self.question_scoring = recipe.with_question()
        """What query-aware compressions (the question in the suffix) prune by."""
        self.scoring = recipe
        """What shared compressions prune by."""
        if scoring is None and self.config.shared_scorer == "reconstruction":
            self.scoring = recipe.with_reconstruction(encode(tokenizer, REPEAT_PROMPT))
        self.context_window = max_positions
        self.document_cache = DocumentCache.open(store, disk_budget) if document_cache is None else document_cache
        self.progress = progress
        store = CalibrationStore(
            calibration_dir or cache_root() / "calibration", bundled_dir=PACKAGE_DATA / "calibration"
        )
        self.calibration = Calibration(
            store,
            self.stack,
            self.config.max_chunk_len,
            self.config.calibration_segments,
            tokenizer,
            needed=self.scoring.needs_calibration,
        )
        """The pruning bias table for this model and settings (``bias()``: computed once, then cached on disk)."""
        c = self.config
        identity = {
            "algorithm": ALGORITHM_VERSION,
            "model": weights_fingerprint(model),
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "dtype": str(self.stack.dtype),
        }
        root = {
            "settings": c.model_dump(mode="json", exclude={"mode", "reask_question", "replay"}),
            "scoring": repr(self.scoring),
            "calibration": self.calibration.id,
        }
        tier = {
            "settings": {
                "kind": "leaf_tier",
                "max_chunk_len": c.max_chunk_len,
                "warmup_layers": c.warmup_layers,
                "document_suffix": c.document_suffix,  # the split is planned for the shared suffix's length
                "unit": self.question_scoring.unit,
            }
        }
        self.keys = DocumentKeys(identity, root, tier)
        """Document-cache keys of this engine's entries (``root``, ``full``, ``tier``)."""
        self.prune_observer: PruneObserver | None = None
        """Diagnostics: called with every node's ``PruneEvent`` during compressions computed from now on."""

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | None = None,
        *,
        config: HomerConfig | None = None,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device | None = None,
        document_cache: DocumentCache | None = None,
        progress: bool | None = None,
        store: str | Path | Store | None = None,
        disk_budget: int | None = None,
        quantize: Quantization | None = None,
        **model_kwargs: Any,
    ) -> HomerModel:
        """Load a model by local path, hub id or embedded name (None = the embedded default model).

        ``quantize="int8"``: int8 linear layers on the CPU (faster decoding; see README "int8 on CPU").
        """
        name = path_or_id or DEFAULT_MODEL
        model, tokenizer = load_model(name, dtype=dtype, device=device, quantize=quantize, **model_kwargs)
        return cls(
            model,
            tokenizer,
            config,
            model_name=name,
            document_cache=document_cache,
            progress=progress,
            store=store,
            disk_budget=disk_budget,
        )

    def with_store(self, store: str | Path | Store, disk_budget: int | None = None) -> HomerModel:
        """An engine over this one's loaded model and settings (same cache keys) whose documents
        live in ``store``."""
        other = copy.copy(self)
        other.document_cache = DocumentCache.open(store, disk_budget)
        return other

    # ----------------------------------------------------------------------------- helpers
    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return len(self.token_ids(text))

    def token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return encode(self.tokenizer, text).tolist()

    def max_document_tokens(self, prefix_tokens: int = 0, suffix_tokens: int = 0) -> int:
        """Most document tokens the merge tree can hold: a tree of height h needs h + 1 layers, so at
        most ``2**(num_layers - 1)`` leaves of ``max_chunk_len - prefix_tokens - suffix_tokens`` tokens."""
        return max(0, self.config.max_chunk_len - prefix_tokens - suffix_tokens) * 2 ** (self.stack.num_layers - 1)

    @functools.cached_property
    def max_document_chars(self) -> int:
        """A document longer than this many characters surely has more tokens than the merge tree holds.

        The bound is ``max_document_tokens() * 4 * longest_token``: no token stands for more characters
        than its vocabulary entry spells (``longest_token`` is the longest entry; byte-level and
        sentencepiece spellings are never shorter than their text), and the factor 4 leaves room for
        normalisers that compose characters. Texts over it are refused before they are tokenized.
        """
        longest = max(map(len, self.tokenizer.get_vocab()), default=1)
        return self.max_document_tokens() * 4 * max(1, longest)

    def _check_document_length(self, document: str) -> None:
        if len(document) > self.max_document_chars:
            raise ValueError(
                f"the document has {len(document):,} characters, far more than this model's merge tree can "
                f"hold ({self.max_document_tokens():,} tokens at max_chunk_len={self.config.max_chunk_len} over "
                f"{self.stack.num_layers} layers); split it, or raise max_chunk_len"
            )

    def layout(self, question: str = "", mode: Mode | None = None) -> PromptTexts:
        """Prefix / suffix / continuation texts around the document for ``question`` in ``mode``
        (default: the configured one)."""
        c = self.config
        query_aware = (check_mode(mode) or c.mode) == "query_aware"
        return render_layout(
            self.tokenizer, question, c.document_suffix, query_aware, c.system_prompt, c.reask_question
        )

    @property
    def cache_spec(self) -> CacheSpec:
        """What this model's compressed documents look like; disk cache entries are checked against it."""
        head = self.model.get_output_embeddings()
        return CacheSpec(
            num_layers=self.stack.num_layers,
            num_kv_heads=self.stack.num_kv_heads,
            head_dim=self.stack.head_dim,
            dtype=self.stack.dtype,
            max_positions=self.config.max_chunk_len,
            max_tokens=self.config.final_cache_len,
            vocab_size=getattr(head, "out_features", None),
        )

    @property
    def _full_cache_spec(self) -> CacheSpec:
        """``cache_spec`` for ``full`` entries: uncompressed, positions and length up to the model's window."""
        return replace(self.cache_spec, max_positions=self.context_window, max_tokens=self.context_window)

    # ----------------------------------------------------------------------------- compression
    def compress_span(
        self, prefix: str, document: str, suffix: str, question: str | None = None, *, mode: Mode | None = None
    ) -> tuple[CompressedDocument, CacheSource]:
        """Compress prefix + document + suffix texts; returns the document and where its cached part came from.

        ``mode`` (default: ``query_aware`` when a ``question`` is given, else ``shared``):
        ``shared`` is the compressed root, cached under its key; ``full`` the uncompressed cache of
        the whole prompt (a plain prefill kept like a root; the prompt must fit the model's window);
        ``query_aware`` (``suffix`` holds ``question``) looks up or builds the document's leaf tier
        once and replays pruning and the upper levels with this suffix (the replayed root is not
        cached; the source reported is the tier's).
        """
        doc, source, _ = self._compress(prefix, document, suffix, question, mode)
        return doc, source

    def _compress(
        self, prefix: str, document: str, suffix: str, question: str | None, mode: Mode | None = None
    ) -> tuple[CompressedDocument, CacheSource, float]:
        """``compress_span``, plus the seconds spent computing the cached entry (0 when it was cached)."""
        if not document or not document.strip():
            raise ValueError("the document is empty")
        self._check_document_length(document)
        mode = check_mode(mode) or ("query_aware" if question is not None else "shared")
        if mode == "query_aware":
            if question is None:
                raise ValueError("query_aware mode compresses the question with the document: pass question=")
            tier, source = self.leaf_tier(prefix, document)
            return self._replay(tier, suffix, question), source, tier.seconds if source == "computed" else 0.0
        full = mode == "full"
        key = self.keys.root(prefix, document, suffix) if not full else self.keys.full(prefix, document, suffix)
        doc, source = self.document_cache.get_or_compute(
            key,
            lambda: self._compress_now(key, prefix, document, suffix, full=full),
            spec=self._full_cache_spec if full else self.cache_spec,
        )
        return doc, source, doc.stats.seconds if source == "computed" else 0.0

    def compress(self, text: str, *, question: str | None = None, mode: Mode | None = None) -> CompressedDocument:
        """Compress a whole document (the shared root is cached). ``question`` is required in query-aware mode."""
        mode = mode or self.config.mode
        if mode == "query_aware" and question is None:
            raise ValueError("query_aware mode compresses the question with the document: pass question=")
        layout = self.layout(question or "", mode)
        asked = question if mode == "query_aware" else None
        doc, _ = self.compress_span(layout.prefix, text, layout.suffix, asked, mode=mode)
        return doc

    def leaf_tier(self, prefix: str, document: str) -> tuple[LeafTier, CacheSource]:
        """The document's leaf tier (cached like a root): what every query-aware question replays from."""
        key = self.keys.tier(prefix, document)
        return self.document_cache.get_or_compute(
            key, lambda: self._build_tier(key, prefix, document), spec=self.cache_spec
        )

    def _encode_span(
        self, prefix: str, document: str, suffix: str, *, full: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids of the three spans; a document the merge tree (or, ``full``, the window) cannot
        hold is refused here, before calibration or any layer runs."""
        prefix_ids = encode(self.tokenizer, prefix, first=True, formatted=True)
        document_ids = encode(self.tokenizer, document)
        suffix_ids = encode(self.tokenizer, suffix, formatted=True)
        prompt_len = prefix_ids.numel() + document_ids.numel() + suffix_ids.numel()
        if full and prompt_len >= self.context_window:
            raise ValueError(
                f"mode='full' keeps the whole prompt uncompressed, but it has {prompt_len:,} tokens, over the "
                f"model's {self.context_window:,}-token window; use mode='shared' or 'query_aware'"
            )
        if full:
            return prefix_ids, document_ids, suffix_ids
        limit = self.max_document_tokens(prefix_ids.numel(), suffix_ids.numel())
        if document_ids.numel() > limit:  # before calibration or any layer runs
            raise ValueError(
                f"the document has {document_ids.numel():,} tokens, more than this model's merge tree can hold "
                f"({limit:,} at max_chunk_len={self.config.max_chunk_len} over {self.stack.num_layers} layers); "
                f"split it, or raise max_chunk_len"
            )
        return prefix_ids, document_ids, suffix_ids

    def _compressor(self, prunes: bool, *, query_aware: bool, full: bool = False) -> TierCompressor:
        """A compressor with this engine's settings; ``prunes``: the calibration bias is needed;
        ``query_aware``: planned like a leaf tier, scoring with the question in the suffix; ``full``:
        one chunk as long as the model's window, nothing pruned (a plain prefill)."""
        c = self.config
        settings = CompressorSettings(
            max_chunk_len=self.context_window if full else c.max_chunk_len,
            warmup_layers=c.warmup_layers,
            final_cache_len=self.context_window if full else c.final_cache_len,
            scoring=self.question_scoring if query_aware else self.scoring,
            suffix_reserve=self._planned_suffix_len() if query_aware else 0,
            want_logits=query_aware and not c.reask_question,
        )
        return TierCompressor(
            self.stack,
            settings,
            self.calibration.bias(progress=self.progress is not False) if prunes else None,
            self.prune_observer,
        )

    def _planned_suffix_len(self) -> int:
        """Suffix tokens a leaf tier's split is planned for: the shared suffix's, so the tier splits the
        document exactly as the shared root does and no question changes the tree's shape (a question's
        longer suffix makes merged nodes that many tokens longer than ``max_chunk_len``, still far inside
        the model's window; planning for a longer suffix made taller trees of half-empty leaves that
        scored lower, see README)."""
        return encode(self.tokenizer, self.layout("", "shared").suffix, formatted=True).numel()

    def _words(self, document: str, document_ids: torch.Tensor, scoring: Scoring) -> torch.Tensor | None:
        """Unit index of every document token for ``scoring``'s units (None: score single tokens)."""
        words = unit_ids(self.tokenizer, document, scoring.unit)
        if words is not None and words.numel() != document_ids.numel():
            return None  # tokenizer without offsets that line up: fall back to token scores
        return words

    def _progress(self, total: int, desc: str) -> tqdm:
        return tqdm(
            total=total,
            desc=desc,
            unit="tok",
            unit_scale=True,
            disable=True if self.progress is False else None,
            leave=False,
        )

    def _compress_now(
        self, key: str, prefix: str, document: str, suffix: str, *, full: bool = False
    ) -> CompressedDocument:
        prefix_ids, document_ids, suffix_ids = self._encode_span(prefix, document, suffix, full=full)
        prompt_len = prefix_ids.numel() + document_ids.numel() + suffix_ids.numel()
        prunes = not full and prompt_len > self.config.final_cache_len
        compressor = self._compressor(prunes, query_aware=False, full=full)
        with self._progress(document_ids.numel(), "HOMER compress") as bar:
            words = self._words(document, document_ids, self.scoring) if prunes else None
            compress = (
                compressor.compress_flat if self.config.shared_root == "flat" and not full else compressor.compress
            )
            result = compress(prefix_ids, document_ids, suffix_ids, progress=bar.update, word_ids=words)
        doc = self._document(key, result, prompt_len, None)
        logger.info(
            "compressed %d document tokens into %d cache tokens in %.1fs (tree height %d)",
            doc.stats.document_tokens,
            doc.stats.cache_tokens,
            doc.stats.seconds,
            doc.stats.tree_height,
        )
        return doc

    def _build_tier(self, key: str, prefix: str, document: str) -> LeafTier:
        prefix_ids, document_ids, _ = self._encode_span(prefix, document, "")
        compressor = self._compressor(False, query_aware=True)
        with self._progress(document_ids.numel(), "HOMER leaf tier") as bar:
            tier = compressor.build_leaf_tier(
                prefix_ids,
                document_ids,
                self._words(document, document_ids, self.question_scoring),
                key=key,
                progress=bar.update,
                allocate=self.document_cache.allocator(key) if self.stack.device.type == "cpu" else None,
            )
        logger.info(
            "leaf tier of %d document tokens: %d leaves x %d layers, %.1f MB, %.1fs",
            tier.document_tokens,
            tier.plan.num_leaves,
            tier.leaf_layers,
            tier.nbytes / 1e6,
            tier.seconds,
        )
        return tier

    def _replay(self, tier: LeafTier, suffix: str, question: str) -> CompressedDocument:
        """The query-aware compression of the tier's document with ``suffix`` (which holds ``question``)."""
        suffix_ids = encode(self.tokenizer, suffix, formatted=True)
        prompt_len = tier.num_tokens + suffix_ids.numel()
        compressor = self._compressor(prompt_len > self.config.final_cache_len, query_aware=True)
        replay = compressor.replay_flat if self.config.replay == "flat" else compressor.replay
        result = replay(tier.to(self.stack.device), suffix_ids)
        key = hashlib.sha256(f"{tier.key}\0{json.dumps(markup(suffix).segments)}".encode()).hexdigest()
        return self._document(key, result, prompt_len, question)

    def _document(
        self, key: str, result: CompressionResult, prompt_len: int, question: str | None
    ) -> CompressedDocument:
        stats = CompressionStats(
            document_tokens=result.plan.document_len,
            prompt_tokens=prompt_len,
            cache_tokens=result.keys[0].shape[2],
            cache_bytes=sum(t.numel() * t.element_size() for t in result.keys + result.values),
            seconds=result.seconds,
            peak_kv_bytes=result.peak_kv_bytes,
            tree_height=result.plan.height,
            leaves=result.plan.num_leaves,
            max_chunk_len=result.plan.max_chunk_len,
        )
        return CompressedDocument(
            key=key,
            keys=tuple(result.keys),
            values=tuple(result.values),
            position_ids=result.position_ids,
            origin=result.origin,
            last_position=result.last_position,
            next_token_logits=result.next_token_logits,
            question=question,
            stats=stats,
        )

    # ----------------------------------------------------------------------------- answering
    def _continue_from(
        self,
        document: CompressedDocument,
        continuation: str,
        options: GenerationOptions | None = None,
        *,
        cache_source: CacheSource | None = None,
        compress_seconds: float = 0.0,
    ) -> AnswerStream:
        """Feed ``continuation`` after a compressed document and stream the answer."""
        started = time.perf_counter() - compress_seconds
        options = options or GenerationOptions()
        ids = encode(self.tokenizer, continuation, formatted=True)
        if ids.numel() == 0 and document.next_token_logits is None:
            raise ValueError("nothing follows the document: give a question or use query_aware mode")
        info = AnswerInfo(
            cache_source=cache_source,
            document_tokens=document.stats.document_tokens,
            cache_tokens=document.num_tokens,
            input_tokens=ids.numel(),
            compression=document.stats,
            compress_seconds=compress_seconds,
        )
        state = DecodeState()
        pieces = decode(
            self.model,
            self.tokenizer,
            document.to_cache(),
            ids,
            document.last_position + 1,
            options,
            state,
            first_logits=document.next_token_logits if ids.numel() == 0 else None,
        )
        return AnswerStream(pieces, info, state, started)

    def run(
        self, document: str | CompressedDocument, question: str, *, mode: Mode | None = None, **generation: Any
    ) -> AnswerStream:
        """Answer ``question`` about ``document`` (text or a ``CompressedDocument``), streaming.

        ``mode`` picks the tier for this call (default: ``config.mode``): ``shared`` answers from
        the document's one compressed root; ``query_aware`` replays pruning and the upper levels
        from the document's leaf tier with the question in the suffix (the paper's question-aware
        compression, without re-running the leaves over the document after the first question).
        ``generation``: ``GenerationOptions`` fields; ``response_format=`` (a JSON schema dict, a
        pydantic class or TypedDict, a compiled regex, a list of choices) constrains the answer.
        """
        options = GenerationOptions(**generation)
        if not question or not question.strip():
            raise ValueError("the question is empty")
        mode = check_mode(mode) or self.config.mode
        layout = self.layout(question, mode)
        if not isinstance(document, CompressedDocument):
            asked = question if mode == "query_aware" else None
            return self.answer_span(
                layout.prefix, document, layout.suffix, layout.continuation, options, question=asked, mode=mode
            )
        if document.question is not None and document.question != question:
            raise ValueError(
                "this document was compressed query-aware for another question; compress it again "
                "with this question, or use shared mode to reuse one cache for every question"
            )
        stream = self._continue_from(document, layout.continuation, options)
        full = document.stats.max_chunk_len == self.context_window and document.stats.tree_height == 0
        stream.info.mode = "query_aware" if document.question is not None else "full" if full else "shared"
        return stream

    def answer_span(
        self,
        prefix: str,
        document: str,
        suffix: str,
        continuation: str,
        options: GenerationOptions | None = None,
        *,
        question: str | None = None,
        mode: Mode | None = None,
    ) -> AnswerStream:
        """Compress (or fetch) prefix + document + suffix in ``mode`` (see ``compress_span``) and stream
        the answer to ``continuation``; ``info`` says which mode served and what the cached entry cost."""
        started = time.perf_counter()
        mode = check_mode(mode) or ("query_aware" if question is not None else "shared")
        doc, source, built = self._compress(prefix, document, suffix, question, mode)
        stream = self._continue_from(
            doc, continuation, options, cache_source=source, compress_seconds=time.perf_counter() - started
        )
        stream.info.mode = mode
        stream.info.document_seconds = built
        return stream

    def answer(
        self, document: str | CompressedDocument, question: str, *, mode: Mode | None = None, **generation: Any
    ) -> str:
        """The whole answer to ``question`` about ``document`` (``mode``: see ``run``)."""
        return self.run(document, question, mode=mode, **generation).text()

    def stream(
        self, document: str | CompressedDocument, question: str, *, mode: Mode | None = None, **generation: Any
    ) -> Iterator[str]:
        """Text pieces of the answer as they are generated (``mode``: see ``run``)."""
        return self.run(document, question, mode=mode, **generation)

    def generate(self, prompt: str, **generation: Any) -> AnswerStream:
        """Plain generation for a prompt that needs no compression (already chat-formatted text)."""
        options = GenerationOptions(**generation)
        ids = encode(self.tokenizer, prompt, first=True, formatted=True)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if ids.numel() >= self.context_window:
            raise ValueError(
                f"the prompt has {ids.numel()} tokens, over the model's {self.context_window}-token window; "
                f"pass the long text as a document so HOMER compresses it"
            )
        started = time.perf_counter()
        from transformers import DynamicCache

        state = DecodeState()
        info = AnswerInfo(input_tokens=ids.numel())
        pieces = decode(self.model, self.tokenizer, DynamicCache(), ids, 0, options, state)
        return AnswerStream(pieces, info, state, started)

    def chat_prompt(self, messages: list[dict[str, str]]) -> PromptText:
        """Render chat messages with the tokenizer's template (plain 'role: content' lines without one).

        The contents stay plain text: a message that spells a control token does not become one.
        """
        return render_chat(self.tokenizer, messages)


CacheSourceName = Literal["memory", "disk", "computed"]
