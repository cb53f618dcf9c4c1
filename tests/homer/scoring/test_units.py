"""Score units: max-pooling, word units (and the sentence ablation's unit ids), the sentence bonus, score memory."""

import torch

from homer_integrations.homer.document.prompt import unit_ids
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.scoring.pruning import keep_mask, standardise
from homer_integrations.homer.scoring.units import (
    MaxPool,
    ScoreMemory,
    SentenceBonus,
    UnitBestAndMean,
    WordUnits,
    pool_words,
)

TEXT = "He said so. The pass key is 66226. Remember it; yes\nChapter 10\n\nElizabeth Bennet smiled"


def chunk(reducible: list[bool]) -> Chunk:
    n = len(reducible)
    flags = torch.tensor(reducible)
    return Chunk(
        hidden=torch.zeros(1, n, 2),
        position_ids=torch.arange(n),
        reducible=flags,
        origin=torch.where(flags, torch.arange(n), -1),
        memory=torch.full((n,), float("-inf")),
        prefix_len=0 if reducible[0] else 1,
        suffix_len=0 if reducible[-1] else 1,
    )


def units(tokenizer, unit):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    return [(tokenizer.decode([i]), int(u)) for i, u in zip(ids, unit_ids(tokenizer, TEXT, unit), strict=True)]


def test_word_units_keep_numbers_and_names_whole(tokenizer):
    pairs = units(tokenizer, "word")
    digit_units = [u for t, u in pairs if t.isdigit()]
    assert digit_units == [digit_units[0]] * 5 + [digit_units[5]] * 2, "the key and the chapter number: one unit each"
    assert digit_units[0] != digit_units[5]
    bennet = {u for t, u in pairs if t in (" Benn", "et")}
    assert len(bennet) == 1
    assert unit_ids(tokenizer, TEXT, "token") is None


def test_sentence_units_end_at_punctuation_and_line_breaks(tokenizer):
    pairs = units(tokenizer, "sentence")
    unit_of = {t.strip(): u for t, u in pairs}
    assert unit_of["pass"] == unit_of["key"] == unit_of["6"]
    assert unit_of["He"] != unit_of["pass"] != unit_of["Remember"]
    assert unit_of["Chapter"] != unit_of["yes"] and unit_of["Chapter"] != unit_of["Elizabeth"]


def test_statement_units_go_on_past_colons_and_semicolons(tokenizer):
    text = "One of the numbers for wry-excellence is: 8121922.\nOne of the numbers for ill-embryo is: 27; or not"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]).strip() for i in ids]
    statement = unit_ids(tokenizer, text, "statement").tolist()
    sentence = unit_ids(tokenizer, text, "sentence").tolist()
    wry, digit = pieces.index("cell"), pieces.index("8")
    assert statement[wry] == statement[digit] and sentence[wry] != sentence[digit], "the key and its value: one unit"
    assert statement[digit] != statement[pieces.index("ill")], "a line break still ends a statement"
    ill = pieces.index("ill")
    assert statement[-1] == statement[ill] and sentence[-1] != sentence[ill], "nor does a semicolon"


def test_word_units_give_each_token_its_units_best_score():
    scores = torch.tensor([50.0, 1.0, 7.0, 2.0, 3.0, 0.5, 9.0])
    node = chunk([False, True, True, True, True, True, False])
    words = torch.tensor([-1, 0, 0, 1, 1, 2, -1])
    assert pool_words(scores, node.reducible, words).tolist() == [50.0, 7.0, 7.0, 3.0, 3.0, 0.5, 9.0]
    assert WordUnits()(scores, node, words).tolist() == [50.0, 7.0, 7.0, 3.0, 3.0, 0.5, 9.0]
    assert torch.equal(WordUnits()(scores, node, None), scores), "no unit ids: single tokens"


def test_word_units_pool_each_row_of_batched_scores_on_its_own():
    scores = torch.tensor([[[5.0, 1.0, 2.0, 9.0, 0.0], [1.0, 7.0, 3.0, 4.0, 6.0]]])  # [L=1, Hkv=2, T=5]
    words = torch.tensor([-1, 4, 4, 9, -1])  # prefix, a two-token word, a one-token word, suffix
    pooled = pool_words(scores, words >= 0, words)
    assert pooled.tolist() == [[[5.0, 2.0, 2.0, 9.0, 0.0], [1.0, 7.0, 7.0, 4.0, 6.0]]]
    assert pool_words(scores, words >= 0, words, reduce="mean")[0, 1].tolist() == [1.0, 5.0, 5.0, 4.0, 6.0]
    assert scores[0, 0, 1] == 1.0, "the input is not modified"


def test_max_pool_keeps_neighbours_of_salient_tokens_and_ignores_affixes():
    scores = torch.tensor([100.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0])
    pooled = MaxPool(3)(scores, chunk([False] + [True] * 6), None)
    assert pooled[1:].tolist() == [0.0, 9.0, 9.0, 9.0, 0.0, 0.0], "the prefix score must not leak"
    assert torch.equal(MaxPool(1)(scores, chunk([False] + [True] * 6), None), scores)


def test_score_memory_keeps_the_best_standardised_score():
    node = chunk([False, True, True, True])
    first = ScoreMemory()(torch.tensor([0.0, 3.0, 0.0, -3.0]), node, None)  # standardised: [1, 0, -1]
    second = ScoreMemory()(torch.tensor([0.0, -3.0, 0.0, 3.0]), node, None)  # standardised: [-1, 0, 1]
    torch.testing.assert_close(first[1:], torch.tensor([1.0, 0.0, -1.0]))
    torch.testing.assert_close(second[1:], torch.tensor([1.0, 0.0, 1.0]))


def test_sentence_bonus_keeps_a_salient_sentence_whole_over_a_lone_peak():
    # prefix, sentence 0 (one peak), sentence 1 (uniformly high), sentence 2 (low), suffix
    scores = torch.tensor([90.0, 0.0, 8.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0, 1.0, 0.0, 1.0, 0.0, 70.0])
    node = chunk([False] + [True] * 12 + [False])
    sentences = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, -1])
    ranked = SentenceBonus(weight=4.0)(scores, node, sentences)
    kept = keep_mask(ranked, node.reducible, 2 + 4)
    assert kept[5:9].all() and not kept[1:5].any() and not kept[9:13].any(), "sentence 1 survives whole"
    plain = keep_mask(scores, node.reducible, 2 + 4)
    assert plain[2] and not plain[5:9].all(), "by single-token scores the lone peak would win a place"
    alone = SentenceBonus(weight=0.0)(scores, node, sentences)
    torch.testing.assert_close(alone[node.reducible], standardise(scores, node.reducible)[node.reducible])
    assert torch.equal(SentenceBonus()(scores, node, None), scores), "no unit ids: single tokens"
    assert SentenceBonus().unit == "sentence"


def test_unit_best_and_mean_ranks_whole_units_by_their_peak_and_their_mean():
    # prefix, unit 0 (one sharp peak, e.g. the asked key), unit 1 (uniformly middling), unit 2 (low), suffix
    scores = torch.tensor([90.0, 0.0, 9.0, 0.0, 0.0, 4.0, 4.0, 4.0, 4.0, 1.0, 0.0, 1.0, 0.0, 70.0])
    node = chunk([False] + [True] * 12 + [False])
    units = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, -1])
    best_only = UnitBestAndMean(weight=0.0)(scores, node, units)
    kept = keep_mask(best_only, node.reducible, 2 + 4)
    assert kept[1:5].all() and not kept[5:13].any(), "by its best token the peaked unit survives whole"
    by_mean = UnitBestAndMean(weight=4.0)(scores, node, units)
    kept = keep_mask(by_mean, node.reducible, 2 + 4)
    assert kept[5:9].all() and not kept[1:5].any(), "a heavy mean lets the uniformly relevant unit win"
    assert len(set(by_mean[1:5].tolist())) == 1, "every token of a unit shares one score"
    assert SentenceBonus(weight=4.0)(scores, node, units)[1:5].unique().numel() > 1, "the bonus keeps token scores"
    assert torch.equal(UnitBestAndMean()(scores, node, None), scores), "no unit ids: single tokens"
    assert UnitBestAndMean().unit == "statement"
