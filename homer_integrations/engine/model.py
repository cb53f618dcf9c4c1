"""``HomerModel``: the one engine object. It owns the model, the tokenizer and the document cache.

Everything above it (CLI, LangChain, LlamaIndex, corpus compression) calls its public methods and
properties only (``tests/test_engine_door.py`` holds them to it); nothing below it knows any framework.
Its parts, each one idea: ``prompting`` (token counts, layouts, size limits), ``tiers`` (the
document's cached entries: shared root, full prefill, leaf tier; their keys, scoring and
calibration), ``answerer`` (streams answers after a cache) and, over them, ``calls.ModeCalls``
(what a call about a document does in its mode); the methods below are their door.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.cache import DocumentCache
from homer_integrations.cache.document_cache import CacheStats
from homer_integrations.cache.store import Store
from homer_integrations.engine.answering import Answerer, AnswerInfo, AnswerStream
from homer_integrations.engine.calls import ModeCalls
from homer_integrations.engine.loading import DEFAULT_MODEL, embedded_defaults, load_model
from homer_integrations.engine.modes import Prepared, decide, kept_form
from homer_integrations.engine.prompting import DEFAULT_MAX_DOCUMENT_TOKENS, Prompting, check_text
from homer_integrations.engine.quantization import Quantization
from homer_integrations.engine.tiers import ALGORITHM_VERSION, Compressed, DocumentTiers
from homer_integrations.homer.config import HomerConfig, Mode, ModelDefaults, resolve_mode
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.document.prompt import PromptText, PromptTexts
from homer_integrations.homer.kv.compressed import CompressedDocument
from homer_integrations.homer.kv.headwise import register_headwise_attention
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.strategies import Recipe

__all__ = ["ALGORITHM_VERSION", "AnswerInfo", "AnswerStream", "HomerModel"]


class HomerModel:
    """A local causal LM that answers questions about whole long documents through HOMER.

    Args:
        model, tokenizer: a ``*ForCausalLM`` of a supported family (``homer.model.architectures``: Llama,
            Mistral, Qwen2/3, Phi-3, Gemma-3 text) and its tokenizer.
        config: ``HomerConfig``; unset fields take this model's defaults.
        model_name: reported to frameworks (``response_metadata["model_name"]`` etc.).
        document_cache: where compressed documents live (default: in memory, 2 GiB).
        store: instead of ``document_cache``: a directory or a URL fsspec knows (``s3://bucket/prefix``)
            that holds compressed documents for every process with the same model and settings;
            True for the package's cache directory (``from_pretrained``'s default).
        disk_budget: most bytes a local ``store`` keeps (least recently used go first); alone, it
            turns on the default local directory.
        progress: show progress bars for compression and calibration.
        recipe: how the caches are built (``homer.reading.strategies.Recipe``: the shared root's builder, the
            per-question replay, the scoring, the re-asked question, the calibration's size); the
            default is the package's measured best. For research and the ablations in ``benchmarks/``;
            what shapes a stored root (the shared root's builder, the scoring) is part of its cache key.
        max_document_tokens: most tokens a document may have (default 2,000,000; None: only the merge
            tree's bound). A longer one is refused with ``InputTooLongError`` (a ``ValueError``) before
            any of it is compressed; its tokens are counted in slices, so a 50 MB text is refused in
            seconds with bounded memory. A question may have at most ``max_chunk_len // 4`` tokens.
        defaults: the model's measured settings (``ModelDefaults``; default: the embedded model's, else
            derived from its depth and window).
        calibration_dir: where computed calibration tables are kept (default: the package's cache).
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
        recipe: Recipe | None = None,
        store: str | Path | Store | bool | None = None,
        disk_budget: int | None = None,
        max_document_tokens: int | None = DEFAULT_MAX_DOCUMENT_TOKENS,
    ) -> None:
        if document_cache is not None and (store is not None or disk_budget is not None):
            raise ValueError("pass document_cache= or store=/disk_budget=, not both")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stack = DecoderStack(model)  # raises UnsupportedModelError first
        # once, here: decoding a head-wise root then changes no global state (homer.kv.headwise)
        register_headwise_attention(model)
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
        max_positions = int(getattr(model.config, "max_position_embeddings", 4096))
        defaults = (
            defaults or embedded_defaults(model_name) or ModelDefaults.for_model(self.stack.num_layers, max_positions)
        )
        self.config = (config or HomerConfig()).resolve(self.stack.num_layers, max_positions, defaults)
        self.recipe = recipe or Recipe()
        """How the caches are built (``homer.reading.strategies.Recipe``)."""
        self.prompting = Prompting(
            tokenizer,
            self.config,
            self.stack.num_layers,
            max_positions,
            max_document_tokens,
            reask_question=self.recipe.reask_question,
        )
        """Token counts, prompt layouts and size limits."""
        self.tiers = DocumentTiers(
            model,
            tokenizer,
            self.stack,
            self.prompting,
            DocumentCache.open(store, disk_budget) if document_cache is None else document_cache,
            recipe=self.recipe,
            calibration_dir=calibration_dir,
            progress=progress,
        )
        """The document's cached entries (shared root, full prefill, leaf tier), their keys and calibration."""
        self.answerer = Answerer(model, tokenizer, self.tiers)
        """Streams answers after a cache; what the framework adapters call."""
        self._modes = ModeCalls(self.prompting, self.tiers, self.answerer)

    @property
    def context_window(self) -> int:
        """The model's window in tokens (``max_position_embeddings``)."""
        return self.prompting.context_window

    @property
    def document_cache(self) -> DocumentCache:
        """Where compressed documents live."""
        return self.tiers.document_cache

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
        store: str | Path | Store | bool | None = True,
        disk_budget: int | None = None,
        quantize: Quantization | None = None,
        max_document_tokens: int | None = DEFAULT_MAX_DOCUMENT_TOKENS,
        recipe: Recipe | None = None,
        **model_kwargs: Any,
    ) -> HomerModel:
        """Load a model by local path, hub id or embedded name (None = the embedded default model).

        ``dtype="auto"``: bfloat16 on a CPU that computes it faster than float32, else float32
        (``homer_integrations.engine.dtypes``); bfloat16 on a GPU that has it. ``store``: where compressed
        documents are kept between questions and processes; by default (True) the package's cache
        directory on disk, as the CLI does, so no document is compressed twice; a directory or
        fsspec URL; None or False keeps them in memory only. ``document_cache`` replaces it.
        ``quantize="int8"``: int8 linear layers on the CPU (faster decoding). ``max_document_tokens``
        and ``recipe``: see the class.
        """
        name = path_or_id or DEFAULT_MODEL
        model, tokenizer = load_model(name, dtype=dtype, device=device, quantize=quantize, **model_kwargs)
        if document_cache is not None or store is False:
            store = None
        return cls(
            model,
            tokenizer,
            config,
            model_name=name,
            document_cache=document_cache,
            progress=progress,
            store=store,
            disk_budget=disk_budget,
            max_document_tokens=max_document_tokens,
            recipe=recipe,
        )

    def with_store(self, store: str | Path | Store | DocumentCache, disk_budget: int | None = None) -> HomerModel:
        """An engine over this one's loaded model and settings (same cache keys) whose documents
        live in ``store`` (a directory, a URL fsspec knows, a ``Store``, or a ready ``DocumentCache``)."""
        cache = store if isinstance(store, DocumentCache) else DocumentCache.open(store, disk_budget)
        other = copy.copy(self)
        other.tiers = self.tiers.with_cache(cache)
        other.answerer = Answerer(self.model, self.tokenizer, other.tiers)
        other._modes = ModeCalls(self.prompting, other.tiers, other.answerer)
        return other

    def mode_for(self, *requested: Mode | None, document: str | None = None) -> Mode:
        """The mode a call runs in: the first of ``requested`` (most specific first: a call's ``mode=``, then
        an adapter's setting) that is not None, checked, else ``config.mode`` (``homer.config.resolve_mode``).
        ``auto`` with a ``document`` is decided for it: ``full`` when it fits the model's window with room for a
        question and its answer, else ``query_aware`` (``Prompting.whole_mode``); without one it stays ``auto``."""
        return decide(resolve_mode(*requested, default=self.config.mode), self.prompting, document)

    def reads_tier(self, document_tokens: int) -> bool:
        """Whether a ``query_aware`` question about a document of ``document_tokens`` reads its leaf tier;
        False past the model's window, where it re-reads the passages BM25 ranks best and builds no tier."""
        return self.tiers.reads_tier(document_tokens)

    def stats(self) -> CacheStats:
        """The document cache's counters and sizes: hits (memory, disk), misses, computations, entries, bytes."""
        return self.document_cache.stats()

    # ----------------------------------------------------------------------------- tokens and prompts
    def token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return self.prompting.token_ids(text)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as plain text (a ``PromptText`` keeps its markup's control tokens)."""
        return self.prompting.count_tokens(text)

    def token_offsets(self, document: str) -> torch.Tensor | None:
        """Character span [N, 2] of each token of ``document`` (what a ``CompressedDocument``'s ``origin``
        indexes), from the tokenizer call that gave its ids: remembered, so free once it was compressed.
        None from a slow tokenizer (no offsets)."""
        return self.prompting.documents.ids(document)[1]

    def chat_prompt(self, messages: list[dict[str, str]]) -> PromptText:
        """Chat messages (``role``/``content`` dicts) rendered with the tokenizer's template; the contents
        stay plain text."""
        return self.prompting.chat_prompt(messages)

    def layout(self, question: str = "", mode: Mode | None = None) -> PromptTexts:
        """The prefix / suffix / continuation texts this engine puts around a document for ``question``
        in ``mode`` (default: ``config.mode``)."""
        return self.prompting.layout(question, mode)

    def layout_prompt(self, rendered: PromptText, question: str, mode: Mode | None = None) -> PromptTexts:
        """The prefix / suffix / continuation texts of a prompt rendered with ``homer.document.prompt.DOCUMENT_MARK``
        where the document goes; ``question`` is the rest of the document's message."""
        return self.prompting.layout_prompt(rendered, question, mode)

    def check_question(self, question: str) -> None:
        """Refuse a question that is not text, empty, or longer than this engine takes (``InputTooLongError``)."""
        self.prompting.check_question(question)

    def check_document(self, document: str) -> None:
        """Refuse a document that is not text, empty, or longer than this engine takes (``InputTooLongError``),
        before any of it is compressed."""
        self.prompting.check_document(document)

    # ----------------------------------------------------------------------------- calibration
    @property
    def needs_calibration(self) -> bool:
        """Whether the shared roots' pruning reads a calibration table (``calibrate``)."""
        return self.tiers.scoring.needs_calibration

    def calibrate(self) -> Path | None:
        """Compute the pruning calibration unless it is stored (minutes, once per model and settings);
        where the table is kept, None when held in memory only or not needed."""
        self.tiers.calibration.bias()
        return self.tiers.calibration.path()

    # ----------------------------------------------------------------------------- compression
    def compress(self, text: str, *, question: str | None = None, mode: Mode | None = None) -> CompressedDocument:
        """Compress a whole document in ``mode`` (default: ``config.mode``): with a ``question``, compressed
        with it (query-aware); without one, the shared root (cached), unless ``mode="full"``. An explicit
        ``mode="query_aware"`` needs ``question=``. To prepare what later questions replay from, see
        ``cache_document``."""
        return self._modes.compress(
            text, question, self.mode_for(mode, document=text), requested=mode not in (None, "auto")
        )

    def compress_span(
        self, prefix: str, document: str, suffix: str, *, question: str | None = None, mode: Mode | None = None
    ) -> Compressed:
        """The cache of ``prefix`` + ``document`` + ``suffix`` (texts an adapter laid out, ``layout_prompt``)
        in ``mode`` (default: ``query_aware`` with a ``question``, else ``shared``): the document, where its
        cached entry came from and the seconds spent computing that entry."""
        form = kept_form(resolve_mode(mode, question=question), self.prompting, document, question)
        return form.compress(self.tiers, prefix, document, suffix, question)

    def entry_key(self, document: str, mode: Mode | None = None) -> str:
        """The document-cache key of ``document``'s stored entry in ``mode`` (default: ``config.mode``), laid
        out with no question: the shared root's, the full prefill's or (``query_aware``) the leaf tier's."""
        return self._modes.entry_key(document, self.mode_for(mode, document=document))

    def cache_document(
        self, document: str, mode: Mode | None = None, *, prefix: str | None = None, suffix: str | None = None
    ) -> Prepared:
        """Look up, or compute and store, ``document``'s entry in ``mode`` (see ``entry_key``; by default the
        leaf tier): its document tokens, where it came from and, for a ``shared`` root or a ``full`` prefill,
        its ``CompressionStats`` (``modes.Prepared``). What every later question in that mode
        starts from. ``prefix`` / ``suffix``: the texts an adapter laid out around the document
        (``layout_prompt``); default: this engine's layout with no question. The source is None when
        there is nothing to store: past the model's window a ``query_aware`` question reads the text's
        passages and no leaf tier (``DocumentTiers.reads_tier``)."""
        return self._modes.cache_document(document, self.mode_for(mode, document=document), prefix, suffix)

    # ----------------------------------------------------------------------------- answering
    def run_span(
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
        """Answer a prompt an adapter split around its document: ``prefix`` + ``document`` + ``suffix`` is
        compressed (or found) in ``mode`` (see ``compress_span``) and ``continuation`` fed after it."""
        return self.answerer.answer_span(prefix, document, suffix, continuation, options, question=question, mode=mode)

    def generate(self, prompt: str, **generation: Any) -> AnswerStream:
        """Plain generation for a prompt that needs no compression (already chat-formatted text); it must
        fit the model's window. ``generation``: ``GenerationOptions`` fields."""
        return self.answerer.generate(prompt, **generation)

    def run(
        self, document: str | CompressedDocument, question: str, *, mode: Mode | None = None, **generation: Any
    ) -> AnswerStream:
        """Answer ``question`` about ``document`` (text or a ``CompressedDocument``), streaming.

        ``mode`` picks the tier for this call (default: ``config.mode``, ``query_aware``): ``shared``
        answers from the document's one compressed root; ``query_aware`` replays pruning from the document's
        leaf tier with the question in the suffix (the paper's question-aware compression, without
        re-running the leaves over the document after the first question; ``recipe.replay`` says how
        the kept tokens are read);
        ``full`` answers from the whole prompt's uncompressed cache.
        ``generation``: ``GenerationOptions`` fields; ``response_format=`` (a JSON schema dict, a
        pydantic class or TypedDict, a compiled regex, a list of choices) constrains the answer.
        """
        options = GenerationOptions(**generation)
        self.prompting.check_question(question)  # text (not bytes, no lone surrogate), not empty, not too long
        if not isinstance(document, CompressedDocument):
            check_text(document, "document")  # before ``auto`` is decided from its length
        text = document if isinstance(document, str) else None
        return self._modes.run(document, question, self.mode_for(mode, document=text), options)

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
