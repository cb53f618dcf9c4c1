"""Answers: ``Answerer`` feeds text after a document's cache (or after nothing) and streams the
answer; ``AnswerStream`` yields its pieces and ``AnswerInfo`` says what it cost and which cache
served it, in the shapes frameworks report it (``usage``, ``metadata``, ``as_dict``).

Cache accounting follows the prompt-caching convention (Anthropic, OpenAI, LangChain's
``input_token_details``): the compressed span (template head + document + fixed suffix) is
*cache creation* on the call that compressed it and *cache read* on every call that reused
it; ``input_tokens`` is the whole prompt: that span plus the tokens fed after the cache. The rows a
``full`` answer copies from its prefill before the question (its passages, ``homer.reading.echo``) are
read from the cache: cache reads, and part of the prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.cache import CacheSource
from homer_integrations.engine.modes import KeptForm, kept_form
from homer_integrations.engine.tiers import DocumentTiers
from homer_integrations.homer.config import Mode, resolve_mode
from homer_integrations.homer.decoding.generation import DecodeState, FinishReason, GenerationOptions, decode
from homer_integrations.homer.decoding.sources import FROM_DEPTH, CitedSpan, cite
from homer_integrations.homer.document.prompt import PromptText, concat, encode, markup, plain
from homer_integrations.homer.kv.compressed import CompressedDocument, CompressionStats
from homer_integrations.homer.kv.headwise import headwise_ready
from homer_integrations.homer.kv.kept import kept_decoding
from homer_integrations.homer.reading.echo import ECHO_LINE, Echo


@dataclass(frozen=True)
class TokenUsage:
    """Token counts of one answer; ``cache_creation + cache_read <= input_tokens``."""

    input_tokens: int
    output_tokens: int
    cache_creation: int
    cache_read: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class AnswerInfo:
    """What one answer cost and where its cache came from; complete once the stream is exhausted.

    ``cache_source`` is ``memory``, ``disk`` or ``computed`` for answers over a document, None
    for plain prompts. ``input_tokens`` are the tokens fed after the cache (question, chat
    turns); ``document_tokens`` the tokens the cache stands for. ``mode`` says which tier served:
    ``shared`` (the one compressed root) or ``query_aware`` (pruning replayed from the leaf tier
    with this question, the kept tokens read as ``Recipe.replay`` says). ``compress_seconds`` is
    everything before the question was fed (lookups, compression or replay); ``document_seconds`` the
    part of it spent computing the cached entry (the shared root or the leaf tier), 0 when it came
    from the cache.
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
    echoed_tokens: int = 0
    """Rows of the cache copied once more after it, the question's passages (``Recipe.echo``): read from
    the cache, so counted as cache reads."""
    sources: list[CitedSpan] = field(default_factory=list)
    """The spans of the document the answer was read from (``homer.decoding.sources.cite``), once the stream
    is exhausted; empty for plain prompts, for a ``CompressedDocument`` passed without its text, and for
    caches decoded through transformers' own attention (head-wise roots, sliding-window models)."""

    def token_usage(self) -> TokenUsage:
        """Token counts of the finished answer (its stream exhausted), cache creation / read included."""
        cached = self.compression.prompt_tokens if self.compression is not None else 0
        created = cached if self.cache_source == "computed" else 0
        return TokenUsage(
            input_tokens=cached + self.echoed_tokens + self.input_tokens,
            output_tokens=self.output_tokens,
            cache_creation=created,
            cache_read=cached - created + self.echoed_tokens,
        )

    def usage(self) -> dict[str, Any]:
        """``token_usage`` in LangChain's ``UsageMetadata`` shape (``input_token_details``: ``cache_creation``,
        ``cache_read``)."""
        u = self.token_usage()
        return {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
            "input_token_details": {"cache_creation": u.cache_creation, "cache_read": u.cache_read},
        }

    def metadata(self) -> dict[str, Any]:
        """HOMER statistics of the finished answer as a flat, JSON-ready dict.

        ``mode`` is the HOMER mode that served (``shared``, ``query_aware``, ``full``; None for a
        plain prompt); ``cache_source`` is ``computed`` / ``memory`` / ``disk`` (None for a plain
        prompt); ``compress_seconds`` is the time spent getting the cache on this call, of which
        ``document_seconds`` computing the cached entry (0 when it came from the cache).
        """
        data: dict[str, Any] = {
            "mode": self.mode,
            "cache_source": self.cache_source,
            "document_tokens": self.document_tokens,
            "cache_tokens": self.cache_tokens,
            "echoed_tokens": self.echoed_tokens,
            "compress_seconds": round(self.compress_seconds, 4),
            "document_seconds": round(self.document_seconds, 4),
            "finish_reason": self.finish_reason,
            "time_to_first_token": None if self.time_to_first_token is None else round(self.time_to_first_token, 4),
            "total_seconds": round(self.total_seconds, 4),
            "sources": [s.as_dict() for s in self.sources],
        }
        if self.compression is not None:
            data["compression_ratio"] = round(self.compression.compression_ratio, 3)
            data["compression_seconds"] = round(self.compression.seconds, 4)
        return data

    def as_dict(self) -> dict[str, Any]:
        """``metadata`` and ``token_usage`` in one JSON-ready dict, plus the full compression statistics
        (``compression``: leaves, tree height, cache bytes, ...; None for plain prompts): LlamaIndex's
        ``additional_kwargs`` and node metadata."""
        return {
            **self.metadata(),
            **asdict(self.token_usage()),
            "compression": None if self.compression is None else asdict(self.compression),
        }


class AnswerStream(Iterator[str]):
    """Text pieces of an answer; ``info`` is complete once iteration ends."""

    def __init__(
        self,
        pieces: Iterator[str],
        info: AnswerInfo,
        state: DecodeState,
        started: float,
        attended: torch.Tensor | None = None,
        deferred: list[Callable[[], None]] | None = None,
    ) -> None:
        self._pieces = pieces
        self.info = info
        self._state = state
        self._started = started
        self._attended, self._deferred = attended, deferred or []
        self.on_finish: Callable[[AnswerStream], None] | None = None
        """Called once the stream is exhausted (``answer_span`` cites the sources there)."""

    @property
    def attended(self) -> torch.Tensor | None:
        """[K] (+ [M] echoed rows, ``Echo.fold``): the attention each cache token received while the question and
        answer were fed, or None; the sums a fused read left for later (``kept.kept_cache``) are added first."""
        while self._deferred:
            self._deferred.pop(0)()
        return self._attended

    def __next__(self) -> str:
        try:
            return next(self._pieces)
        except StopIteration:
            self.info.output_tokens = len(self._state.token_ids)
            self.info.finish_reason = self._state.finish_reason
            if self._state.first_token_seconds is not None and self.info.time_to_first_token is None:
                self.info.time_to_first_token = self.info.compress_seconds + self._state.first_token_seconds
            if self.on_finish is not None:
                finish, self.on_finish = self.on_finish, None
                finish(self)
            self.info.total_seconds = time.perf_counter() - self._started
            raise

    def text(self) -> str:
        """Consume the stream and return the whole answer."""
        return "".join(self)


BASELINES_KEPT = 8
"""Documents whose question-less attention (``Answerer._baseline``) is kept for their next answers."""


class Answerer:
    """Streams answers with ``model`` after caches that ``tiers`` computes or looks up.

    The framework adapters answer through it: their prompts arrive already split into the texts
    before the document (``prefix``), after it (``suffix``) and after the cache (``continuation``).
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tiers: DocumentTiers) -> None:
        self.model, self.tokenizer, self.tiers = model, tokenizer, tiers
        self._baselines: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # key: (origin [K], attended [K])

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
        """Compress (or fetch) prefix + document + suffix in ``mode`` (default: ``query_aware``
        with a ``question``, else ``shared``; ``engine.modes``) and
        stream the answer to ``continuation`` (after the question's passages echoed from a ``full`` prefill,
        ``_echo``); ``info`` says which mode served and what the cached entry cost."""
        started = time.perf_counter()
        form = kept_form(resolve_mode(mode, question=question), self.tiers.prompting, document, question)
        doc, source, built = form.compress(self.tiers, prefix, document, suffix, question)
        echo = self._echo(form, doc, document, continuation)
        if echo is not None:
            continuation = concat(plain(ECHO_LINE), markup(continuation))  # a str is formatted: all markup
        stream = self.continue_from(
            doc, continuation, options, cache_source=source, compress_seconds=time.perf_counter() - started, echo=echo
        )
        stream.info.mode = form.mode
        stream.info.document_seconds = built
        if stream.attended is not None:
            stream.on_finish = lambda done: self._cite(done, doc, document, echo)
        return stream

    def _echo(self, form: KeptForm, doc: CompressedDocument, document: str, continuation: str) -> Echo | None:
        """The rows of ``doc`` holding the passages that ``continuation``'s words (markup aside) pick, to copy
        after it (``Recipe.echo``; a form that ``echoes``, a document given as text), or None."""
        echo = self.tiers.recipe.echo
        if echo is None or not form.echoes or type(document) is not str:
            return None
        passages = self.tiers.passages(document, echo.selection)
        asked = continuation.content() if isinstance(continuation, PromptText) else continuation
        tokens = None if passages is None else echo.document_tokens(asked, passages)
        return None if tokens is None else Echo.of(self.tiers.stack, doc, tokens)

    def _cite(self, stream: AnswerStream, doc: CompressedDocument, document: str, echo: Echo | None = None) -> None:
        """``stream.info.sources``: the spans of ``document`` its answer attended to most, beyond what a read
        without the question attends to (``_baseline``); attention to echoed rows counts for the rows they copy."""
        offsets = self.tiers.prompting.documents.ids(document)[1]
        if offsets is not None and stream.attended is not None:
            attended = stream.attended if echo is None else echo.fold(stream.attended)
            baseline = self._baseline(doc)
            stream.info.sources = cite(attended, doc.origin, offsets, document, baseline=baseline)

    def _baseline(self, doc: CompressedDocument) -> torch.Tensor:
        """[K]: the attention ``doc``'s kept tokens receive, in the layers sources count, when the engine's
        layout is read after it with no question (and one token answered): the document's start and the text
        just before the question draw attention whatever is asked. Kept for the last documents cited."""
        found = self._baselines.get(doc.key) if doc.key else None
        if found is not None and torch.equal(found[0], doc.origin):  # a question's own read keeps its own tokens
            return found[1]
        ids = encode(self.tokenizer, self.tiers.prompting.layout("", "full").continuation, formatted=True)
        attended = torch.zeros(doc.num_tokens, device=doc.keys[0].device)
        cache = doc.to_cache(tail=ids.numel() + 2, attended=attended, attended_from=self._attended_from())
        for _ in decode(
            self.model,
            self.tokenizer,
            cache,
            ids,
            doc.last_position + 1,
            GenerationOptions(max_new_tokens=1),
            DecodeState(),
        ):
            pass
        if doc.key:
            self._baselines[doc.key] = (doc.origin, attended)
            while len(self._baselines) > BASELINES_KEPT:
                self._baselines.pop(next(iter(self._baselines)), None)  # another thread may have taken it
        return attended

    def _attended_from(self) -> int:
        """The first layer whose attention sources count (``sources.FROM_DEPTH`` of the model's depth)."""
        return int(self.model.config.num_hidden_layers * FROM_DEPTH)

    def continue_from(
        self,
        document: CompressedDocument,
        continuation: str,
        options: GenerationOptions | None = None,
        *,
        cache_source: CacheSource | None = None,
        compress_seconds: float = 0.0,
        echo: Echo | None = None,
    ) -> AnswerStream:
        """Feed ``continuation`` after a compressed document (and ``echo``'s rows, written after it first) and
        stream the answer."""
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
            echoed_tokens=0 if echo is None else echo.tokens,
        )
        state = DecodeState()
        kept = headwise_ready(self.model) and kept_decoding(self.model.config)
        dense = kept and document.head_lengths is None
        device = document.keys[0].device
        attended = torch.zeros(document.num_tokens + info.echoed_tokens, device=device) if dense else None
        deferred: list[Callable[[], None]] = []  # the question's sums over a long cache: after its first token
        cache = document.to_cache(
            tail=info.echoed_tokens + ids.numel() + options.max_new_tokens + 1 if kept else None,
            attended=attended,
            attended_from=self._attended_from(),
            deferred=deferred,
        )
        if echo is not None:
            echo.write(cache)
        pieces = decode(
            self.model,
            self.tokenizer,
            cache,
            ids,
            document.last_position + 1 + info.echoed_tokens,
            options,
            state,
            first_logits=document.next_token_logits if ids.numel() == 0 else None,
        )
        return AnswerStream(pieces, info, state, started, attended, deferred)

    def generate(self, prompt: str, **generation: Any) -> AnswerStream:
        """Plain generation for a prompt that needs no compression (already chat-formatted text)."""
        options = GenerationOptions(**generation)
        ids = encode(self.tokenizer, prompt, first=True, formatted=True)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        window = self.tiers.prompting.context_window
        if ids.numel() >= window:
            raise ValueError(
                f"the prompt has {ids.numel()} tokens, over the model's {window}-token window; "
                f"pass the long text as a document so HOMER compresses it"
            )
        started = time.perf_counter()
        state = DecodeState()
        info = AnswerInfo(input_tokens=ids.numel())
        pieces = decode(self.model, self.tokenizer, DynamicCache(), ids, 0, options, state)
        return AnswerStream(pieces, info, state, started)
