"""``HomerQueryEngine``: one compression per document however many queries.

The compression-counting tests are plumbing, so they run on ``tiny_llm``: a tiny random-weight Llama with
the real SmolLM2 tokenizer (``mode_engine``, ``max_chunk_len`` 128: the 2,400-token excerpt is a 19-leaf
tree) whose answers are arbitrary tokens, checked by count (``num_output`` of them), never by wording.
The rest answers with the embedded SmolLM2 (``llm``).
"""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT
from llama_index.core.schema import Document

from homer_integrations.llama_index import HomerLLM, HomerQueryEngine

pytestmark = pytest.mark.real_model

QUESTIONS = [
    "Who is Mr. Bingley?",
    "What does Mrs. Bennet want for her daughters?",
    "Where is Netherfield Park?",
    "How many daughters do the Bennets have?",
    "Who is Elizabeth?",
]


@pytest.fixture(scope="module")
def llm(smol_engine) -> HomerLLM:
    return HomerLLM(engine=smol_engine, num_output=6)


@pytest.fixture(scope="module")
def tiny(tokenizer, calibration):
    """One engine for the module over a tiny Llama, so a later test finds what an earlier one compressed."""
    from tests.conftest import mode_engine

    return mode_engine(tokenizer, calibration, mode="shared")


@pytest.fixture(scope="module")
def tiny_llm(tiny) -> HomerLLM:
    return HomerLLM(engine=tiny, num_output=6)


def computations(engine) -> int:
    return engine.document_cache.stats().computations


def homer_stats(response) -> dict:
    (node,) = response.source_nodes
    return node.node.metadata["homer"]


def full_answer(response) -> bool:
    """The (random) model answered with all ``num_output`` tokens, and they are not blank."""
    return bool(str(response.response).strip()) and homer_stats(response)["output_tokens"] == 6


def test_five_queries_one_compression(tiny_llm, tiny, excerpt):
    doc = Document(text=excerpt, id_="pride-ch1", metadata={"title": "Pride and Prejudice"})
    engine = HomerQueryEngine([doc], llm=tiny_llm)
    streaming = HomerQueryEngine([doc], llm=tiny_llm, streaming=True)
    before = computations(tiny)

    responses = [engine.query(q) for q in QUESTIONS[:4]]
    streamed = streaming.query(QUESTIONS[4])
    assert isinstance(streamed, StreamingResponse)
    assert streamed.metadata["pride-ch1"]["homer"]["output_tokens"] == 0  # not consumed yet
    pieces = list(streamed.response_gen)

    assert computations(tiny) - before == 1
    assert all(isinstance(r, Response) and full_answer(r) for r in responses)
    assert "".join(pieces).strip()
    sources = [homer_stats(r)["cache_source"] for r in responses] + [homer_stats(streamed)["cache_source"]]
    assert sources == ["computed", "memory", "memory", "memory", "memory"]

    first = homer_stats(responses[0])
    assert first["document_tokens"] == tiny.prompting.count_tokens(excerpt)
    assert first["cache_tokens"] <= tiny.config.max_chunk_len
    assert first["compression"]["leaves"] >= first["document_tokens"] // tiny.config.max_chunk_len
    assert first["compression_ratio"] > 2
    assert responses[0].source_nodes[0].node.node_id == "pride-ch1"
    assert responses[0].source_nodes[0].node.metadata["title"] == "Pride and Prejudice"
    assert homer_stats(streamed)["output_tokens"] == 6  # filled in once the stream ended


def test_llm_prompts_holding_the_document_reuse_its_cache(tiny_llm, tiny, excerpt, events):
    """After the query engine compressed the excerpt, HomerLLM finds it in any prompt: explicitly
    (completion and chat), inside LlamaIndex's own QA template (as a synthesizer hands it over),
    and in a conversation."""
    llm = tiny_llm
    llm.precompress(excerpt)  # a cache hit when the test above ran first
    before = computations(tiny)

    explicit = llm.complete("Who is Mr. Bingley?", document=excerpt)
    templated = llm.complete(DEFAULT_TEXT_QA_PROMPT.format(context_str=excerpt, query_str="Who is Mrs. Bennet?"))
    chat = llm.chat(
        [
            ChatMessage(role=MessageRole.USER, content=f"Read this chapter.\n\n{excerpt}\n\nWho is Jane?"),
            ChatMessage(role=MessageRole.ASSISTANT, content="The eldest Bennet daughter."),
            ChatMessage(role=MessageRole.USER, content="And Lydia?"),
        ]
    )

    explicit_chat = llm.chat([ChatMessage(role=MessageRole.USER, content="Who is Mr. Bennet?")], document=excerpt)

    assert computations(tiny) == before
    answers = (explicit, templated, chat, explicit_chat)
    for stats in (a.additional_kwargs for a in answers):
        assert stats["cache_source"] == "memory"
        assert stats["document_tokens"] == tiny.prompting.count_tokens(excerpt)
        assert stats["cache_read"] > 0 and stats["cache_creation"] == 0
    end = [e for e in events.events if type(e).__name__ == "LLMCompletionEndEvent"][-1]
    assert end.response.additional_kwargs["cache_source"] == "memory"


async def test_concurrent_aqueries_share_one_compression(tiny_llm, tiny, novel):
    start = novel.index("Not all that Mrs. Bennet")  # chapter 3: a document no other test compresses
    text = tiny.tokenizer.decode(tiny.prompting.token_ids(novel[start:])[:2000])
    engine = HomerQueryEngine([Document(text=text, id_="pride-ch3")], llm=tiny_llm)
    before = computations(tiny)

    responses = await asyncio.gather(*(engine.aquery(q) for q in QUESTIONS[:3]))

    assert computations(tiny) - before == 1
    assert sorted(homer_stats(r)["cache_source"] for r in responses) == ["computed", "memory", "memory"]
    assert all(full_answer(r) for r in responses)

    streaming = HomerQueryEngine([Document(text=text, id_="pride-ch3")], llm=tiny_llm, streaming=True)
    streamed = await streaming.aquery(QUESTIONS[3])
    assert isinstance(streamed, AsyncStreamingResponse)
    pieces = [p async for p in streamed.async_response_gen()]
    assert "".join(pieces).strip()
    assert homer_stats(streamed)["cache_source"] == "memory"
    assert computations(tiny) - before == 1


LIGHTHOUSE = (
    "Tobias Wren kept the lighthouse on Gull Point for forty years. Every night he climbed the "
    "ninety steps, trimmed the wick and polished the great lens. Ships passing the reef "
    "blinked their lamps to thank the lighthouse keeper. "
) * 2
BAKERY = (
    "The bakery on Mill Street sells rye bread, almond cakes and cinnamon buns. The baker, "
    "Marta Lind, starts the ovens at four in the morning and sells out of buns by nine. "
) * 2


def test_several_documents_bm25_picks_then_combines(llm, smol_engine, events):
    docs = [Document(text=BAKERY, id_="bakery"), Document(text=LIGHTHOUSE, id_="lighthouse")]

    picked = HomerQueryEngine(docs, llm=llm, max_documents=1).query("Who keeps the lighthouse on Gull Point?")
    assert {n.node.ref_doc_id for n in picked.source_nodes} == {"lighthouse"}
    for n in picked.source_nodes:  # the spans of the document the answer was read from
        assert n.node.text == LIGHTHOUSE[n.node.start_char_idx : n.node.end_char_idx] and n.node.text.strip()
    assert picked.source_nodes[0].score > 0
    assert "QueryEndEvent" in events.names()

    combined = HomerQueryEngine(docs, llm=llm, max_documents=None).query("Who works early in the morning?")
    assert {n.node.ref_doc_id for n in combined.source_nodes} == {"bakery", "lighthouse"}
    assert all(n.node.metadata["homer"]["answer"] for n in combined.source_nodes)
    assert combined.response
    # the combining call goes through HomerLLM, so LlamaIndex sees an LLM event for it
    assert "LLMCompletionEndEvent" in events.names()


def test_bad_input_is_refused(llm):
    with pytest.raises(ValueError, match="at least one document"):
        HomerQueryEngine([], llm=llm)
    with pytest.raises(ValueError, match="'blank' is empty"):
        HomerQueryEngine([Document(text="  ", id_="blank")], llm=llm)
    with pytest.raises(ValueError, match="max_documents"):
        HomerQueryEngine([Document(text="x")], llm=llm, max_documents=0)
