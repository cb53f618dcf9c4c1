"""``ModeCalls``: what an engine's call about a document does in its mode.

For a call in a mode (already resolved, ``HomerModel.mode_for``) this lays the prompt out around the
document (``prompting``), asks the mode's unit (``modes``) for the entry the call reads or prepares,
and answers after it (``answering``). ``HomerModel.compress``, ``entry_key``, ``cache_document`` and
``run`` are its door.
"""

from __future__ import annotations

from homer_integrations.engine.answering import Answerer, AnswerStream
from homer_integrations.engine.modes import KEPT_FORMS, Prepared
from homer_integrations.engine.prompting import Prompting
from homer_integrations.engine.tiers import DocumentTiers
from homer_integrations.homer.config import Mode, resolve_mode
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.kv.compressed import CompressedDocument


class ModeCalls:
    """Calls about a document over one engine's ``prompting``, ``tiers`` and ``answerer``."""

    def __init__(self, prompting: Prompting, tiers: DocumentTiers, answerer: Answerer) -> None:
        self.prompting = prompting
        self.tiers = tiers
        self.answerer = answerer

    def compress(self, text: str, question: str | None, mode: Mode, *, requested: bool) -> CompressedDocument:
        """``text`` compressed in ``mode``; a unit that asks the question, given none, falls back to ``shared``
        unless that mode was ``requested`` by the caller (then it is refused)."""
        form = KEPT_FORMS[mode]
        if form.asks and question is None and not requested:
            form = KEPT_FORMS["shared"]  # nothing to steer the selection: the question-independent root
        layout = self.prompting.layout(question or "", form.mode)
        asked = question if form.asks else None
        if asked is not None:  # compressed with the document: within the question's limit
            self.prompting.check_question(asked, allow_empty=True)
        return form.compress(self.tiers, layout.prefix, text, layout.suffix, asked).document

    def entry_key(self, document: str, mode: Mode) -> str:
        """The key of ``document``'s stored entry in ``mode``, laid out with no question."""
        layout = self.prompting.layout("", mode)
        return KEPT_FORMS[mode].key(self.tiers, layout.prefix, document, layout.suffix)

    def cache_document(self, document: str, mode: Mode, prefix: str | None, suffix: str | None) -> Prepared:
        """``document``'s entry in ``mode`` looked up or computed (``KeptForm.prepare``); ``prefix`` and
        ``suffix`` default to the layout with no question."""
        layout = self.prompting.layout("", mode)
        prefix = layout.prefix if prefix is None else prefix
        suffix = layout.suffix if suffix is None else suffix
        return KEPT_FORMS[mode].prepare(self.tiers, prefix, document, suffix)

    def run(
        self, document: str | CompressedDocument, question: str, mode: Mode, options: GenerationOptions
    ) -> AnswerStream:
        """The answer to a checked ``question`` about ``document``: from the entry of ``mode`` for a text, or
        after a ``CompressedDocument`` (one compressed query-aware for another question is refused)."""
        if isinstance(document, CompressedDocument):  # it answers in the mode it was compressed in
            mode = resolve_mode(compressed=document, window=self.prompting.context_window)
        layout = self.prompting.layout(question, mode)
        if not isinstance(document, CompressedDocument):
            asked = question if KEPT_FORMS[mode].asks else None
            return self.answerer.answer_span(
                layout.prefix, document, layout.suffix, layout.continuation, options, question=asked, mode=mode
            )
        if document.question is not None and document.question != question:
            raise ValueError(
                "this document was compressed query-aware for another question; compress it again "
                "with this question, or use shared mode to reuse one cache for every question"
            )
        stream = self.answerer.continue_from(document, layout.continuation, options)
        stream.info.mode = mode
        return stream
