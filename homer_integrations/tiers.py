"""``DocumentTiers``: one engine's document entries. It computes, caches and replays them.

Three kinds of entry stand for a document in the document cache:
- the ``shared`` root: one compression with a question-independent suffix;
- a ``full`` prefill: the whole prompt, uncompressed;
- the leaf tier: what every ``query_aware`` question replays pruning and the upper levels from.

The cache keys (``keys``), the pruning recipes (``scoring``, ``question_scoring``) and the
calibration they use live here, beside the compressions that depend on them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple, TypeVar

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.cache.keys import DocumentKeys
from homer_integrations.document_cache import CacheSource, DocumentCache
from homer_integrations.homer.budget import read_rate
from homer_integrations.homer.calibration import Calibration, CalibrationStore
from homer_integrations.homer.compressed import CacheSpec, CompressedDocument, CompressionStats, cached_tokens
from homer_integrations.homer.compressor import CompressionResult, CompressorSettings, PruneObserver, TierCompressor
from homer_integrations.homer.config import HomerConfig, Mode, resolve_mode
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.encoded import EncodedDocument
from homer_integrations.homer.fingerprint import tokenizer_fingerprint, weights_fingerprint
from homer_integrations.homer.leaf_tier import LeafTier
from homer_integrations.homer.lexical import LexicalEvidence, Statements
from homer_integrations.homer.passages import Passages, PassageSelection
from homer_integrations.homer.prompt import encode, markup
from homer_integrations.homer.scoring import REPEAT_PROMPT, Scoring
from homer_integrations.homer.strategies import Recipe, Reread, RootSpan, SharedRoot, TreeRoot
from homer_integrations.paths import PACKAGE_DATA, bundled_text, cache_root
from homer_integrations.prompting import Prompting

logger = logging.getLogger(__name__)
T = TypeVar("T")

ALGORITHM_VERSION = 1
"""Bumped whenever compression changes its output for the same settings: old cache entries then miss."""


class PromptTooLongError(ValueError):
    """The prompt around the document (system prompt, instructions, question, template), which is never
    pruned, leaves the compressed cache no room for the document within ``final_cache_len``."""


class Compressed(NamedTuple):
    """A document's cache for one call: ``source`` says where its cached entry came from; ``seconds``
    is the time spent computing that entry (0 when it was cached)."""

    document: CompressedDocument
    source: CacheSource
    seconds: float


class DocumentTiers:
    """Shared roots, full prefills and leaf tiers of one model, ``HomerConfig`` (resolved) and ``Recipe``.

    Args:
        model, tokenizer, stack: the loaded model, its tokenizer and its decoder stack.
        prompting: the engine's ``Prompting`` (layouts and size limits).
        document_cache: where entries live.
        recipe: how entries are built (``homer.strategies.Recipe``; default: the package's). Shared roots
            prune by its ``scoring`` (None: ``Scoring.default()`` with reconstruction-scored leaves),
            query-aware compressions by its ``question_scoring`` (None: ``Scoring.for_questions()``, or
            the ``with_question()`` of a ``scoring`` given).
        calibration_dir: where computed calibration tables are kept.
        progress: show progress bars (None: tqdm decides).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stack: DecoderStack,
        prompting: Prompting,
        document_cache: DocumentCache,
        *,
        recipe: Recipe | None = None,
        calibration_dir: Path | None = None,
        progress: bool | None = None,
    ) -> None:
        c = self.config = prompting.config
        self.stack, self.prompting, self.document_cache, self.progress = stack, prompting, document_cache, progress
        self.recipe = recipe = recipe or Recipe()
        """The shared root's builder, the replay, the scoring and the calibration's size."""
        self.repeat_ids = encode(tokenizer, REPEAT_PROMPT)
        """The reconstruction prompt [R] (a head-wise root's probe reads it before the repeated text)."""
        given = recipe.scoring
        self.scoring = Scoring.default().with_reconstruction(self.repeat_ids) if given is None else given
        """What shared compressions prune by."""
        derived = Scoring.for_questions() if given is None else given.with_question()
        self.question_scoring = derived if recipe.question_scoring is None else recipe.question_scoring
        """What query-aware compressions (the question in the suffix) prune by."""
        store = CalibrationStore(
            calibration_dir or cache_root() / "calibration", bundled_dir=PACKAGE_DATA / "calibration"
        )
        self.calibration = Calibration(
            store,
            stack,
            c.max_chunk_len,
            recipe.calibration_segments,
            tokenizer,
            needed=self.scoring.needs_calibration,
            text=lambda: bundled_text("northangerabbey"),
        )
        """The pruning bias table for this model and settings (``bias()``: computed once, then cached on disk)."""
        self.keys = entry_keys(
            model, tokenizer, stack, c, recipe, self.scoring, self.question_scoring.unit, self.calibration.id
        )
        """Document-cache keys of these entries (``root``, ``full``, ``tier``)."""
        # A document's BM25 statements and passages, asked for by every question on it; keyed by the text.
        self._indexes = RecentIndexes()
        self.prune_observer: PruneObserver | None = None
        """Diagnostics: called with every node's ``PruneEvent`` during compressions computed from now on."""
        self.cache_spec, self.root_spec, self.full_cache_spec = entry_specs(
            stack,
            c,
            recipe.shared_root,
            prompting.context_window,
            getattr(model.get_output_embeddings(), "out_features", None),
        )
        """What each kind of entry looks like (``entry_specs``); disk cache entries are checked against it."""

    def with_cache(self, document_cache: DocumentCache) -> DocumentTiers:
        """These tiers (same keys and settings) over another document cache."""
        other = copy.copy(self)
        other.document_cache = document_cache
        return other

    def compress(
        self, prefix: str, document: str, suffix: str, question: str | None = None, mode: Mode | None = None
    ) -> Compressed:
        """The cache of prefix + document + suffix texts in ``mode`` (default: ``query_aware`` when a
        ``question`` is given, else ``shared``).

        ``shared`` is the compressed root, cached under its key; ``full`` the uncompressed cache of
        the whole prompt (a plain prefill kept like a root; the prompt must fit the model's window);
        ``query_aware`` (``suffix`` holds ``question``) builds this question's root by the recipe's
        replay: from the document's leaf tier, looked up or built once (the source reported is the
        tier's), or, for a replay that reads the text alone (BM25 passages past the model's window),
        from the document's text with no tier at all (source ``computed``). The replayed root is not
        cached.
        """
        self.prompting.check_document(document)
        mode = resolve_mode(mode, question=question)
        if mode == "query_aware":
            if question is None:
                raise ValueError("query_aware mode compresses the question with the document: pass question=")
            encoded = self.prompting.encode_document(prefix, document, suffix, asks=True)
            found: list[tuple[LeafTier, CacheSource]] = []

            def leaf_tier() -> LeafTier:
                if not found:
                    tier, source = self.leaf_tier(prefix, document, encoded)
                    found.append((tier.to(self.stack.device), source))
                return found[0][0]

            replayed = self._replay(leaf_tier, encoded, prefix, suffix, question)
            if not found:
                return Compressed(replayed, "computed", 0.0)
            tier, source = found[0]
            return Compressed(replayed, source, tier.seconds if source == "computed" else 0.0)
        full = mode == "full"
        key = self.keys.full(prefix, document, suffix) if full else self.keys.root(prefix, document, suffix)
        doc, source = self.document_cache.get_or_compute(
            key,
            lambda: self._compress_now(
                key, self.prompting.encode_document(prefix, document, suffix, full=full), full=full
            ),
            spec=self.full_cache_spec if full else self.root_spec,
        )
        return Compressed(doc, source, doc.stats.seconds if source == "computed" else 0.0)

    def leaf_tier(
        self, prefix: str, document: str, encoded: EncodedDocument | None = None
    ) -> tuple[LeafTier, CacheSource]:
        """The document's leaf tier (cached like a root): what every query-aware question replays from.
        ``encoded``: the call's encoding of prefix and document, where the caller has one."""
        key = self.keys.tier(prefix, document)

        def build() -> LeafTier:
            if encoded is not None:
                return self._build_tier(key, encoded)
            return self._build_tier(key, self.prompting.encode_document(prefix, document, ""))

        return self.document_cache.get_or_compute(key, build, spec=self.cache_spec)

    def compressor(
        self, prunes: bool, *, query_aware: bool, full: bool = False, final_cache_len: int | None = None
    ) -> TierCompressor:
        """A compressor with these settings; ``prunes``: it will prune (the calibration bias is read
        when its scoring needs one: question attention does not, so a first query-aware question
        never waits for a calibration); ``query_aware``: planned like a leaf tier, scoring with the
        question in the suffix; ``full``: one chunk as long as the model's window, nothing pruned (a
        plain prefill); ``final_cache_len``: select this many tokens instead of the configured number."""
        c, window = self.config, self.prompting.context_window
        scoring = self.question_scoring if query_aware else self.scoring
        reads_bias = prunes and scoring.needs_calibration
        bias = self.calibration.bias(progress=self.progress is not False) if reads_bias else None
        settings = CompressorSettings(
            max_chunk_len=window if full else c.max_chunk_len,
            warmup_layers=c.warmup_layers,
            final_cache_len=window if full else final_cache_len or c.final_cache_len,
            scoring=scoring,
            # The shared suffix's length, so the tier splits the document exactly as the shared root
            # does and no question changes the tree's shape (a question's longer suffix makes merged
            # nodes that many tokens longer than max_chunk_len, still far inside the model's window;
            # planning for a longer suffix made taller trees of half-empty leaves that scored lower).
            suffix_reserve=self.prompting.shared_suffix_len if query_aware else 0,
            want_logits=query_aware and not self.prompting.reask_question,
        )
        return TierCompressor(
            self.stack,
            settings,
            bias,
            self.prune_observer,
        )

    def unit_ids(self, document: str, document_ids: torch.Tensor, unit: str) -> torch.Tensor | None:
        """Unit index ``[N]`` of every document token for ``unit`` (a ``Scoring.unit``; None: single tokens)."""
        none = document_ids[:0]
        return EncodedDocument(document, none, document_ids, none, self.prompting.tokenizer).units(unit)

    def _progress(self, total: int, desc: str) -> tqdm:
        disable = True if self.progress is False else None
        return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=disable, leave=False)

    def _compress_now(self, key: str, encoded: EncodedDocument, *, full: bool = False) -> CompressedDocument:
        prompt_len = encoded.prompt_len
        prunes = not full and prompt_len > self.config.final_cache_len
        if prunes:
            check_room(encoded.fixed_len, self.config.final_cache_len)
        compressor = self.compressor(prunes, query_aware=False, full=full)
        root: SharedRoot = TreeRoot() if full else self.recipe.shared_root  # a full prefill prunes nothing
        with self._progress(encoded.document_ids.numel(), "HOMER compress") as bar:
            span = RootSpan(
                encoded,
                word_ids=encoded.units(self.scoring.unit) if prunes else None,
                repeat_ids=self.repeat_ids,
                prunes=prunes,
                progress=bar.update,
            )
            result = root.build(compressor, span)
        doc = _document(key, result, prompt_len, None)
        logger.info(
            "compressed %d document tokens into %d cache tokens in %.1fs (tree height %d)",
            doc.stats.document_tokens,
            doc.stats.cache_tokens,
            doc.stats.seconds,
            doc.stats.tree_height,
        )
        return doc

    def _build_tier(self, key: str, encoded: EncodedDocument) -> LeafTier:
        compressor = self.compressor(False, query_aware=True)
        with self._progress(encoded.document_ids.numel(), "HOMER leaf tier") as bar:
            tier = compressor.build_leaf_tier(
                encoded.prefix_ids,
                encoded.document_ids,
                encoded.units(self.question_scoring.unit),
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

    def _replay(
        self, leaf_tier: Callable[[], LeafTier], encoded: EncodedDocument, prefix: str, suffix: str, question: str
    ) -> CompressedDocument:
        """The query-aware compression of ``encoded`` (whose suffix, the ``suffix`` text, holds ``question``;
        ``prefix``: the prefix text, for the key); ``leaf_tier()`` gives the document's leaf tier, for a replay
        that reads one."""
        prompt_len = encoded.prompt_len
        prunes = prompt_len > self.config.final_cache_len
        if prunes:
            check_room(encoded.fixed_len, self.config.final_cache_len)

        def reread() -> Reread:
            lexical = self.question_scoring.lexical
            extra = self._lexical(lexical, encoded, question) if lexical and prunes else None
            window = self.prompting.context_window
            passages = functools.partial(self._passages, encoded)
            return Reread(encoded, extra, question, window, passages, self._read_rate)

        def compressor(reserved: int) -> TierCompressor:
            budget = self.config.final_cache_len - reserved
            return self.compressor(prunes, query_aware=True, final_cache_len=budget)

        result = self.recipe.replay.replay(leaf_tier, encoded.suffix_ids, compressor, reread)
        tier_key = self.keys.tier(prefix, encoded.text)
        key = hashlib.sha256(f"{tier_key}\0{json.dumps(markup(suffix).segments)}".encode()).hexdigest()
        return _document(key, result, prompt_len, question)

    def _read_rate(self) -> float:
        """Tokens per second this machine re-reads with the model (``homer.budget.read_rate``)."""
        return read_rate(self.stack.layers, self.stack.dtype, self.stack.device)

    def _lexical(self, lexical: LexicalEvidence, encoded: EncodedDocument, question: str) -> torch.Tensor | None:
        """The document tokens [E] ``lexical`` keeps for ``question``; None where statements do not line up."""
        statements = self._statements(encoded)
        if statements is None:
            return None
        return lexical.tokens(question, statements, self.config.final_cache_len)

    def _statements(self, encoded: EncodedDocument) -> Statements | None:
        """The document's BM25 statements (None where offsets do not line up), kept for its next questions."""
        return self._indexes.get(("statements", encoded.text), lambda: _of_statements(encoded, Statements.of))

    def _passages(self, encoded: EncodedDocument, selection: PassageSelection) -> Passages | None:
        """The document's passages as ``selection`` groups them, kept for its next questions."""
        return self._indexes.get(
            ("passages", encoded.text, selection), lambda: _of_statements(encoded, selection.passages)
        )


class EntrySpecs(NamedTuple):
    """What each kind of document-cache entry looks like; disk entries are checked against it."""

    tier: CacheSpec
    """HOMER's entries: a leaf tier's plan, a tree or flat root's positions."""
    root: CacheSpec
    """Shared roots: a root re-read by a prefill (recompute, headwise) numbers its tokens 0..K-1, up to
    the model's window."""
    full: CacheSpec
    """``full`` entries: uncompressed, positions and length up to the model's window."""


def entry_specs(
    stack: DecoderStack, config: HomerConfig, shared_root: SharedRoot, window: int, vocab_size: int | None
) -> EntrySpecs:
    """The ``EntrySpecs`` of ``config``'s entries on ``stack`` with ``shared_root`` (``window``: the model's
    context window)."""
    tier = CacheSpec(
        num_layers=stack.num_layers,
        num_kv_heads=stack.num_kv_heads,
        head_dim=stack.head_dim,
        dtype=stack.dtype,
        max_positions=config.max_chunk_len,
        max_tokens=config.final_cache_len,
        vocab_size=vocab_size,
    )
    root = replace(tier, max_positions=window) if shared_root.rereads else tier
    return EntrySpecs(tier, root, replace(tier, max_positions=window, max_tokens=window))


def entry_keys(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    stack: DecoderStack,
    config: HomerConfig,
    recipe: Recipe,
    scoring: Scoring,
    tier_unit: str,
    calibration_id: str,
) -> DocumentKeys:
    """Document-cache keys of ``config``'s entries: the model, tokenizer and algorithm they come from, and
    what shapes a root (settings, ``recipe.shared_root``, ``scoring``, calibration) or a leaf tier (its plan,
    ``tier_unit``). ``recipe.replay`` and ``reask_question`` shape no stored entry: a leaf tier serves every
    replay, and a replayed root is not stored."""
    identity = {
        "algorithm": ALGORITHM_VERSION,
        "model": weights_fingerprint(model),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "dtype": str(stack.dtype),
    }
    root = {
        "settings": config.model_dump(mode="json", exclude={"mode"}),
        "shared_root": repr(recipe.shared_root),
        "scoring": repr(scoring),
        "calibration": calibration_id,
        "calibration_segments": recipe.calibration_segments,
    }
    tier = {
        "settings": {
            "kind": "leaf_tier",
            "max_chunk_len": config.max_chunk_len,
            "warmup_layers": config.warmup_layers,
            "document_suffix": config.document_suffix,  # the split is planned for the shared suffix's length
            "unit": tier_unit,
        }
    }
    return DocumentKeys(identity, root, tier)


class RecentIndexes:
    """The last ``size`` indexes of documents (statements, passages), by a key that holds the text."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._kept: OrderedDict[tuple, object] = OrderedDict()

    def get(self, key: tuple, build: Callable[[], T]) -> T:
        """The index under ``key``, built by ``build()`` the first time."""
        if key in self._kept:
            self._kept.move_to_end(key)
        else:
            self._kept[key] = build()
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return self._kept[key]  # type: ignore[return-value]


def _of_statements(
    encoded: EncodedDocument, index: Callable[[PreTrainedTokenizerBase, torch.Tensor, torch.Tensor], T]
) -> T | None:
    """``index(tokenizer, document_ids, statements)`` of ``encoded``; None where statements do not line up."""
    units = encoded.units("statement")
    return None if units is None else index(encoded.tokenizer, encoded.document_ids, units)


def check_room(fixed_tokens: int, budget: int) -> None:
    """Raise ``PromptTooLongError`` when the prompt around the document, which is never pruned,
    leaves the compressed cache no room for the document (``budget``: ``final_cache_len``); warn when it
    leaves the document less than half of it."""
    if fixed_tokens >= budget:
        raise PromptTooLongError(
            f"the prompt around the document (system prompt, instructions, question, template) is "
            f"{fixed_tokens} tokens and is never pruned, which leaves no room for the document in "
            f"final_cache_len={budget}: shorten that text, move it into the document, or raise final_cache_len"
        )
    if 2 * fixed_tokens > budget:
        # RULER's vt at 4k, 8x: a 412-token few-shot example left the document 41 of 481 tokens
        logger.warning(
            "the prompt around the document is %d tokens and is never pruned: the document keeps only "
            "%d of final_cache_len=%d tokens; shorten that text, move it into the document, or raise "
            "final_cache_len",
            fixed_tokens,
            budget - fixed_tokens,
            budget,
        )


def _document(key: str, result: CompressionResult, prompt_len: int, question: str | None) -> CompressedDocument:
    stats = CompressionStats(
        document_tokens=result.plan.document_len,
        prompt_tokens=prompt_len,
        cache_tokens=cached_tokens(result.keys, result.head_lengths),
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
        head_lengths=result.head_lengths,
    )
