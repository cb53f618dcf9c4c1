"""Passage echo: which passages a question echoes, and their rows copied after a real ``full`` prefill."""

from __future__ import annotations

import pytest
import torch

from homer_integrations.homer.document.prompt import encode_offsets, units_at
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.echo import Echo, PassageEcho
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import Recipe
from tests.test_document_cache import make_engine


@pytest.fixture(scope="module")
def excerpt(novel: str) -> str:
    """About 1,100 tokens of *Pride and Prejudice*, the Netherfield ball's preparations among them."""
    start = novel.index("Not all that Mrs. Bennet")
    return novel[start : start + 5000]


def passages_of(tokenizer, text: str, selection: PassageSelection):
    ids, offsets = encode_offsets(tokenizer, text)
    return ids, selection.passages(tokenizer, ids, units_at(text, offsets, "statement"))


@pytest.mark.parametrize("fields", [{"tokens": 64}, {"tokens": 512.0}, {"min_document_tokens": -1}])
def test_settings_that_cannot_echo_a_passage_are_refused(fields: dict) -> None:
    with pytest.raises(ValueError, match="PassageEcho"):
        PassageEcho(**fields)


def test_a_question_echoes_the_best_passages_within_its_tokens(tokenizer, excerpt: str) -> None:
    echo = PassageEcho(tokens=256, min_document_tokens=0)
    ids, passages = passages_of(tokenizer, excerpt, echo.selection)
    taken = echo.document_tokens("Who was Mr. Bingley dancing with?", passages)
    assert taken is not None and 16 < taken.numel() <= 256
    assert torch.equal(taken, taken.unique()), "ascending, each token once"
    best = passages.index.search("Who was Mr. Bingley dancing with?", 1)[0].index
    assert bool(torch.isin(passages.tokens(best), taken).all()), "the best passage is echoed whole"
    assert "Bingley" in tokenizer.decode(ids[taken])


def test_no_echo_for_a_question_sharing_no_word_or_a_short_document(tokenizer, excerpt: str) -> None:
    echo = PassageEcho(min_document_tokens=0)
    _, passages = passages_of(tokenizer, excerpt, echo.selection)
    assert echo.document_tokens("xyzzy plugh?", passages) is None
    assert PassageEcho().document_tokens("Who was Mr. Bingley dancing with?", passages) is None, "under 2,048 tokens"


def test_echoed_rows_are_the_prefills_rows_moved_after_it(tokenizer, calibration, excerpt: str) -> None:
    engine = make_engine(tokenizer, calibration, recipe=Recipe(calibration_segments=2))
    doc = engine.compress(excerpt, mode="full")
    ids, passages = passages_of(tokenizer, excerpt, PassageSelection())
    taken = PassageEcho(min_document_tokens=0).document_tokens("Who was Mr. Bingley dancing with?", passages)
    stack = DecoderStack(engine.model)
    echo = Echo.of(stack, doc, taken)
    assert echo is not None and echo.tokens == taken.numel()
    assert torch.equal(doc.origin[echo.rows], taken), "each echoed row stands for its passage token"
    assert torch.equal(echo.values[2], doc.values[2][:, :, echo.rows]), "values carry no position: copied"
    start = doc.last_position + 1
    with torch.no_grad():  # layer 0's keys depend on the token and its position alone
        moved = engine.model(
            ids[taken][None], position_ids=torch.arange(start, start + taken.numel())[None], use_cache=True
        ).past_key_values
    torch.testing.assert_close(echo.keys[0], moved.layers[0].keys, atol=1e-4, rtol=0)
    assert Echo.of(stack, doc, torch.tensor([10**6])) is None, "a token the prefill does not hold"


def test_attention_to_echoed_rows_counts_for_the_rows_they_copy() -> None:
    echo = Echo(torch.tensor([1, 3]), (), ())
    folded = echo.fold(torch.tensor([0.1, 0.2, 0.0, 0.3, 0.05, 0.25]))
    torch.testing.assert_close(folded, torch.tensor([0.1, 0.25, 0.0, 0.55]))
