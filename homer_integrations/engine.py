"""``HomerModel``: the one engine object. It owns the model, the tokenizer and the document cache.

Everything above it (CLI, LangChain, LlamaIndex) calls these methods; nothing below it knows
any framework.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.document_cache import CacheSource, DocumentCache
from homer_integrations.homer.calibration import CalibrationKey, CalibrationStore
from homer_integrations.homer.compressed import CompressedDocument, CompressionStats
from homer_integrations.homer.compressor import CompressorSettings, HomerCompressor, PruneObserver
from homer_integrations.homer.config import HomerConfig, ModelDefaults
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.fingerprint import tokenizer_fingerprint, weights_fingerprint
from homer_integrations.homer.generation import DecodeState, FinishReason, GenerationOptions, decode
from homer_integrations.homer.prompt import PromptTexts, encode, render_layout, unit_ids
from homer_integrations.models import DEFAULT_MODEL, embedded_defaults, load_model
from homer_integrations.paths import PACKAGE_DATA, bundled_text, cache_root

logger = logging.getLogger(__name__)

ALGORITHM_VERSION = 1
"""Bumped whenever compression changes its output for the same settings: old cache entries then miss."""


@dataclass
class AnswerInfo:
    """What one answer cost and where its cache came from; complete once the stream is exhausted.

    ``cache_source`` is ``memory``, ``disk`` or ``computed`` for answers over a document, None
    for plain prompts. ``input_tokens`` are the tokens fed after the cache (question, chat
    turns); ``document_tokens`` the tokens the cache stands for.
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
        model, tokenizer: a Llama / Mistral / Qwen2 ``*ForCausalLM`` and its tokenizer.
        config: ``HomerConfig``; unset fields take this model's defaults.
        model_name: reported to frameworks (``response_metadata["model_name"]`` etc.).
        document_cache: where compressed documents live (default: in memory, 2 GiB).
        progress: show progress bars for compression and calibration.
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
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stack = DecoderStack(model)  # raises UnsupportedModelError first
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
        max_positions = int(getattr(model.config, "max_position_embeddings", 4096))
        defaults = (
            defaults or embedded_defaults(model_name) or ModelDefaults.for_model(self.stack.num_layers, max_positions)
        )
        self.config = (config or HomerConfig()).resolve(self.stack.num_layers, max_positions, defaults)
        self.context_window = max_positions
        self.document_cache = DocumentCache() if document_cache is None else document_cache
        self.progress = progress
        self._calibration = CalibrationStore(
            calibration_dir or cache_root() / "calibration", bundled_dir=PACKAGE_DATA / "calibration"
        )
        self._bias: torch.Tensor | None = None
        self._bias_lock = threading.Lock()
        self._fingerprint = weights_fingerprint(model)
        self._tokenizer_id = tokenizer_fingerprint(tokenizer)
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
        **model_kwargs: Any,
    ) -> HomerModel:
        """Load a model by local path, hub id or embedded name (None = the embedded default model)."""
        name = path_or_id or DEFAULT_MODEL
        model, tokenizer = load_model(name, dtype=dtype, device=device, **model_kwargs)
        return cls(
            model,
            tokenizer,
            config,
            model_name=name,
            document_cache=document_cache,
            progress=progress,
        )

    # ----------------------------------------------------------------------------- helpers
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def layout(self, question: str = "") -> PromptTexts:
        """Prefix / suffix / continuation texts around the document for ``question`` in this mode."""
        c = self.config
        return render_layout(
            self.tokenizer, question, c.document_suffix, c.mode == "query_aware", c.system_prompt, c.reask_question
        )

    def calibration_bias(self) -> torch.Tensor | None:
        """The pruning bias table for this model and settings; computed once, then cached on disk."""
        if self.config.scorer != "calibrated":
            return None
        with self._bias_lock:
            if self._bias is None:
                key = CalibrationKey.for_stack(self.stack, self.config.max_chunk_len)
                self._bias = self._calibration.get_or_compute(
                    self.stack,
                    key,
                    bundled_text("northangerabbey"),
                    self.tokenizer,
                    self.config.calibration_segments,
                    progress=self.progress is not False,
                )
            return self._bias

    def calibration_path(self) -> Path | None:
        """Where this model's calibration table is read from (bundled or user cache), None if not yet computed."""
        if self.config.scorer != "calibrated":
            return None
        return self._calibration.locate(CalibrationKey.for_stack(self.stack, self.config.max_chunk_len))

    def _calibration_id(self) -> str:
        if self.config.scorer != "calibrated":
            return self.config.scorer
        return CalibrationKey.for_stack(self.stack, self.config.max_chunk_len).id

    def cache_key(self, prefix: str, document: str, suffix: str) -> str:
        """Document-cache key: model identity, dtype, settings, calibration, mode, affixes and text."""
        parts = {
            "algorithm": ALGORITHM_VERSION,
            "model": self._fingerprint,
            "tokenizer": self._tokenizer_id,
            "dtype": str(self.stack.dtype),
            "settings": self.config.model_dump(mode="json"),
            "calibration": self._calibration_id(),
            "prefix": prefix,
            "suffix": suffix,
        }
        h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
        h.update(b"\0")
        h.update(document.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    # ----------------------------------------------------------------------------- compression
    def compress_span(
        self, prefix: str, document: str, suffix: str, question: str | None = None
    ) -> tuple[CompressedDocument, CacheSource]:
        """Compress prefix + document + suffix texts (cached); returns the document and where it came from."""
        if not document or not document.strip():
            raise ValueError("the document is empty")
        key = self.cache_key(prefix, document, suffix)
        return self.document_cache.get_or_compute(
            key, lambda: self._compress_now(key, prefix, document, suffix, question)
        )

    def compress(self, text: str, *, question: str | None = None) -> CompressedDocument:
        """Compress a whole document once (cached). ``question`` is required in query-aware mode."""
        if self.config.mode == "query_aware" and question is None:
            raise ValueError("query_aware mode compresses the question with the document: pass question=")
        layout = self.layout(question or "")
        doc, _ = self.compress_span(layout.prefix, text, layout.suffix, question if question is not None else None)
        return doc

    def _compress_now(
        self, key: str, prefix: str, document: str, suffix: str, question: str | None
    ) -> CompressedDocument:
        prefix_ids = encode(self.tokenizer, prefix, first=True)
        document_ids = encode(self.tokenizer, document)
        suffix_ids = encode(self.tokenizer, suffix)
        c = self.config
        settings = CompressorSettings(
            max_chunk_len=c.max_chunk_len,
            warmup_layers=c.warmup_layers,
            final_cache_len=c.final_cache_len,
            scorer=c.scorer,
            observation_window=c.observation_window,
            score_pooling=c.score_pooling,
            score_memory=c.score_memory,
            score_layers=c.score_layers,
            contiguous_positions=c.contiguous_positions,
            want_logits=c.mode == "query_aware" and not c.reask_question,
            seed=c.seed,
        )
        prompt_len = prefix_ids.numel() + document_ids.numel() + suffix_ids.numel()
        needs_pruning = prompt_len > c.final_cache_len
        compressor = HomerCompressor(
            self.stack, settings, self.calibration_bias() if needs_pruning else None, self.prune_observer
        )
        total = document_ids.numel()
        with tqdm(
            total=total,
            desc="HOMER compress",
            unit="tok",
            unit_scale=True,
            disable=True if self.progress is False else None,
            leave=False,
        ) as bar:
            words = unit_ids(self.tokenizer, document, c.pool_unit) if needs_pruning else None
            if words is not None and words.numel() != document_ids.numel():
                words = None  # tokenizer without offsets that line up: fall back to token scores
            result = compressor.compress(prefix_ids, document_ids, suffix_ids, progress=bar.update, word_ids=words)
        stats = CompressionStats(
            document_tokens=total,
            prompt_tokens=prompt_len,
            cache_tokens=result.keys[0].shape[2],
            cache_bytes=sum(t.numel() * t.element_size() for t in result.keys + result.values),
            seconds=result.seconds,
            peak_kv_bytes=result.peak_kv_bytes,
            tree_height=result.plan.height,
            leaves=result.plan.num_leaves,
            max_chunk_len=c.max_chunk_len,
        )
        logger.info(
            "compressed %d document tokens into %d cache tokens in %.1fs (tree height %d)",
            total,
            stats.cache_tokens,
            stats.seconds,
            stats.tree_height,
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
    def continue_from(
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
        ids = encode(self.tokenizer, continuation)
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

    def run(self, document: str | CompressedDocument, question: str, **generation: Any) -> AnswerStream:
        """Answer ``question`` about ``document`` (text or a ``CompressedDocument``), streaming."""
        options = GenerationOptions(**generation)
        if not question or not question.strip():
            raise ValueError("the question is empty")
        layout = self.layout(question)
        started = time.perf_counter()
        if isinstance(document, CompressedDocument):
            if document.question is not None and document.question != question:
                raise ValueError(
                    "this document was compressed query-aware for another question; compress it again "
                    "with this question, or use shared mode to reuse one cache for every question"
                )
            doc, source = document, None
            continuation = layout.continuation
        else:
            query_aware = self.config.mode == "query_aware"
            doc, source = self.compress_span(layout.prefix, document, layout.suffix, question if query_aware else None)
            continuation = layout.continuation
        return self.continue_from(
            doc, continuation, options, cache_source=source, compress_seconds=time.perf_counter() - started
        )

    def answer(self, document: str | CompressedDocument, question: str, **generation: Any) -> str:
        """The whole answer to ``question`` about ``document``."""
        return self.run(document, question, **generation).text()

    def stream(self, document: str | CompressedDocument, question: str, **generation: Any) -> Iterator[str]:
        """Text pieces of the answer as they are generated."""
        return self.run(document, question, **generation)

    def generate(self, prompt: str, **generation: Any) -> AnswerStream:
        """Plain generation for a prompt that needs no compression (already chat-formatted text)."""
        options = GenerationOptions(**generation)
        ids = encode(self.tokenizer, prompt, first=True)
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

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Render chat messages with the tokenizer's template (plain 'role: content' lines without one)."""
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])


CacheSourceName = Literal["memory", "disk", "computed"]
