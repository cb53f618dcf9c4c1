"""``HomerQueryEngine``: answers queries over whole documents, each compressed once by HOMER.

Several documents: BM25 over the whole documents picks at most ``max_documents`` of them for
each query (cheap, and documents never picked are never compressed). Each picked document
answers from its own compressed cache; with more than one answer, a short final call of the LLM
combines them (``combine_template``). ``max_documents=None`` asks every document.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    PydanticResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import Document, NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode
from pydantic import BaseModel

from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.engine.model import AnswerStream, HomerModel
from homer_integrations.engine.prompting import check_text
from homer_integrations.homer.config import Mode, check_mode
from homer_integrations.homer.decoding.constraints import ResponseFormat
from homer_integrations.homer.kv.compressed import CompressionStats
from homer_integrations.llama_index.llm import HomerLLM

DEFAULT_COMBINE_TEMPLATE = PromptTemplate(
    "Several documents were asked the same question. Their answers:\n"
    "{answers}\n\n"
    "Question: {query_str}\n"
    "Combine these answers into one short answer."
)

STATS_KEY = "homer"
"""Node-metadata key holding the answer statistics (cache source, tokens, compression)."""


def query_text(query: Any) -> str:
    """The question of a query engine's ``QueryBundle``, checked as ``HomerModel`` checks a question: text,
    not empty, no lone surrogate (``BaseQueryEngine.query`` hands anything that is not a ``str`` on as it is)."""
    if not isinstance(query, QueryBundle):
        hint = ": decode it first" if isinstance(query, bytes | bytearray | memoryview) else ""
        raise TypeError(f"the query must be text (str) or a QueryBundle, not {type(query).__name__}{hint}")
    check_text(query.query_str, "question")
    if not query.query_str.strip():
        raise ValueError("the question is empty")
    return query.query_str


class HomerQueryEngine(BaseQueryEngine):
    """Answer queries over whole documents with HOMER: one compression per document, reused.

    Args:
        documents: the documents, answered whole (never split into chunks).
        llm: the ``HomerLLM`` whose engine and generation settings answer; built on
            ``engine`` (or the embedded default model) when omitted.
        engine: a ``HomerModel`` to use when ``llm`` is omitted.
        streaming: ``query`` returns a ``StreamingResponse`` (``aquery`` an ``AsyncStreamingResponse``).
        max_documents: documents answered per query when there are several (BM25-ranked);
            None answers every document.
        combine_template: prompt of the final call that merges several answers
            (``{answers}``, ``{query_str}``).
        mode: HOMER mode of every answer: ``query_aware`` (each query compressed with the document,
            from its cached leaf tier), ``shared`` (one compressed cache per document) or ``full``
            (uncompressed, must fit the window); None: the LLM's ``mode``, else the engine's configured
            one (``query_aware`` by default).
        output_cls: a pydantic model class: every answer (and the combining call) is decoded under its
            JSON schema and the response is a ``PydanticResponse`` holding a validated instance.
            Not with ``streaming``.

    A response's source nodes are the spans of each answered document its answer was read from
    (``AnswerInfo.sources``: at most five, by the attention the answer paid them; its score is that share):
    each node's text is the span, ``start_char_idx``/``end_char_idx`` its place and ``ref_doc_id`` the
    document; where no spans were recorded, the whole document. Under ``metadata["homer"]``: the mode that
    served, the cache source (``computed``, ``memory``, ``disk``), token counts and compression statistics
    (for a streaming response, the spans and final statistics once it is consumed). ``response.metadata``
    maps each document id to that metadata.
    """

    def __init__(
        self,
        documents: Sequence[Document],
        llm: HomerLLM | None = None,
        *,
        engine: HomerModel | None = None,
        streaming: bool = False,
        max_documents: int | None = 2,
        combine_template: BasePromptTemplate | None = None,
        callback_manager: CallbackManager | None = None,
        mode: Mode | None = None,
        output_cls: type[BaseModel] | None = None,
    ) -> None:
        if output_cls is not None and streaming:
            raise ValueError("output_cls needs a whole answer to validate: use streaming=False")
        if not documents:
            raise ValueError("HomerQueryEngine needs at least one document")
        for doc in documents:
            if not doc.text or not doc.text.strip():
                raise ValueError(f"document {doc.doc_id!r} is empty")
        if max_documents is not None and max_documents < 1:
            raise ValueError("max_documents must be at least 1 (or None for every document)")
        if llm is not None and engine is not None and llm.engine is not engine:
            raise ValueError("llm and engine disagree: pass one of them")
        self._llm = llm if llm is not None else HomerLLM(engine=engine)
        self._documents = list(documents)
        self._streaming = streaming
        self._max_documents = max_documents
        self._combine_template = combine_template or DEFAULT_COMBINE_TEMPLATE
        self._ranker: Any = None
        self._mode = check_mode(mode)
        self._format = ResponseFormat.json_schema(output_cls) if output_cls is not None else None
        super().__init__(callback_manager=callback_manager)

    @classmethod
    def from_directory(cls, path: str | Path, *, recursive: bool = True, **kwargs: Any) -> HomerQueryEngine:
        """Read every supported file under ``path`` whole (see ``HomerDirectoryReader``) and query them."""
        from homer_integrations.llama_index.readers import read_directory

        return cls(read_directory(path, recursive=recursive), **kwargs)

    @property
    def llm(self) -> HomerLLM:
        return self._llm

    @property
    def engine(self) -> HomerModel:
        return self._llm.engine

    @property
    def documents(self) -> list[Document]:
        return list(self._documents)

    @property
    def mode(self) -> Mode:
        """The HOMER mode this engine answers in (its own, else the LLM's, else the engine's default)."""
        return self._llm.call_mode({"mode": self._mode})

    def precompress(self) -> list[CompressionStats | None]:
        """Prepare every document now (cached), rather than at its first query (``HomerLLM.precompress``):
        its leaf tier in ``query_aware`` mode (None in the list), else its kept cache's statistics (``auto``: the
        whole prefill of a document that fits the model's window)."""
        return [self._llm.precompress(doc.text, mode=self._mode) for doc in self._documents]

    # ----------------------------------------------------------------------------- prompts
    def _get_prompts(self) -> PromptDictType:
        return {"combine_template": self._combine_template}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "combine_template" in prompts:
            self._combine_template = prompts["combine_template"]

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    # ----------------------------------------------------------------------------- selection
    def select(self, query: str) -> list[tuple[Document, float | None]]:
        """The documents this query is answered from, with their BM25 scores (None: not ranked)."""
        limit = self._max_documents
        if limit is None or len(self._documents) <= limit:
            return [(doc, None) for doc in self._documents]
        if self._ranker is None:
            from llama_index.retrievers.bm25 import BM25Retriever

            self._ranker = BM25Retriever.from_defaults(nodes=self._documents, similarity_top_k=len(self._documents))
        by_id = {doc.doc_id: doc for doc in self._documents}
        ranked = [(by_id[n.node.node_id], float(n.score or 0.0)) for n in self._ranker.retrieve(query)]
        matching = [(doc, score) for doc, score in ranked if score > 0]
        # no query word occurs anywhere: fall back to the documents' own order
        return (matching or [(doc, 0.0) for doc in self._documents])[:limit]

    # ----------------------------------------------------------------------------- answering
    def _source_node(self, doc: Document, score: float | None, stream: AnswerStream) -> NodeWithScore:
        """The whole document as the answer's source: what stands until the answer cites its spans."""
        return NodeWithScore(node=self._text_node(doc, doc.doc_id, doc.text, stream.info.as_dict()), score=score)

    @staticmethod
    def _text_node(doc: Document, node_id: str, text: str, stats: dict[str, Any], **span: Any) -> TextNode:
        return TextNode(
            id_=node_id,
            text=text,
            metadata={**doc.metadata, STATS_KEY: stats},
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=doc.doc_id)},
            excluded_llm_metadata_keys=[*doc.excluded_llm_metadata_keys, STATS_KEY],
            excluded_embed_metadata_keys=[*doc.excluded_embed_metadata_keys, STATS_KEY],
            **span,
        )

    def _cited(self, doc: Document, node: NodeWithScore, stream: AnswerStream) -> list[NodeWithScore]:
        """The spans of ``doc`` the finished answer was read from (``AnswerInfo.sources``), one node each,
        scored by their share of the answer's attention; the whole document's ``node`` where none were
        recorded. They share ``node``'s statistics."""
        stats = node.node.metadata[STATS_KEY]
        return [
            NodeWithScore(
                node=self._text_node(
                    doc,
                    f"{doc.doc_id}:{s.start}-{s.end}",
                    doc.text[s.start : s.end],
                    stats,
                    start_char_idx=s.start,
                    end_char_idx=s.end,
                ),
                score=s.score,
            )
            for s in stream.info.sources
        ] or [node]

    def _start(self, query: str) -> tuple[Iterator[str], list[NodeWithScore]]:
        """Compress what is needed and start the answer: (text pieces, source nodes).

        The pieces' generator fills in the nodes' final statistics when it ends.
        """
        chosen = self.select(query)
        asked, constrained = query, {}
        if self._format is not None:  # the note goes after the question, outside the compressed cache
            asked, constrained = f"{query}\n{self._format.instructions()}", {"response_format": self._format}
        if len(chosen) == 1:
            doc, score = chosen[0]
            stream = self._llm.answer_stream(asked, doc.text, mode=self._mode, **constrained)
            nodes = [self._source_node(doc, score, stream)]
            return self._finishing(stream, doc, nodes), nodes
        cited: list[NodeWithScore] = []
        answers = []
        for doc, score in chosen:
            stream = self._llm.answer_stream(asked, doc.text, mode=self._mode, **constrained)
            answer = stream.text().strip()
            node = self._source_node(doc, score, stream)
            node.node.metadata[STATS_KEY]["answer"] = answer
            answers.append(f"- {doc.doc_id}: {answer}")
            cited += self._cited(doc, node, stream)
        prompt = self._combine_template.format(answers="\n".join(answers), query_str=asked)
        pieces = (r.delta or "" for r in self._llm.stream_complete(prompt, **constrained))
        return pieces, cited

    def _finishing(self, stream: AnswerStream, doc: Document, nodes: list[NodeWithScore]) -> Iterator[str]:
        """``stream``'s pieces; once they end, the statistics are final and ``nodes`` (the list the response
        holds) becomes the spans the answer cites."""
        yield from stream
        (node,) = nodes
        node.node.metadata[STATS_KEY].update(stream.info.as_dict())
        nodes[:] = self._cited(doc, node, stream)

    @staticmethod
    def _metadata(nodes: list[NodeWithScore]) -> dict[str, Any]:
        """Each source document's metadata and statistics, by document id."""
        return {n.node.ref_doc_id or n.node.node_id: n.node.metadata for n in nodes}

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        pieces, nodes = self._start(query_text(query_bundle))
        if self._streaming:
            return StreamingResponse(response_gen=pieces, source_nodes=nodes, metadata=self._metadata(nodes))
        text = "".join(pieces).strip()
        if self._format is not None:
            return PydanticResponse(self._format.parse(text), source_nodes=nodes, metadata=self._metadata(nodes))
        return Response(response=text, source_nodes=nodes, metadata=self._metadata(nodes))

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        if not self._streaming:
            return await asyncio.to_thread(self._query, query_bundle)
        pieces, nodes = await asyncio.to_thread(self._start, query_text(query_bundle))
        return AsyncStreamingResponse(
            response_gen=iterate_in_thread(lambda: pieces), source_nodes=nodes, metadata=self._metadata(nodes)
        )
