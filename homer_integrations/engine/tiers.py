"""``DocumentTiers``: one engine's document entries: their keys, and each looked up or computed.

Three kinds of entry stand for a document in the document cache:
- the ``shared`` root: one compression with a question-independent suffix;
- a ``full`` prefill: the whole prompt, uncompressed;
- the leaf tier: what every ``query_aware`` question replays pruning and the upper levels from.

The cache keys (``keys``), the pruning recipes (``scoring``, ``question_scoring``) and the
calibration they use live here; a call encodes its document once (``Prompting.encode_document``) and
an ``EntryBuilder`` (``builder``) computes what the cache does not hold, or a question's replayed root.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.cache import CacheSource, DocumentCache
from homer_integrations.cache.keys import DocumentKeys
from homer_integrations.cache.leaf_stash import LeafStashInStore
from homer_integrations.engine.builder import EntryBuilder, RecentIndexes
from homer_integrations.engine.prompting import Prompting
from homer_integrations.homer.config import HomerConfig
from homer_integrations.homer.document.encoded import EncodedDocument
from homer_integrations.homer.document.prompt import encode, markup
from homer_integrations.homer.kv.compressed import CacheSpec, CompressedDocument
from homer_integrations.homer.layers.nodes import PruneObserver
from homer_integrations.homer.leaves.leaf_reuse import LeafIndex, LeafReuse
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.model.fingerprint import tokenizer_fingerprint, weights_fingerprint
from homer_integrations.homer.reading.passages import Passages, PassageSelection
from homer_integrations.homer.reading.strategies import Recipe, SharedRoot, WindowRoot
from homer_integrations.homer.scoring.calibration import Calibration, CalibrationStore
from homer_integrations.homer.scoring.chain import REPEAT_PROMPT, Scoring
from homer_integrations.paths import PACKAGE_DATA, bundled_text, cache_root

ALGORITHM_VERSION = 1
"""Bumped whenever compression changes its output for the same settings: old cache entries then miss."""


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
        recipe: how entries are built (``homer.reading.strategies.Recipe``; default: the package's). Shared roots
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
        self._model, self._tokenizer = model, tokenizer
        self._recipe = recipe = recipe or Recipe()
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
        self._key_entries()
        # A document's BM25 statements and passages, asked for by every question on it; keyed by the text.
        self._indexes = RecentIndexes()
        # Where each leaf of the tiers built or read was seen, so an edited document's tier copies the
        # leaves its edit did not touch (content-defined leaves only: even ones all move with an edit).
        self.leaf_index = LeafIndex(self.keys.tier("", "")) if c.split == "content" else None
        self.prune_observer: PruneObserver | None = None
        """Diagnostics: called with every node's ``PruneEvent`` during compressions computed from now on."""

    @property
    def recipe(self) -> Recipe:
        """The shared root's builder, the replay, the scoring and the calibration's size. Set again (as
        benchmarks do), the keys and entry specs follow it: a root built another way is another entry."""
        return self._recipe

    @recipe.setter
    def recipe(self, recipe: Recipe) -> None:
        self._recipe = recipe
        self._key_entries()

    def _key_entries(self) -> None:
        """``keys`` (document-cache keys of the ``root``, ``full`` and ``tier`` entries) and the specs
        (``cache_spec``, ``root_spec``, ``full_cache_spec``: what each kind of entry looks like, which a
        disk entry is checked against) for the recipe as it is now."""
        model, c = self._model, self.config
        self.keys = entry_keys(
            model,
            self._tokenizer,
            self.stack,
            c,
            self._recipe,
            self.scoring,
            self.question_scoring.unit,
            self.calibration.id,
        )
        self.cache_spec, self.root_spec, self.full_cache_spec = entry_specs(
            self.stack,
            c,
            self._recipe.shared_root,
            self.prompting.context_window,
            getattr(model.get_output_embeddings(), "out_features", None),
        )

    def with_cache(self, document_cache: DocumentCache) -> DocumentTiers:
        """These tiers (same keys and settings) over another document cache."""
        other = copy.copy(self)
        other.document_cache = document_cache
        return other

    def root(self, prefix: str, document: str, suffix: str, *, full: bool = False) -> Compressed:
        """The cached root of prefix + document + suffix: the compressed ``shared`` root, or (``full``) the
        whole prompt prefilled uncompressed (it must fit the model's window); looked up or computed."""
        self.prompting.check_document(document)  # a cached entry is served without tokenizing the document
        key = self.keys.full(prefix, document, suffix) if full else self.keys.root(prefix, document, suffix)
        doc, source = self.document_cache.get_or_compute(
            key,
            lambda: self.builder().shared(
                key, self.prompting.encode_document(prefix, document, suffix, full=full), full
            ),
            spec=self.full_cache_spec if full else self.root_spec,
        )
        return Compressed(doc, source, doc.stats.seconds if source == "computed" else 0.0)

    def replay(self, prefix: str, document: str, suffix: str, question: str) -> Compressed:
        """``question``'s own root (``suffix`` holds it), replayed by the recipe from the document's leaf tier,
        looked up or built once (the source reported is the tier's); or, for a replay that reads the text
        alone (BM25 passages past the model's window), from the text with no tier (source ``computed``).
        The replayed root is not cached."""
        encoded = self.prompting.encode_document(prefix, document, suffix, asks=True)  # checks the document
        tier_key = self.keys.tier(prefix, document)
        found: list[tuple[LeafTier, CacheSource]] = []

        def leaf_tier() -> LeafTier:
            if not found:
                tier, source = self.leaf_tier(prefix, document, encoded, tier_key)
                found.append((tier.to(self.stack.device), source))
            return found[0][0]

        key = hashlib.sha256(f"{tier_key}\0{json.dumps(markup(suffix).segments)}".encode()).hexdigest()
        replayed = self.builder().replay(key, encoded, question, leaf_tier)
        if not found:
            return Compressed(replayed, "computed", 0.0)
        tier, source = found[0]
        return Compressed(replayed, source, tier.seconds if source == "computed" else 0.0)

    def leaf_tier(
        self, prefix: str, document: str, encoded: EncodedDocument | None = None, key: str | None = None
    ) -> tuple[LeafTier, CacheSource]:
        """The document's leaf tier (cached like a root): what every query-aware question replays from.
        ``encoded``: the call's encoding of prefix and document, ``key`` its tier key, where the caller has them."""
        key = self.keys.tier(prefix, document) if key is None else key
        encodings = [] if encoded is None else [encoded]

        def build() -> LeafTier:
            if not encodings:
                encodings.append(self.prompting.encode_document(prefix, document, ""))
            return self.builder().leaf_tier(key, encodings[0])

        tier, source = self.document_cache.get_or_compute(key, build, spec=self.cache_spec)
        index = self.leaf_index
        if index is not None and encodings and not index.has_tier(key):  # a tier read back: its leaves too
            ids = encodings[0]
            if ids.document_ids.numel() == tier.document_tokens and ids.prefix_ids.numel() == tier.plan.prefix_len:
                index.add(key, index.keys(ids.prefix_ids, ids.document_ids, tier.plan, tier.leaf_layers))
        return tier, source

    def _held_tier(self, key: str) -> LeafTier | None:
        """The leaf tier under ``key`` if the document cache holds it (memory or store); never computed."""
        entry = self.document_cache.get(key, spec=self.cache_spec)
        return entry if isinstance(entry, LeafTier) else None

    def _leaf_reuse(self) -> LeafReuse | None:
        """Where a leaf tier's build finds leaves already computed in the tiers this engine saw (a store's
        leaf entries are ``_leaf_stash``'s); None with even splits."""
        return None if self.leaf_index is None else LeafReuse(self.leaf_index, self._held_tier)

    def _leaf_stash(self) -> LeafStashInStore | None:
        """Where a content-split tier's build keeps each leaf as a store entry of its own (stored once, whatever
        documents hold it); None with even splits, whose leaves rarely recur, or without a store."""
        return None if self.leaf_index is None else self.document_cache.leaf_stash(self.cache_spec)

    def passages(self, document: str, selection: PassageSelection) -> Passages | None:
        """``document``'s passages as ``selection`` groups them (None where the tokenizer's offsets give no
        statements), kept for its next questions, as a replay's are."""
        ids, offsets = self.prompting.documents.ids(document)
        none = ids[:0]
        encoded = EncodedDocument(document, none, ids, none, self.prompting.tokenizer, offsets)
        return self.builder().passages(encoded, selection)

    def reads_tier(self, document_tokens: int) -> bool:
        """Whether a question about a document of ``document_tokens`` reads its leaf tier (``Replay.reads_tier``:
        past the model's window the default reads the text's passages and no tier)."""
        window, final = self.prompting.context_window, self.config.final_cache_len
        return self.recipe.replay.reads_tier(document_tokens, window, final)

    def unit_ids(self, document: str, document_ids: torch.Tensor, unit: str) -> torch.Tensor | None:
        """Unit index ``[N]`` of every document token for ``unit`` (a ``Scoring.unit``; None: single tokens)."""
        none = document_ids[:0]
        return EncodedDocument(document, none, document_ids, none, self.prompting.tokenizer).units(unit)

    def builder(self) -> EntryBuilder:
        """What computes this engine's entries, with the settings as they are now (a caller may have set
        ``recipe``, ``question_scoring`` or ``prune_observer`` since)."""
        return EntryBuilder(
            self.stack,
            self.prompting,
            self.recipe,
            self.scoring,
            self.question_scoring,
            self.calibration,
            self.repeat_ids,
            self.prune_observer,
            self.progress,
            self._indexes,
            self.document_cache.allocator,
            self._leaf_reuse,
            self._leaf_stash,
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
    if isinstance(shared_root, WindowRoot):  # its size is its own, up to the window: not the chunk's
        root = replace(root, max_tokens=window)
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
    if config.split != "even":  # only then: the keys of even splits are those of before the setting
        tier["settings"]["split"] = config.split
    return DocumentKeys(identity, root, tier)
