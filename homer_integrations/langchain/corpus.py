"""``HomerCorpusQA``: one question across many documents, answered with the text it was read from."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.utils import AddableDict

from homer_integrations.corpus.questions import Corpus, CorpusStream, NamedText, Source, document_name, stream_corpus
from homer_integrations.engine.model import HomerModel
from homer_integrations.langchain.chat_models import ChatHomer

CorpusInput = str | dict[str, Any]
QUESTION_KEYS = ("question", "query", "input")
"""Where a dict input holds its question (RetrievalQA's ``query``, LCEL's ``question`` / ``input``)."""
CALL_OPTIONS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "response_format"})
"""Generation options a call may override (``invoke(question, max_tokens=64)``); the model's are the defaults."""


class HomerCorpusQA(Runnable[CorpusInput, dict[str, Any]]):
    """Answers a question across ``documents`` as one corpus (``homer_integrations.corpus``): the documents
    laid out as one text, one selection over all of them (BM25 passages past the model's window, HOMER's
    question-aware pruning within it), one answer, and the text it was read from.

    ``model``: a ``ChatHomer`` (its engine and generation settings answer; always in ``query_aware`` mode,
    whatever its ``mode``) or a ``HomerModel``. Each document is named by its ``metadata["source"]``, else
    ``document <n>`` (1-based); names must differ.

    Input: a question, or a dict with ``question`` (or ``query`` / ``input``). Output, as ``RetrievalQA``
    with ``return_source_documents``: ``{"answer": str, "source_documents": [Document, ...]}``, one
    ``Document`` per cited range in corpus order: ``page_content`` the cited text, ``metadata`` the
    document's with ``source`` (its name), ``start_index`` and ``end_index`` (character offsets in its
    ``page_content``, ``start_index`` as text splitters' ``add_start_index`` sets it). ``stream`` yields the
    sources first, then the answer's pieces (``{"answer": piece}``), chunks that add up to the output.
    """

    def __init__(self, model: ChatHomer | HomerModel, documents: Sequence[Document | str]) -> None:
        self.model = model if isinstance(model, ChatHomer) else ChatHomer(engine=model)
        docs = [d if isinstance(d, Document) else Document(page_content=d) for d in documents]
        self.corpus = Corpus(
            NamedText(document_name(d.metadata, i), d.page_content, d.metadata) for i, d in enumerate(docs)
        )
        """The documents as one ``Corpus`` (laid out once: every question reuses its text's tokens)."""

    @staticmethod
    def question_of(value: CorpusInput) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            for key in QUESTION_KEYS:
                if isinstance(value.get(key), str):
                    return value[key]
        raise ValueError(f"HomerCorpusQA input must be a question or a dict with one of {QUESTION_KEYS}")

    @staticmethod
    def source_document(source: Source) -> Document:
        metadata = {**source.metadata, "source": source.name, "start_index": source.start, "end_index": source.end}
        return Document(page_content=source.text, metadata=metadata)

    def _start(self, value: CorpusInput, options: dict[str, Any]) -> CorpusStream:
        unknown = set(options) - CALL_OPTIONS
        if unknown:
            raise TypeError(f"unsupported call options: {sorted(unknown)}; supported: {sorted(CALL_OPTIONS)}")
        generation = self.model.generation_options(options.get("stop"), options).model_dump()
        return stream_corpus(self.model.resolve_engine(), self.corpus, self.question_of(value), **generation)

    def _answer(self, value: CorpusInput, options: dict[str, Any]) -> dict[str, Any]:
        answer = self._start(value, options).answer()
        return {"answer": answer.text, "source_documents": [self.source_document(s) for s in answer.sources]}

    def _pieces(self, values: Iterator[CorpusInput], options: dict[str, Any]) -> Iterator[AddableDict]:
        (value,) = values
        stream = self._start(value, options)
        yield AddableDict(answer="", source_documents=[self.source_document(s) for s in stream.sources])
        for piece in stream:
            yield AddableDict(answer=piece)

    def invoke(self, input: CorpusInput, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._call_with_config(lambda value: self._answer(value, kwargs), input, config, run_type="chain")

    def stream(self, input: CorpusInput, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[dict]:
        pieces = lambda values: self._pieces(values, kwargs)  # noqa: E731
        yield from self._transform_stream_with_config(iter([input]), pieces, config, run_type="chain")
