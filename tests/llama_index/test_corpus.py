"""``HomerCorpusQueryEngine`` on a tiny random-weight engine: source nodes are cited ranges of the documents."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.schema import Document

from homer_integrations.llama_index import HomerCorpusQueryEngine, HomerLLM
from tests.test_corpus_questions import QUESTION, corpus_engine, short_texts


@pytest.fixture(scope="module")
def llm(tokenizer, calibration) -> HomerLLM:
    return HomerLLM(engine=corpus_engine(tokenizer, calibration), num_output=2)


@pytest.fixture(scope="module")
def documents(novel: str) -> list[Document]:
    return [Document(text=text, metadata={"file_name": name}) for name, text in short_texts(novel).items()]


def assert_cited(response, documents: list[Document]) -> None:
    by_id = {d.doc_id: d for d in documents}
    assert response.source_nodes
    for scored in response.source_nodes:
        node, doc = scored.node, by_id[scored.node.ref_doc_id]
        assert doc.text[node.start_char_idx : node.end_char_idx] == node.text
        assert node.metadata == doc.metadata and "Document: " not in node.text


def test_query_cites_ranges_of_the_documents_with_the_answers_statistics(llm, documents) -> None:
    qe = HomerCorpusQueryEngine(documents, llm)
    assert [d.name for d in qe.corpus] == ["x.txt", "y.txt", "z.txt"]
    response = qe.query(QUESTION)
    assert isinstance(response, Response) and isinstance(response.response, str)
    assert_cited(response, documents)
    stats = response.metadata["homer"]
    assert stats["mode"] == "query_aware" and stats["output_tokens"] == 2


def test_streaming_and_async_queries_cite_the_same_way(llm, documents) -> None:
    qe = HomerCorpusQueryEngine(documents, llm, streaming=True)
    streamed = qe.query(QUESTION)
    assert isinstance(streamed, StreamingResponse)
    "".join(streamed.response_gen)
    assert_cited(streamed, documents)
    assert streamed.metadata["homer"]["finish_reason"] is not None, "complete once consumed"

    async def consume() -> AsyncStreamingResponse:
        response = await qe.aquery(QUESTION)
        async for _ in response.response_gen:
            pass
        return response

    assert_cited(asyncio.run(consume()), documents)


def test_from_directory_and_bad_input(llm, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("The first document.")
    (tmp_path / "b.md").write_text("The second document.")
    qe = HomerCorpusQueryEngine.from_directory(tmp_path, llm=llm)
    assert [d.text for d in qe.corpus] == ["The first document.", "The second document."]
    assert HomerCorpusQueryEngine([Document(text="x")], engine=llm.engine).llm.engine is llm.engine
    with pytest.raises(ValueError, match="no documents"):
        HomerCorpusQueryEngine([], llm)
    with pytest.raises(ValueError, match="disagree"):
        HomerCorpusQueryEngine([Document(text="x")], llm, engine=object())
    with pytest.raises(ValueError, match="question is empty"):
        qe.query(" ")
