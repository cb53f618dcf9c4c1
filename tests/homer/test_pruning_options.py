"""The pruning refinements beyond the paper: unit pooling, score memory, contiguous positions."""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from homer_integrations.homer.chunk import Chunk
from homer_integrations.homer.compressor import CompressorSettings, HomerCompressor
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.positions import rotate_keys
from homer_integrations.homer.prompt import unit_ids
from homer_integrations.homer.pruning import pool_words, remember
from tests.conftest import tiny_model

TEXT = "He said so. The pass key is 66226. Remember it; yes\nChapter 10\n\nElizabeth Bennet smiled"


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


def test_pool_words_gives_each_token_its_units_best_score():
    scores = torch.tensor([50.0, 1.0, 7.0, 2.0, 3.0, 0.5, 9.0])
    reducible = torch.tensor([False, True, True, True, True, True, False])
    words = torch.tensor([-1, 0, 0, 1, 1, 2, -1])
    assert pool_words(scores, reducible, words).tolist() == [50.0, 7.0, 7.0, 3.0, 3.0, 0.5, 9.0]


def test_remember_keeps_the_best_standardised_score():
    chunk = Chunk(
        hidden=torch.zeros(1, 4, 2),
        position_ids=torch.arange(4),
        reducible=torch.tensor([False, True, True, True]),
        origin=torch.tensor([-1, 0, 1, 2]),
        memory=torch.full((4,), float("-inf")),
        prefix_len=1,
        suffix_len=0,
    )
    first = remember(torch.tensor([0.0, 3.0, 0.0, -3.0]), chunk)  # standardised: [1, 0, -1]
    second = remember(torch.tensor([0.0, -3.0, 0.0, 3.0]), chunk)  # standardised: [-1, 0, 1]
    torch.testing.assert_close(first[1:], torch.tensor([1.0, 0.0, -1.0]))
    torch.testing.assert_close(second[1:], torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 1e4},
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    ],
)
def test_rotating_cached_keys_equals_rotating_at_the_new_positions(rope):
    model = tiny_model("llama", vocab_size=64, **({"rope_parameters": rope} if rope else {}))
    rotary = model.model.rotary_emb
    k = torch.randn(1, 2, 5, 16, generator=torch.Generator().manual_seed(0))
    old, new = torch.tensor([3, 7, 7, 1, 20]), torch.arange(5)
    at_old, _ = apply_rotary_pos_emb(k, k, *rotary(k, old[None]))
    at_new, _ = apply_rotary_pos_emb(k, k, *rotary(k, new[None]))
    torch.testing.assert_close(rotate_keys(at_old, new - old, rotary), at_new, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_contiguous_positions_keep_the_tree_invariants(kind):
    model = tiny_model(kind, vocab_size=256)
    ids = torch.randint(0, 256, (1500,), generator=torch.Generator().manual_seed(0))
    settings = CompressorSettings(
        max_chunk_len=128,
        warmup_layers=3,
        final_cache_len=128,
        scorer="uncalibrated",
        contiguous_positions=True,
        score_pooling=5,
        score_memory=True,
    )
    result = HomerCompressor(DecoderStack(model), settings, None).compress(ids[:5], ids[5:1496], ids[1496:])
    length = result.position_ids.numel()
    assert result.position_ids.tolist() == list(range(length))
    assert result.last_position == length - 1
    assert len({k.shape[2] for k in result.keys}) == 1
    kept = result.origin[result.origin >= 0]
    assert bool((kept.diff() > 0).all())


def _kept(model, warmup: int, score_layers: str) -> tuple[list[int], list[int]]:
    ids = torch.randint(0, 256, (700,), generator=torch.Generator().manual_seed(1))
    settings = CompressorSettings(
        max_chunk_len=128, warmup_layers=warmup, final_cache_len=96, scorer="uncalibrated", score_layers=score_layers
    )
    layers: list[int] = []
    result = HomerCompressor(DecoderStack(model), settings, None, lambda e: layers.append(e.layer)).compress(
        ids[:5], ids[5:696], ids[696:]
    )
    return result.origin.tolist(), layers


def test_score_layers_all_averages_every_layer_a_node_runs():
    # 8 leaves, 4 levels: with 4 layers and no warm-up every node runs one layer, so "all" is "last"
    one_each = tiny_model("llama", vocab_size=256, num_hidden_layers=4)
    assert _kept(one_each, 0, "all") == _kept(one_each, 0, "last")
    # with warm-up the leaves run several layers and their average picks other tokens
    deep = tiny_model("llama", vocab_size=256, num_hidden_layers=8)
    kept_all, layers_all = _kept(deep, 3, "all")
    kept_last, layers_last = _kept(deep, 3, "last")
    assert layers_all == layers_last, "pruning still happens in each node's last layer"
    assert kept_all != kept_last
