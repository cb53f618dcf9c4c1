"""``HomerCorpusQA`` on a tiny random-weight engine: RetrievalQA's output shape, cited ranges of the documents."""

from __future__ import annotations

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from homer_integrations.langchain import ChatHomer, HomerCorpusQA
from tests.test_corpus_questions import QUESTION, corpus_engine, short_texts


@pytest.fixture(scope="module")
def engine(tokenizer, calibration):
    return corpus_engine(tokenizer, calibration)


@pytest.fixture(scope="module")
def documents(novel: str) -> list[Document]:
    texts = short_texts(novel)
    return [Document(page_content=text, metadata={"source": name, "author": "A."}) for name, text in texts.items()]


def assert_cited(output: dict, documents: list[Document]) -> None:
    by_source = {d.metadata["source"]: d for d in documents}
    assert set(output) == {"answer", "source_documents"} and isinstance(output["answer"], str)
    assert output["source_documents"]
    for cited in output["source_documents"]:
        meta = cited.metadata
        original = by_source[meta["source"]]
        assert original.page_content[meta["start_index"] : meta["end_index"]] == cited.page_content
        assert meta["author"] == "A." and "Document: " not in cited.page_content


def test_invoke_answers_with_retrieval_qas_source_documents(engine, documents) -> None:
    qa = HomerCorpusQA(ChatHomer(engine=engine, max_tokens=2), documents)
    output = qa.invoke(QUESTION)
    assert_cited(output, documents)
    assert_cited(qa.invoke({"query": QUESTION}, max_tokens=1), documents)


def test_stream_gives_the_sources_first_then_pieces_that_add_up(engine, documents) -> None:
    qa = HomerCorpusQA(engine, documents)

    class Ends(BaseCallbackHandler):
        def __init__(self) -> None:
            self.outputs: list[dict] = []

        def on_chain_end(self, outputs, **kwargs) -> None:
            self.outputs.append(outputs)

    ends = Ends()
    chunks = list(qa.stream({"question": QUESTION}, {"callbacks": [ends]}, max_tokens=3))
    assert "source_documents" in chunks[0] and all(set(c) == {"answer"} for c in chunks[1:])
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    assert_cited(total, documents)
    assert ends.outputs[-1]["answer"] == total["answer"], "the run's output is the whole answer"


def test_documents_are_named_by_source_else_by_position_and_bad_input_is_refused(engine, novel) -> None:
    qa = HomerCorpusQA(engine, ["First text.", Document(page_content="Second.", metadata={"source": "s.txt"})])
    assert [d.name for d in qa.corpus] == ["document 1", "s.txt"]
    same = [Document(page_content=t, metadata={"source": "same.pdf"}) for t in ("One.", "Two.")]
    with pytest.raises(ValueError, match=r"two documents are named 'same\.pdf'"):
        HomerCorpusQA(engine, same)
    with pytest.raises(ValueError, match="no documents"):
        HomerCorpusQA(engine, [])
    with pytest.raises(ValueError, match="input must be a question"):
        qa.invoke({"text": QUESTION})
    with pytest.raises(TypeError, match="unsupported call options"):
        qa.invoke(QUESTION, document="x")
    with pytest.raises(ValueError, match="question is empty"):
        qa.invoke(" ")
