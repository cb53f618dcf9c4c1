"""Lexical evidence: BM25 over statements, its budget, and the per-question re-read keeping what it found."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.scoring.lexical import BM25Index, LexicalEvidence, Statements
from tests.conftest import mode_engine

TEXT = (
    "The garden was quiet that morning. Nobody had seen the gardener since Tuesday. "
    "The parcel from Bristol held exactly seventeen silver spoons. The cook said nothing about it. "
    "Rain fell over the hills until dusk."
)


@pytest.fixture(scope="module")
def statements(tokenizer) -> tuple[Statements, torch.Tensor]:
    ids = encode(tokenizer, TEXT)
    units = unit_ids(tokenizer, TEXT, "statement")
    return Statements.of(tokenizer, ids, units), units


def test_statements_keep_their_token_spans_and_bm25_finds_the_one_asked(statements) -> None:
    index, units = statements
    assert index.counts.sum() == units.numel() and index.counts.numel() == int(units.max()) + 1
    (best, *_) = index.index.search("How many silver spoons came in the parcel from Bristol?", 3)
    assert "seventeen silver spoons" in best.text
    assert torch.equal(units[index.tokens(best.index)], torch.full_like(index.tokens(best.index), best.index))


def test_the_lexical_side_stays_within_its_share_of_the_budget(statements) -> None:
    index, _ = statements
    question = "Who saw the gardener in the garden, and what did the cook say about the parcel?"
    chosen = LexicalEvidence(share=0.5).tokens(question, index, budget=60)
    assert 0 < chosen.numel() <= 30 and torch.equal(chosen, chosen.sort().values)
    assert chosen.unique().numel() == chosen.numel()
    assert LexicalEvidence(share=0.01).tokens(question, index, budget=60).numel() == 0, "no statement fits"
    with pytest.raises(ValueError, match="share"):
        LexicalEvidence(share=1.5)


def test_a_per_question_reread_keeps_the_statement_bm25_found(tokenizer, tmp_path, novel) -> None:
    """With the tiny random model, attention alone keeps arbitrary tokens; the lexical side keeps the asked fact."""
    fact = "The parcel from Bristol held exactly seventeen silver spoons."
    document = novel[30_000:31_500] + "\n\n" + fact + "\n\n" + novel[31_500:33_000]
    question = "How many silver spoons were in the parcel from Bristol?"
    engine = mode_engine(tokenizer, tmp_path, final_cache_len=96)
    plain = engine.compress(document, question=question, mode="query_aware")
    tiers = engine.tiers
    tiers.question_scoring = replace(tiers.question_scoring, lexical=LexicalEvidence(share=0.25))
    hybrid = engine.compress(document, question=question, mode="query_aware")
    fact_tokens = set(_token_span(tokenizer, document, document.index(fact), fact))
    kept = set(hybrid.origin[hybrid.origin >= 0].tolist())
    assert fact_tokens <= kept, "every token of the statement BM25 found is re-read"
    assert not fact_tokens <= set(plain.origin[plain.origin >= 0].tolist()), "attention alone lost some of it"
    assert hybrid.origin.numel() <= plain.origin.numel() + 1, "within the same budget"


def _token_span(tokenizer, text: str, start: int, span: str) -> list[int]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a >= start and b <= start + len(span) and b > a]


def test_bm25_index_stems_so_inflections_match() -> None:
    chunks = ["Catherine married Henry Tilney at Fullerton.", "General Tilney returned to Northanger Abbey."]
    stemmed = BM25Index(chunks)
    assert [h.index for h in stemmed.search("Whom does Catherine marry?", k=2)] == [0]
    assert [h.index for h in stemmed.search("Who returns to the abbey?", k=2)] == [1]
    # as written, "marry" is not "married", nor "returns" "returned": only the shared names match
    plain = BM25Index(chunks, stemmer=None)
    assert plain.search("Whom does anyone marry?", k=2) == []
    assert [h.index for h in plain.search("Who returns to the abbey?", k=2)] == [1]  # "abbey" alone
    with pytest.raises(ValueError, match=r"'klingon' is not a Snowball stemmer; known: .*english"):
        BM25Index(chunks, stemmer="klingon")


def test_unspaced_cjk_text_is_matched_by_character_pairs() -> None:
    """A run of CJK characters was one BM25 word: a question never found its passage (issue 82, item 15)."""
    from homer_integrations.homer.scoring.lexical import BM25Index, cjk_bigrams

    assert cjk_bigrams("東京都 in Japan") == " 東京 京都  in Japan"
    passages = ["会議は火曜日に第四十二会議室で開かれます。", "金庫の暗証番号は四三二一です。", "天気は晴れです。"]
    assert BM25Index(passages).search("金庫の暗証番号は何ですか？")[0].index == 1
    assert BM25Index(passages).search("会議はいつですか")[0].index == 0
    assert BM25Index(["The vault code is 4321.", "Rain."]).search("vault code")[0].index == 0, "spaced text as before"
