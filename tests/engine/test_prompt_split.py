"""How a long document is found inside a prompt (``homer_integrations.engine.prompt_split``).

Real SmolLM2 tokenizer and chat template; nothing is compressed here except where stated.
"""

from __future__ import annotations

import pytest

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.prompt_split import (
    MIN_KNOWN_CHARS,
    _longer_than,
    find_document_span,
    known_documents,
    long_prompt_default,
    remember_document,
    render_plain_text,
    split_prompt,
    start_answer,
)
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.reading.strategies import Recipe
from tests.conftest import tiny_model

STUFF = "Use the following context to answer.\n\n{context}\n\nQuestion: {question}\nAnswer:"
RAG = (
    "You are an assistant for question-answering tasks. Use the following pieces of retrieved "
    "context to answer the question.\nQuestion: {question} \nContext: {context} \nAnswer:"
)


@pytest.fixture(scope="module")
def engine(tokenizer) -> HomerModel:
    """A fresh engine (its own registry) over a tiny random model with the real tokenizer, splitting for the
    shared root unless a call names another mode (pinned: the default, ``query_aware``, puts the question in
    the suffix)."""
    config = HomerConfig(max_chunk_len=256, mode="shared")
    return HomerModel(tiny_model(), tokenizer, config, model_name="tiny", progress=False)


@pytest.fixture(scope="module")
def book(novel) -> str:
    """About 3,000 tokens of the novel, in paragraphs."""
    start = novel.index("It is a truth universally acknowledged")
    return novel[start : start + 12_000].rsplit("\n\n", 1)[0]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_stuff_prompt_finds_the_context_for_every_question(engine, book):
    splits = [split_prompt(engine, user(STUFF.format(context=book, question=q))) for q in ("Who?", "Where is it?")]
    for split, q in zip(splits, ("Who?", "Where is it?"), strict=True):
        assert split.found_by == "heuristic"
        assert split.document == book
        assert split.prefix == engine.prompting.layout("").prefix  # chat template head + default system prompt
        assert split.suffix == engine.config.document_suffix
        assert split.continuation.startswith("Use the following context to answer.\n\nQuestion: " + q)
        assert split.continuation.endswith("<|im_start|>assistant\n")
    assert splits[0].document == splits[1].document


def test_the_split_shares_its_cache_key_with_engine_run(engine, book):
    split = split_prompt(engine, user(STUFF.format(context=book, question="Who?")))
    layout = engine.prompting.layout("Who?")
    assert engine.tiers.keys.root(split.prefix, split.document, split.suffix) == engine.tiers.keys.root(
        layout.prefix, book, layout.suffix
    )


def test_langchain_stuff_documents_formatting(engine, book):
    """Several documents joined by blank lines (LangChain's stuff chains) form one span."""
    parts = book.split("\n\n")
    context = "\n\n".join(parts)
    split = split_prompt(engine, user(STUFF.format(context=context, question="What happened?")))
    assert split.document == context


def test_question_before_the_context_stays_out_of_the_document(engine, book):
    """The common RAG prompt puts the question first and the context on the same line."""
    a = split_prompt(engine, user(RAG.format(context=book, question="Who is Mr. Bingley?")))
    b = split_prompt(engine, user(RAG.format(context=book, question="Who lives at Longbourn?")))
    assert a.found_by == b.found_by == "heuristic"
    assert a.document == b.document
    assert "Mr. Bingley?" not in a.document and "Mr. Bingley?" in a.continuation
    assert a.document in book


def test_context_in_the_system_message_and_question_in_the_human_message(engine, book):
    messages = [
        {"role": "system", "content": f"Answer from this text.\n\n{book}"},
        {"role": "user", "content": "Who is Mr. Bingley?"},
    ]
    split = split_prompt(engine, messages)
    assert split.found_by == "heuristic"
    assert split.prefix == "<|im_start|>system\n"
    assert split.document in book and len(split.document) > 0.9 * len(book)
    assert split.continuation.rstrip().endswith("Who is Mr. Bingley?<|im_end|>\n<|im_start|>assistant")


def test_conversation_after_the_document_goes_into_the_continuation(engine, book):
    first = user(STUFF.format(context=book, question="Who?"))
    history = [*first, {"role": "assistant", "content": "Mr. Bingley."}, {"role": "user", "content": "And then?"}]
    one, more = split_prompt(engine, first), split_prompt(engine, history)
    assert (more.prefix, more.document, more.suffix) == (one.prefix, one.document, one.suffix)
    assert more.continuation.endswith(
        "<|im_start|>assistant\nMr. Bingley.<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert more.prompt == more.prefix + more.document + more.suffix + more.continuation


def test_a_stuffed_prompt_of_a_few_thousand_tokens_is_searched_whatever_the_chunk_length(tokenizer, book):
    """With a long chunk (the 1.5B's is 4,096 tokens) a 3,000-token "stuff" prompt ran plainly, prefilled again
    on every call; from 1,024 tokens on its document is found and kept."""
    model = tiny_model(max_position_embeddings=8192)
    engine = HomerModel(model, tokenizer, HomerConfig(max_chunk_len=4096), model_name="tiny", progress=False)
    assert long_prompt_default(engine) == 1024 < engine.config.max_chunk_len
    split = split_prompt(engine, user(STUFF.format(context=book, question="Who?")))
    assert split.found_by == "heuristic" and split.document == book and split.mode == "full"


def test_a_short_prompt_is_plain(engine):
    split = split_prompt(engine, user("Hello\n\nthere\n\nfriend"))
    assert split.found_by == "plain" and split.document is None
    assert split.prompt == engine.prompting.chat_prompt(user("Hello\n\nthere\n\nfriend"))


def test_explicit_document_wins_and_is_cut_out_where_it_stands(engine, book):
    short = book[:500]  # short enough to be plain without document=
    split = split_prompt(engine, user(f"Read: {short}\n\nQuestion: Who?"), document=short)
    assert split.found_by == "explicit" and split.document == short
    assert split.continuation.startswith("Read:\n\nQuestion: Who?")


def test_explicit_document_missing_from_the_messages_goes_first_in_the_first_user_message(engine, book):
    messages = [{"role": "system", "content": "Be brief."}, *user("Who is Mr. Bingley?")]
    split = split_prompt(engine, messages, document=book)
    assert split.found_by == "explicit" and split.document == book
    assert split.prefix == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert split.continuation == "Who is Mr. Bingley?<|im_end|>\n<|im_start|>assistant\n"
    # no system message: exactly the engine's own layout (one builder, markup included) in every
    # mode, so engine.run shares the cache
    for mode in ("shared", "query_aware", "full"):
        split = split_prompt(engine, user("Who is Mr. Bingley?"), document=book, mode=mode)
        layout = engine.prompting.layout("Who is Mr. Bingley?", mode)
        spans = [(t.segments) for t in (split.prefix, split.suffix, split.continuation)]
        assert spans == [t.segments for t in (layout.prefix, layout.suffix, layout.continuation)], mode


def test_an_empty_explicit_document_is_an_error(engine):
    with pytest.raises(ValueError, match="empty"):
        split_prompt(engine, user("Who?"), document="  \n")


def test_known_documents_are_found_in_short_prompts(tokenizer, book):
    engine = HomerModel(tiny_model(), tokenizer, HomerConfig(max_chunk_len=256), model_name="tiny", progress=False)
    text = book[:800]
    assert split_prompt(engine, user(f"Summarize:\n{text}\nThanks")).found_by == "plain"
    remember_document(engine, text)
    remember_document(engine, "too short to match ordinary prompts")
    assert known_documents(engine) == [text]
    split = split_prompt(engine, user(f"Summarize:\n{text}\nThanks"))
    assert split.found_by == "known" and split.document == text
    assert split.continuation.startswith("Summarize:\n\nThanks")
    assert len("too short to match ordinary prompts") < MIN_KNOWN_CHARS


def test_a_known_document_inside_a_larger_long_context_is_not_cut_out_alone(tokenizer, book):
    engine = HomerModel(tiny_model(), tokenizer, HomerConfig(max_chunk_len=256), model_name="tiny", progress=False)
    remember_document(engine, book[:800])
    split = split_prompt(engine, user(STUFF.format(context=book, question="Who?")))
    assert split.found_by == "heuristic" and split.document == book


def test_plain_text_rendering_keeps_the_prompt_as_is(engine, book):
    prompt = STUFF.format(context=book, question="Who?")
    split = split_prompt(engine, user(prompt), render=render_plain_text)
    assert split.prefix == "" and split.document == book
    assert split.continuation == "Use the following context to answer.\n\nQuestion: Who?\nAnswer:"


@pytest.mark.parametrize("reask", [True, False])
def test_query_aware_mode_compresses_the_question_with_the_document(tokenizer, book, reask):
    cfg = HomerConfig(max_chunk_len=256, mode="query_aware")
    recipe = Recipe(reask_question=reask)
    engine = HomerModel(tiny_model(), tokenizer, cfg, model_name="t", progress=False, recipe=recipe)
    split = split_prompt(engine, user(STUFF.format(context=book, question="Who?")))
    assert split.suffix.startswith(engine.config.document_suffix) and "Question: Who?" in split.suffix
    # re-asking keeps the question after the cache as well; the paper leaves nothing to feed there
    assert ("Question: Who?" in split.continuation) == reask
    assert (split.continuation == "") == (not reask)


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("Intro.\n\nA.\n\nB.\n\nQuestion?", "A.\n\nB."),  # paragraphs
        ("Intro.\nA.\nB.\nQuestion?", "A.\nB."),  # lines
        ("Intro. A. B. Question?", "A. B."),  # sentences
        ("no breaks at all", None),
    ],
)
def test_find_document_span_levels(text, span):
    found = find_document_span(text, lambda s: len(s) < 20)
    assert (text[found[0] : found[1]] if found else None) == span


def test_find_document_span_gives_up_when_head_or_tail_is_long():
    text = "A long head " * 10 + "\n\nmiddle\n\nshort"
    assert find_document_span(text, lambda s: len(s) < 20) is None


# ------------------------------------------------------------------------------------- modes
def test_the_call_mode_decides_the_split_and_none_follows_the_engine(engine, book):
    prompt = user(STUFF.format(context=book, question="Who?"))
    default, shared, full = (split_prompt(engine, prompt, mode=m) for m in (None, "shared", "full"))
    assert engine.config.mode == "shared" and default.mode == "shared" and full.mode == "full"
    assert default == shared
    # full keeps the same span, only uncompressed: the texts are those of shared
    assert (full.prefix, full.document, full.suffix, full.continuation) == (
        shared.prefix,
        shared.document,
        shared.suffix,
        shared.continuation,
    )
    aware = split_prompt(engine, prompt, mode="query_aware")
    assert aware.mode == "query_aware" and aware.document == shared.document
    assert "Question: Who?" in aware.suffix and "Question: Who?" not in shared.suffix
    assert split_prompt(engine, user("Hello")).mode is None, "a plain prompt has no mode"


@pytest.mark.parametrize("mode", ["fast", "", "QUERY_AWARE", 3])
def test_an_unknown_mode_is_refused_clearly(engine, mode):
    with pytest.raises(ValueError, match=r"unknown HOMER mode .*'shared', 'query_aware', 'full'"):
        split_prompt(engine, user("Hello"), mode=mode)


def test_start_answer_runs_the_split_in_its_mode_like_engine_run(tokenizer, tmp_path, book):
    cfg = HomerConfig(max_chunk_len=128, warmup_layers=3)
    recipe = Recipe(calibration_segments=2)
    engine = HomerModel(
        tiny_model(), tokenizer, cfg, calibration_dir=tmp_path, model_name="t", progress=False, recipe=recipe
    )
    options = GenerationOptions(max_new_tokens=2)
    text = book[:3000]
    kinds = {}
    for mode in ("query_aware", "query_aware", "full", None):
        split = split_prompt(engine, user("Who is Mr. Bingley?"), document=text, mode=mode)
        stream = start_answer(engine, split, options)
        stream.text()
        assert stream.info.mode == (mode or "full"), "auto keeps a document that fits the window whole"
        kinds[mode] = {e.kind for e in engine.document_cache.entries()}
        if stream.info.cache_source == "computed":
            assert stream.info.document_seconds > 0
        else:
            assert stream.info.document_seconds == 0
    assert kinds["query_aware"] == {"leaf_tier"}, "query_aware answers from the document's leaf tier"
    assert kinds["full"] == {"leaf_tier", "root"} and kinds[None] == {"leaf_tier", "root"}
    assert engine.document_cache.stats().computations == 2, "tier once, full prefill once (the default's too)"
    plain = start_answer(engine, split_prompt(engine, user("Hello")), options)
    plain.text()
    assert plain.info.mode is None and plain.info.cache_source is None


def test_long_prompts_are_told_from_short_ones_without_counting_them_whole(engine, book):
    prompt = engine.prompting.chat_prompt(user(STUFF.format(context=book, question="Who?")))
    tokens = engine.prompting.count_tokens(prompt)
    for limit in (100, 256, tokens // 2, tokens - 1, tokens, tokens + 1):
        assert _longer_than(engine, prompt, limit) == (tokens > limit), limit
    # a head keeps the template's markup, so its control tokens count as one token each
    assert prompt.head(len(prompt)).segments == prompt.segments
    assert prompt.head(12) == "<|im_start|>" and engine.prompting.count_tokens(prompt.head(12)) == 1
    assert engine.prompting.count_tokens(str(prompt)[:12]) > 1
