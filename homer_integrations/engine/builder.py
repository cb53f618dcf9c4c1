"""``EntryBuilder``: computes one engine's document entries from a call's ``EncodedDocument``.

``DocumentTiers`` keys the entries and looks them up; on a miss (or for a question's replay, never
stored) it hands the call's encoded document to a builder made from its current settings: the shared
root or full prefill (``shared``), the leaf tier (``leaf_tier``) and a question's root (``replay``).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from homer_integrations.engine.prompting import Prompting, PromptTooLongError
from homer_integrations.homer.document.encoded import EncodedDocument
from homer_integrations.homer.kv.compressed import CompressedDocument, CompressionStats, cached_tokens
from homer_integrations.homer.layers.nodes import CompressionResult, CompressorSettings, PruneObserver
from homer_integrations.homer.leaves.leaf_reuse import LeafReuse
from homer_integrations.homer.leaves.leaf_stash import LeafStash
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.leaves.tier_file import Allocate
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.budget import read_rate
from homer_integrations.homer.reading.passages import Passages, PassageSelection
from homer_integrations.homer.reading.strategies import Recipe, Reread, RootSpan, SharedRoot, TreeRoot
from homer_integrations.homer.scoring.calibration import Calibration
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.lexical import Statements
from homer_integrations.homer.tree.compressor import HomerCompressor

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class EntryBuilder:
    """The settings one computation reads: the model's ``stack``, the engine's ``prompting``, ``recipe``,
    ``scoring`` (shared roots) and ``question_scoring`` (query-aware), the ``calibration``, the
    reconstruction prompt ``repeat_ids`` [R], the pruning ``observer``, ``progress`` bars, the document
    ``indexes`` kept across calls, ``allocate(key)``, storage for a leaf tier (None: process memory), and
    ``leaf_reuse()``, where a leaf tier's build finds leaves already computed (None: nowhere)."""

    stack: DecoderStack
    prompting: Prompting
    recipe: Recipe
    scoring: Scoring
    question_scoring: Scoring
    calibration: Calibration
    repeat_ids: torch.Tensor
    observer: PruneObserver | None
    progress: bool | None
    indexes: RecentIndexes
    allocate: Callable[[str], Allocate | None]
    leaf_reuse: Callable[[], LeafReuse | None] = lambda: None
    leaf_stash: Callable[[], LeafStash | None] = lambda: None

    def compressor(
        self,
        prunes: bool,
        *,
        query_aware: bool,
        full: bool = False,
        final_cache_len: int | None = None,
        encoded: EncodedDocument | None = None,
    ) -> HomerCompressor:
        """A compressor with these settings; ``prunes``: it will prune (the calibration bias is read
        when its scoring needs one: question attention does not, so a first query-aware question
        never waits for a calibration); ``query_aware``: planned like a leaf tier, scoring with the
        question in the suffix; ``full``: one chunk as long as the model's window, nothing pruned (a
        plain prefill); ``final_cache_len``: select this many tokens instead of the configured number;
        ``encoded``: the document a ``content`` split will cut (at its statements)."""
        c, window = self.prompting.config, self.prompting.context_window
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
            split="even" if full else c.split,
            statements=None if encoded is None or c.split == "even" else encoded.units("statement"),
        )
        return HomerCompressor(self.stack, settings, bias, self.observer)

    def shared(self, key: str, encoded: EncodedDocument, full: bool = False) -> CompressedDocument:
        """The shared root of ``encoded`` (``full``: its uncompressed prefill), stored under ``key``."""
        budget = self.prompting.config.final_cache_len
        prunes = not full and encoded.prompt_len > budget
        if prunes:
            check_room(encoded.fixed_len, budget)
        compressor = self.compressor(prunes, query_aware=False, full=full, encoded=encoded)
        root: SharedRoot = TreeRoot() if full else self.recipe.shared_root  # a full prefill prunes nothing
        with self._progress(encoded.document_ids.numel(), "HOMER compress") as bar:
            word_ids = encoded.units(self.scoring.unit) if prunes else None
            span = RootSpan(encoded, word_ids, self.repeat_ids, prunes, progress=bar.update)
            result = root.build(compressor, span)
        doc = compressed_document(key, result, encoded.prompt_len, None)
        if prunes and encoded.document_ids.numel() > self.prompting.context_window:
            # Northanger Abbey whole (102k tokens, 50x), Qwen2.5-Coder-1.5B: its shared root answered 1 of 8
            # inserted facts and 4 of 23 story questions, the per-question path 8 and 14 (docs/benchmarks/whole_book.md)
            logger.warning(
                "the shared root keeps %d of this document's %d tokens (%.0fx), past the model's %d-token "
                "window: a root built without the question loses most facts at this length; ask in "
                "query_aware mode (the default) for answers that must be exact",
                doc.stats.cache_tokens,
                doc.stats.document_tokens,
                doc.stats.document_tokens / max(doc.stats.cache_tokens, 1),
                self.prompting.context_window,
            )
        logger.info(
            "compressed %d document tokens into %d cache tokens in %.1fs (tree height %d)",
            doc.stats.document_tokens,
            doc.stats.cache_tokens,
            doc.stats.seconds,
            doc.stats.tree_height,
        )
        return doc

    def leaf_tier(self, key: str, encoded: EncodedDocument) -> LeafTier:
        """The leaf tier of ``encoded``'s prefix and document, stored under ``key``."""
        compressor = self.compressor(False, query_aware=True, encoded=encoded)
        reuse = self.leaf_reuse()
        with self._progress(encoded.document_ids.numel(), "HOMER leaf tier") as bar:
            tier = compressor.leaves.build(
                encoded.prefix_ids,
                encoded.document_ids,
                encoded.units(self.question_scoring.unit),
                key=key,
                progress=bar.update,
                allocate=self.allocate(key) if self.stack.device.type == "cpu" else None,
                reuse=reuse,
                stash=self.leaf_stash() if self.stack.device.type == "cpu" else None,
            )
        if reuse is not None:
            reuse.built(key)
        logger.info(
            "leaf tier of %d document tokens: %d leaves (%d copied from held tiers) x %d layers, %.1f MB, %.1fs",
            tier.document_tokens,
            tier.plan.num_leaves,
            0 if reuse is None else reuse.copied,
            tier.leaf_layers,
            tier.nbytes / 1e6,
            tier.seconds,
        )
        return tier

    def replay(
        self, key: str, encoded: EncodedDocument, question: str, leaf_tier: Callable[[], LeafTier]
    ) -> CompressedDocument:
        """The query-aware root of ``encoded`` (its suffix holds ``question``) by the recipe's replay, named
        ``key``; ``leaf_tier()`` gives the document's leaf tier, for a replay that reads one."""
        budget = self.prompting.config.final_cache_len
        prunes = encoded.prompt_len > budget
        if prunes:
            check_room(encoded.fixed_len, budget)

        def reread() -> Reread:
            lexical = self.question_scoring.lexical
            statements = self._statements(encoded) if lexical and prunes else None
            extra = None if statements is None else lexical.tokens(question, statements, budget)
            passages = functools.partial(self.passages, encoded)
            return Reread(encoded, extra, question, self.prompting.context_window, passages, self._read_rate)

        def compressor(reserved: int) -> HomerCompressor:
            return self.compressor(prunes, query_aware=True, final_cache_len=budget - reserved)

        result = self.recipe.replay.replay(leaf_tier, encoded.suffix_ids, compressor, reread)
        return compressed_document(key, result, encoded.prompt_len, question)

    def _progress(self, total: int, desc: str) -> tqdm:
        disable = True if self.progress is False else None
        return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=disable, leave=False)

    def _read_rate(self) -> float:
        """Tokens per second this machine re-reads with the model (``homer.reading.budget.read_rate``)."""
        return read_rate(self.stack)

    def _statements(self, encoded: EncodedDocument) -> Statements | None:
        """The document's BM25 statements (None where offsets do not line up), kept for its next questions."""
        return self.indexes.get(("statements", encoded.text), lambda: _of_statements(encoded, Statements.of))

    def passages(self, encoded: EncodedDocument, selection: PassageSelection) -> Passages | None:
        """The document's passages as ``selection`` groups them, kept for its next questions."""
        key = ("passages", encoded.text, selection)
        return self.indexes.get(key, lambda: _of_statements(encoded, selection.passages))


class RecentIndexes:
    """The last ``size`` indexes of documents (statements, passages), by a key that holds the text; safe for
    the threads answering at once (every question of a ``full`` or past-the-window answer asks here)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._kept: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, build: Callable[[], T]) -> T:
        """The index under ``key``, built by ``build()`` the first time (once, whatever threads ask)."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]  # type: ignore[return-value]
            built = self._kept[key] = build()
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
            return built


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


def compressed_document(
    key: str, result: CompressionResult, prompt_len: int, question: str | None
) -> CompressedDocument:
    """``result`` as the ``CompressedDocument`` stored (or, for a ``question``'s replay, answered) under ``key``."""
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
