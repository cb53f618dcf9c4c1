"""The retrieval side of the router: BM25 over chunks of the documents, answered by ``HomerLLM``.

A stock ``RetrieverQueryEngine`` over llama-index-retrievers-bm25's ``BM25Retriever``; chunks
are cut by ``SentenceSplitter`` counting the model's own tokens, and the hits are answered with
the excerpt prompt shared with the LangChain router (``homer_integrations.routing``) through
``ExcerptSynthesizer``. Everything is local: no embeddings, no tiktoken, no global Settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.schema import BaseNode, Document
from llama_index.core.types import RESPONSE_TEXT_TYPE
from llama_index.retrievers.bm25 import BM25Retriever

from homer_integrations.llama_index.llm import HomerLLM
from homer_integrations.routing import retrieval_prompt


class ExcerptSynthesizer(BaseSynthesizer):
    """Answers from retrieved chunks with one short prompt (the shared excerpt prompt).

    ``instruction`` closes the prompt instead of the default rule (self-route's "write unanswerable").
    """

    def __init__(
        self,
        llm: HomerLLM,
        *,
        instruction: str | None = None,
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        tokenizer = llm.engine.token_ids
        super().__init__(
            llm=llm,
            callback_manager=callback_manager,
            prompt_helper=PromptHelper.from_llm_metadata(llm.metadata, tokenizer=tokenizer),
            streaming=streaming,
        )
        self._homer_llm = llm
        self.instruction = instruction

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        """The excerpt prompt is shared with LangChain and not a LlamaIndex template."""

    def get_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        prompt = retrieval_prompt(query_str, text_chunks, self.instruction)
        if self._streaming:
            return (r.delta or "" for r in self._homer_llm.stream_complete(prompt, **response_kwargs))
        return self._homer_llm.complete(prompt, **response_kwargs).text.strip()

    async def aget_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> RESPONSE_TEXT_TYPE:
        prompt = retrieval_prompt(query_str, text_chunks, self.instruction)
        if self._streaming:
            responses = await self._homer_llm.astream_complete(prompt, **response_kwargs)

            async def deltas() -> Any:
                async for r in responses:
                    yield r.delta or ""

            return deltas()
        return (await self._homer_llm.acomplete(prompt, **response_kwargs)).text.strip()


def chunk_nodes(
    documents: Sequence[Document], llm: HomerLLM, chunk_size: int = 256, overlap: int = 32
) -> list[BaseNode]:
    """Split ``documents`` into chunks of about ``chunk_size`` model tokens."""
    splitter = SentenceSplitter(chunk_size=chunk_size, chunk_overlap=overlap, tokenizer=llm.engine.token_ids)
    return splitter.get_nodes_from_documents(list(documents))


def bm25_query_engine(
    documents: Sequence[Document],
    llm: HomerLLM,
    *,
    chunk_size: int = 256,
    similarity_top_k: int = 3,
    instruction: str | None = None,
    streaming: bool = False,
    retriever: BM25Retriever | None = None,
) -> RetrieverQueryEngine:
    """A ``RetrieverQueryEngine``: BM25 top-``similarity_top_k`` chunks, answered by ``llm``.

    Pass ``retriever`` to reuse an index (e.g. one engine per instruction over the same chunks).
    """
    if retriever is None:
        nodes = chunk_nodes(documents, llm, chunk_size)
        retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=similarity_top_k)
    synthesizer = ExcerptSynthesizer(llm, instruction=instruction, streaming=streaming)
    return RetrieverQueryEngine(retriever=retriever, response_synthesizer=synthesizer)
