"""``HomerCorpusQueryEngine``: one query across many documents, answered with the text it was read from."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import Document, NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode

from homer_integrations.corpus.questions import Corpus, CorpusStream, NamedText, Source, document_name, stream_corpus
from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.engine.model import HomerModel
from homer_integrations.llama_index.llm import HomerLLM
from homer_integrations.llama_index.query_engine import STATS_KEY, query_text

NAME_KEYS = ("source", "file_path", "file_name")
"""Metadata that names a document in the corpus (the package's readers set ``source``, LlamaIndex's ``file_path``)."""


class HomerCorpusQueryEngine(BaseQueryEngine):
    """Answer a query across documents as one corpus (``homer_integrations.corpus``): the documents laid out as
    one text, one selection over all of them (BM25 passages past the model's window, HOMER's question-aware
    pruning within it), one answer, and the text it was read from.

    Args:
        documents: the documents; each is named by the first of ``NAME_KEYS`` in its metadata, else
            ``document <n>`` (1-based); names must differ.
        llm: the ``HomerLLM`` whose engine and generation settings answer (always in ``query_aware`` mode,
            whatever its ``mode``); built on ``engine`` (or the embedded default model) when omitted.
        engine: a ``HomerModel`` to use when ``llm`` is omitted.
        streaming: ``query`` returns a ``StreamingResponse`` (``aquery`` an ``AsyncStreamingResponse``).

    The response's ``source_nodes`` are the cited ranges in corpus order: a ``TextNode`` each, its text the
    cited text, ``start_char_idx`` / ``end_char_idx`` its offsets in its document's text, its metadata the
    document's and its ``ref_doc_id`` the document's id. ``response.metadata["homer"]``: the answer's
    statistics (mode, cache source, tokens, compression; complete once a streaming response is consumed).
    """

    def __init__(
        self,
        documents: Sequence[Document],
        llm: HomerLLM | None = None,
        *,
        engine: HomerModel | None = None,
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if llm is not None and engine is not None and llm.engine is not engine:
            raise ValueError("llm and engine disagree: pass one of them")
        self._llm = llm if llm is not None else HomerLLM(engine=engine)
        names = [document_name(d.metadata, i, NAME_KEYS) for i, d in enumerate(documents)]
        self._corpus = Corpus(NamedText(n, d.text, d.metadata) for n, d in zip(names, documents, strict=True))
        self._documents = dict(zip(names, documents, strict=True))
        self._streaming = streaming
        super().__init__(callback_manager=callback_manager)

    @classmethod
    def from_directory(cls, path: str | Path, *, recursive: bool = True, **kwargs: Any) -> HomerCorpusQueryEngine:
        """Read every supported file under ``path`` whole (see ``HomerDirectoryReader``) and query across them."""
        from homer_integrations.llama_index.readers import read_directory

        return cls(read_directory(path, recursive=recursive), **kwargs)

    @property
    def llm(self) -> HomerLLM:
        return self._llm

    @property
    def corpus(self) -> Corpus:
        """The documents as one ``Corpus`` (laid out once: every query reuses its text's tokens)."""
        return self._corpus

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        pass

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    def _node(self, source: Source) -> NodeWithScore:
        doc = self._documents[source.name]
        node = TextNode(
            text=source.text,
            metadata=dict(source.metadata),
            start_char_idx=source.start,
            end_char_idx=source.end,
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=doc.doc_id)},
            excluded_llm_metadata_keys=list(doc.excluded_llm_metadata_keys),
            excluded_embed_metadata_keys=list(doc.excluded_embed_metadata_keys),
        )
        return NodeWithScore(node=node)

    def _start(self, query: str) -> tuple[CorpusStream, list[NodeWithScore], dict[str, Any]]:
        generation = self._llm.generation_options().model_dump()
        stream = stream_corpus(self._llm.engine, self._corpus, query, **generation)
        return stream, [self._node(s) for s in stream.sources], {STATS_KEY: stream.info.as_dict()}

    @staticmethod
    def _finishing(stream: CorpusStream, metadata: dict[str, Any]) -> Iterator[str]:
        yield from stream
        metadata[STATS_KEY] = stream.info.as_dict()

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        stream, nodes, metadata = self._start(query_text(query_bundle))
        pieces = self._finishing(stream, metadata)
        if self._streaming:
            return StreamingResponse(response_gen=pieces, source_nodes=nodes, metadata=metadata)
        return Response(response="".join(pieces).strip(), source_nodes=nodes, metadata=metadata)

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        if not self._streaming:
            return await asyncio.to_thread(self._query, query_bundle)
        stream, nodes, metadata = await asyncio.to_thread(self._start, query_text(query_bundle))
        pieces = self._finishing(stream, metadata)
        return AsyncStreamingResponse(
            response_gen=iterate_in_thread(lambda: pieces), source_nodes=nodes, metadata=metadata
        )
