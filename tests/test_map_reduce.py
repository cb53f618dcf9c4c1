"""Map-reduce over kept pieces, on a tiny random-weight engine: each piece kept once, every piece read."""

from __future__ import annotations

import itertools

import pytest

from homer_integrations import HomerModel
from homer_integrations.map_reduce import MapReduce, MapReduceAnswer
from tests.test_document_cache import CONFIG, make_engine


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> HomerModel:
    # questions up to 128 tokens (max_chunk_len // 4): the map step's instruction follows each question
    config = CONFIG.model_copy(update={"max_chunk_len": 512})
    return make_engine(tokenizer, tmp_path_factory.mktemp("calibration"), config)


@pytest.fixture(scope="module")
def text(novel: str) -> str:
    return novel[20_000:32_000]  # about 2,700 tokens: past the tiny model's 2,048-token window


def test_pieces_cover_the_text_in_order_at_paragraph_ends_within_the_window(engine: HomerModel, text: str) -> None:
    reader = MapReduce(engine, piece_tokens=600)
    pieces = reader.pieces(text)
    assert len(pieces) >= 4
    assert all(a < b for a, b in pieces) and all(b <= c for (_, b), (c, _) in itertools.pairwise(pieces))
    assert not "".join(text[b:c] for (_, b), (c, _) in itertools.pairwise(pieces)).strip()
    assert all(engine.count_tokens(text[a:b]) <= 600 for a, b in pieces)
    assert all(text[b:].startswith("\n") or b == len(text.rstrip()) for _, b in pieces[:-1]), "cut inside a paragraph"
    assert MapReduce(engine, piece_tokens=100_000).piece_tokens < engine.context_window
    with pytest.raises(ValueError, match="no room"):
        MapReduce(SmallWindow())  # type: ignore[arg-type]


class SmallWindow:
    """What ``MapReduce`` reads of an engine before it refuses one: a window too small for a piece."""

    context_window = 1200


def test_every_piece_is_kept_once_and_read_for_each_question(engine: HomerModel, text: str) -> None:
    reader = MapReduce(engine, piece_tokens=600, note_tokens=4, progress=False)
    pieces = reader.prepare(text)
    built = engine.stats().computations
    assert reader.prepare(text) == pieces and engine.stats().computations == built, "kept pieces computed again"
    runs = []
    real = engine.run

    def counted(document, question, **kwargs):
        runs.append((document, kwargs.get("mode")))
        return real(document, question, **kwargs)

    engine.run = counted  # type: ignore[method-assign]
    try:
        answer = reader.answer(text, "Who visits whom?", max_new_tokens=4)
    finally:
        del engine.run
    assert isinstance(answer, MapReduceAnswer) and answer.pieces == pieces
    assert [d for d, _ in runs] == [text[a:b] for a, b in reader.pieces(text)] and {m for _, m in runs} == {"full"}
    assert engine.stats().computations == built, "a question recomputed a kept piece"
    assert len(answer.notes) + answer.empty == pieces
    assert all(0 <= s.start < s.end <= len(text) for s in answer.sources) and len(answer.sources) <= 5
    assert all(n.start <= s.start and s.end <= n.end for n in answer.notes for s in n.sources)
    assert answer.reads == pieces + 1 and answer.built_seconds == 0 and answer.cache_sources == ("memory",)
    assert answer.tokens_read >= engine.count_tokens(text) and answer.first_token_seconds is not None
    assert 0 < answer.first_token_seconds <= answer.map_seconds + answer.reduce_seconds


def test_notes_that_overflow_are_combined_in_halves_until_they_fit(engine: HomerModel, text: str) -> None:
    reader = MapReduce(engine, piece_tokens=600, note_tokens=24, progress=False, reduce_tokens=150)
    plain = []
    real = engine.generate

    def counted(prompt, **kwargs):
        plain.append(prompt)
        return real(prompt, **kwargs)

    engine.generate = counted  # type: ignore[method-assign]
    try:
        answer = reader.answer(text, "Who visits whom?", max_new_tokens=4)
    finally:
        del engine.generate
    assert len(answer.notes) == answer.pieces >= 4, "random weights never write NONE"
    assert len(plain) >= 3, "two halves combined (then the two into one where they still overflow), the final read"
    assert answer.reads == answer.pieces + len(plain)
    last = f"[part {len(answer.notes)}]"
    assert "[part 1]" in plain[0] and last not in plain[0] and last in plain[1], "the first round: the two halves"
