"""Scorers: the paper's calibrated last-token score, its ablations, and the every-layer wrapper."""

from dataclasses import replace

import pytest
import torch
from transformers.models.llama.modeling_llama import repeat_kv

from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring import scorers
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.scorers import (
    EveryLayer,
    LastTokenScorer,
    QuestionAttentionScorer,
    RandomScorer,
    ReconstructionScorer,
    ScoreInput,
    attention_logits,
)
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests.conftest import tiny_model


def score_input(q, k, positions, bias=None, layer=0) -> ScoreInput:
    return ScoreInput(q, k, positions, torch.ones(k.shape[2], dtype=torch.bool), layer, 1.0, bias)


def test_gqa_logits_read_the_right_key_head():
    torch.manual_seed(0)
    q, k = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 30, 16)
    expected = torch.einsum("hd,htd->ht", q[0, :, 0], repeat_kv(k, 4)[0]) * 0.25
    torch.testing.assert_close(attention_logits(q, k, 0.25), expected)


def test_calibration_bias_is_subtracted_by_distance():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8)
    positions = torch.tensor([0, 1, 2, 2, 3, 4])
    bias = torch.arange(10, dtype=torch.float32)
    raw = LastTokenScorer(calibrated=False)(score_input(q, k, positions))
    calibrated = LastTokenScorer()(score_input(q, k, positions, bias))
    torch.testing.assert_close(raw - calibrated, (4 - positions).float())
    assert torch.equal(raw, attention_logits(q, k, 1.0).amax(0))


def test_calibrated_scorer_refuses_to_run_without_a_bias():
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match="calibration bias"):
        LastTokenScorer()(score_input(q, k, torch.arange(6)))


def test_several_rows_average_only_the_rows_after_each_key():
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 6, 8)
    scores = LastTokenScorer(calibrated=False, rows=3)(score_input(q, k, torch.arange(6)))
    rows = [attention_logits(q[:, :, r : r + 1], k, 1.0).amax(0) for r in range(3)]
    torch.testing.assert_close(scores[:3], (rows[0][:3] + rows[1][:3] + rows[2][:3]) / 3)
    torch.testing.assert_close(scores[4], (rows[1][4] + rows[2][4]) / 2)
    torch.testing.assert_close(scores[5], rows[2][5])


@pytest.mark.parametrize("entries", [None, 28], ids=["two-row blocks", "one row per block"])
def test_question_attention_is_every_rows_best_softmax_attention(entries, monkeypatch):
    if entries:  # the memory bound: 4 heads x 7 keys fit once, so each block holds one row
        monkeypatch.setattr(scorers, "BLOCK_FLOATS", entries)
    torch.manual_seed(2)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 7, 8)  # the 3 rows are the last 3 keys' queries
    scores = QuestionAttentionScorer(block=2)(score_input(q, k, torch.arange(7)))
    logits = torch.stack([attention_logits(q[:, :, r : r + 1], k, 1.0) for r in range(3)])  # [R, H, T]
    future = torch.arange(7)[None, :] > torch.arange(4, 7)[:, None]  # row r sits at key 4 + r
    probs = logits.masked_fill(future[:, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(scores, probs.amax(dim=(0, 1)).log())


def test_random_scores_are_reproducible_and_differ_by_layer():
    x = score_input(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 40, 8), torch.arange(40))
    assert torch.equal(RandomScorer(3)(x), RandomScorer(3)(x))
    assert not torch.equal(RandomScorer(3)(x), RandomScorer(4)(x))
    assert not torch.equal(RandomScorer(3)(x), RandomScorer(3)(score_input(x.queries, x.keys, x.position_ids, layer=1)))


def _kept(model, warmup: int, scorer) -> tuple[list[int], list[int]]:
    ids = torch.randint(0, 256, (700,), generator=torch.Generator().manual_seed(1))
    settings = CompressorSettings(max_chunk_len=128, warmup_layers=warmup, final_cache_len=96, scoring=Scoring(scorer))
    layers: list[int] = []
    result = HomerCompressor(DecoderStack(model), settings, None, lambda e: layers.append(e.layer)).tree.compress(
        ids[:5], ids[5:696], ids[696:]
    )
    return result.origin.tolist(), layers


def test_every_layer_averages_every_layer_a_node_runs():
    last = LastTokenScorer(calibrated=False)
    # 8 leaves, 4 levels: with 4 layers and no warm-up every node runs one layer, so "every" is "last"
    one_each = tiny_model("llama", vocab_size=256, num_hidden_layers=4)
    assert _kept(one_each, 0, EveryLayer(last)) == _kept(one_each, 0, last)
    # with warm-up the leaves run several layers and their average picks other tokens
    deep = tiny_model("llama", vocab_size=256, num_hidden_layers=8)
    kept_all, layers_all = _kept(deep, 3, EveryLayer(last))
    kept_last, layers_last = _kept(deep, 3, last)
    assert layers_all == layers_last, "pruning still happens in each node's last layer"
    assert kept_all != kept_last


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("every_layer", [True, False])
@pytest.mark.parametrize("probe_layer", [None, 1])
def test_reconstruction_scores_are_the_repeat_rows_best_attention(kind, every_layer, probe_layer):
    model = tiny_model(kind, vocab_size=256)
    g = torch.Generator().manual_seed(0)
    prefix, doc, suffix = (torch.randint(0, 256, (n,), generator=g) for n in (5, 200, 4))
    merged = LastTokenScorer(calibrated=False)
    scorer = ReconstructionScorer(prompt_ids=(7, 8, 9), merged=merged, every_layer=every_layer, probe_layer=probe_layer)
    settings = CompressorSettings(max_chunk_len=128, warmup_layers=3, final_cache_len=64, scoring=Scoring(scorer))
    events = []
    result = HomerCompressor(DecoderStack(model), settings, None, events.append).tree.compress(prefix, doc, suffix)
    assert result.keys[0].shape[2] == 64 and result.plan.height == 1
    leaf0 = events[0]
    assert leaf0.layer == result.schedule.layers_at(0)[-1]
    # leaf 0 against one eager forward of its prefix + piece with the probe appended
    piece = doc[result.plan.piece(0)]
    ids = torch.cat([prefix, piece, torch.tensor([7, 8, 9]), piece])
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(ids[None], output_attentions=True).attentions  # per layer [1, H, N, N]
    length = 5 + piece.numel()
    at = leaf0.layer if probe_layer is None else probe_layer  # an earlier layer: the probe stops there
    probed = [layer for layer in result.schedule.layers_at(0) if layer <= at] if every_layer else [at]
    best = torch.stack([attentions[layer][0, :, length:, :length].amax(dim=(0, 1)) for layer in probed]).amax(0)
    expected = best.clamp(min=1e-12).log()
    torch.testing.assert_close(leaf0.scores[leaf0.reducible], expected[5:], atol=1e-4, rtol=1e-4)
    # the probe rows leave nothing behind: leaf 0's surviving tokens keep its own forward's K/V
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        plain = model(torch.cat([prefix, piece, suffix])[None], use_cache=True).cache
    rows = ((result.origin >= 0) & (result.origin < piece.numel())).nonzero().squeeze(1)
    assert rows.numel() > 0
    for layer in result.schedule.layers_at(0):
        expected_keys = plain.layers[layer].keys[:, :, 5 + result.origin[rows]]
        torch.testing.assert_close(result.keys[layer][:, :, rows], expected_keys, atol=1e-5, rtol=0)


def test_a_probing_scorer_cannot_replay_a_tier():
    model = tiny_model("llama", vocab_size=256)
    scoring = Scoring(ReconstructionScorer(prompt_ids=(7,), merged=LastTokenScorer(calibrated=False)))
    settings = CompressorSettings(max_chunk_len=128, warmup_layers=3, final_cache_len=64, scoring=scoring)
    comp = HomerCompressor(DecoderStack(model), settings, None)
    tier = comp.leaves.build(torch.arange(5), torch.arange(200) % 256)
    with pytest.raises(ValueError, match="with_question"):
        comp.tree.replay(tier, torch.arange(4))
    replayed = HomerCompressor(DecoderStack(model), replace(settings, scoring=scoring.with_question()), None)
    assert replayed.tree.replay(tier, torch.arange(4)).keys[0].shape[2] == 64
