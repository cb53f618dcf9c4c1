"""Ways to keep a document: one unit per mode, what it keys, prepares once and reads for every question.

- ``SharedRoot`` (``shared``): one compressed root with a question-independent suffix, cached.
- ``WholePrefill`` (``full``): the whole prompt prefilled and kept uncompressed, cached; each question's
  passages echoed from it before the question (``homer.reading.echo``).
- ``PerQuestion`` (``query_aware``): the document's leaf tier, cached; each question's own root is replayed
  from it (or, past the window, its BM25 passages re-read) with the question in the suffix.

``auto`` is no unit: ``decide`` picks ``full`` or ``query_aware`` for each document. A new way to keep a
document is one more unit in ``KEPT_FORMS`` (and its name in ``homer.config.Mode``).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from homer_integrations.cache import CacheSource
from homer_integrations.engine.prompting import Prompting
from homer_integrations.engine.tiers import Compressed, DocumentTiers
from homer_integrations.homer.config import Mode
from homer_integrations.homer.kv.compressed import CompressionStats


class Prepared(NamedTuple):
    """A document's entry looked up or computed: its document tokens, where it came from (None when there is
    nothing to keep: past the window a ``query_aware`` question reads passages), and, for a cache that is
    itself the entry (``shared``, ``full``), its compression statistics."""

    document_tokens: int
    source: CacheSource | None
    stats: CompressionStats | None = None


class KeptForm:
    """One way to keep a document: the entry it keys, prepares once and answers every question from."""

    mode: ClassVar[Mode]
    asks: ClassVar[bool] = False
    """Whether a question is compressed with the document (laid out in its suffix), not only read after it."""
    echoes: ClassVar[bool] = False
    """Whether a question's passages are copied from the entry once more before it (``Recipe.echo``)."""

    def key(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> str:
        raise NotImplementedError

    def compress(
        self, tiers: DocumentTiers, prefix: str, document: str, suffix: str, question: str | None
    ) -> Compressed:
        """The cache a question about ``document`` is answered after (``question`` is used only if ``asks``)."""
        raise NotImplementedError

    def prepare(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> Prepared:
        """The entry every later question starts from, looked up or computed."""
        doc, source, _ = self.compress(tiers, prefix, document, suffix, None)
        return Prepared(doc.stats.document_tokens, source, doc.stats)


class SharedRoot(KeptForm):
    """``shared``: one compressed root for every question."""

    mode = "shared"

    def key(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> str:
        return tiers.keys.root(prefix, document, suffix)

    def compress(
        self, tiers: DocumentTiers, prefix: str, document: str, suffix: str, question: str | None
    ) -> Compressed:
        return tiers.root(prefix, document, suffix, full=False)


class WholePrefill(KeptForm):
    """``full``: the whole prompt prefilled once and kept uncompressed (it must fit the model's window)."""

    mode = "full"
    echoes = True

    def key(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> str:
        return tiers.keys.full(prefix, document, suffix)

    def compress(
        self, tiers: DocumentTiers, prefix: str, document: str, suffix: str, question: str | None
    ) -> Compressed:
        return tiers.root(prefix, document, suffix, full=True)


class PerQuestion(KeptForm):
    """``query_aware``: the leaf tier kept; each question's root replayed from it with the question."""

    mode = "query_aware"
    asks = True

    def key(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> str:
        return tiers.keys.tier(prefix, document)

    def compress(
        self, tiers: DocumentTiers, prefix: str, document: str, suffix: str, question: str | None
    ) -> Compressed:
        if question is None:
            raise ValueError("query_aware mode compresses the question with the document: pass question=")
        return tiers.replay(prefix, document, suffix, question)

    def prepare(self, tiers: DocumentTiers, prefix: str, document: str, suffix: str) -> Prepared:
        encoded = tiers.prompting.encode_document(prefix, document, "")  # its ids are kept for the tier
        tokens = encoded.document_ids.numel()
        if not tiers.reads_tier(tokens):
            return Prepared(tokens, None)
        tier, source = tiers.leaf_tier(prefix, document, encoded)
        return Prepared(tier.document_tokens, source)


KEPT_FORMS: dict[str, KeptForm] = {form.mode: form for form in (SharedRoot(), WholePrefill(), PerQuestion())}


def decide(mode: Mode, prompting: Prompting, document: str | None) -> Mode:
    """``mode`` with ``auto`` decided for ``document``: ``full`` when its prompt leaves room in the model's
    window for a question and its answer, else ``query_aware`` (``Prompting.whole_mode``); without a
    document ``auto`` stays."""
    return prompting.whole_mode(document) if mode == "auto" and document is not None else mode


def kept_form(mode: Mode, prompting: Prompting, document: str, question: str | None = None) -> KeptForm:
    """The unit that keeps ``document`` in ``mode`` (``auto`` decided, ``decide``). A per-question read
    with no question to steer it is the shared root, when the per-question path was not named but chosen
    by ``auto`` past the window."""
    concrete = decide(mode, prompting, document)
    if mode == "auto" and concrete == "query_aware" and question is None:
        concrete = "shared"
    return KEPT_FORMS[concrete]
