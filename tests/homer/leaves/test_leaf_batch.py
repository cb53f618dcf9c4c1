"""Every leaf scored in one batched pass equals each leaf scored alone, uneven pieces included."""

import pytest
import torch

from homer_integrations.homer.leaves.leaf_batch import batchable, leaf_keys, score_leaves
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.chain import Scoring
from tests.conftest import tiny_model, uncalibrated
from tests.homer.leaves.tier_helpers import KINDS, RESERVE, compressor, ids


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [400, 803])
@pytest.mark.parametrize("scoring", [uncalibrated(), Scoring.for_questions()], ids=["last_token", "question"])
def test_batched_scores_are_each_leafs_own(kind, doc_len, scoring):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, doc_len, 2), ids(model, RESERVE - 3, 3)
    comp = compressor(model, final_cache_len=96, scoring=scoring)
    tier = comp.leaves.build(prefix, doc)
    plan = tier.plan.with_suffix(suffix.numel())
    layers = range(tier.leaf_layers)
    lengths = {plan.piece(b).stop - plan.piece(b).start for b in range(plan.num_leaves)}
    assert plan.num_leaves >= 4 and len(lengths) == (2 if doc_len % plan.num_leaves else 1)
    batched = score_leaves(comp.nodes.stack, scoring.scorer, None, tier, suffix, plan, layers)
    for index, scores in enumerate(batched):
        _, alone = comp.leaves.replayed_leaf(tier.leaf(index), suffix, plan, layers, target_len=0)
        torch.testing.assert_close(scores, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_recompute_replay_keeps_what_the_leaf_by_leaf_selection_keeps(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 803, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96, scoring=Scoring.for_questions())
    tier = comp.leaves.build(prefix, doc, word_ids=torch.arange(803) // 3)
    flat = comp.flat.replay_flat(tier, suffix)  # leaf by leaf
    result = comp.flat.replay_recompute(tier, prefix, doc, suffix)  # batched
    assert torch.equal(result.origin, flat.origin)


def test_pieces_are_laid_out_leaf_by_leaf_with_the_short_ones_padded():
    plan = compressor(tiny_model("llama", vocab_size=256)).leaves.build(torch.arange(3), torch.arange(203)).plan
    prefix = torch.full((1, 1, 3, 1), -1.0)
    document = torch.arange(203.0).view(1, 1, 203, 1)
    pieces = [document[:, :, plan.piece(b)] for b in range(plan.num_leaves)]
    out = leaf_keys(prefix, pieces, plan)[:, 0, :, 0]
    assert out.shape == (plan.num_leaves, 3 + plan.piece_len)
    for b in range(plan.num_leaves):
        span = plan.piece(b)
        n = span.stop - span.start
        assert out[b, :3].tolist() == [-1.0] * 3
        assert out[b, 3 : 3 + n].tolist() == list(range(span.start, span.stop))
        assert out[b, 3 + n :].tolist() == [0.0] * (plan.piece_len - n)


def test_windowed_and_flash_layers_score_leaf_by_leaf():
    assert batchable(DecoderStack(tiny_model("qwen2")), range(3))
    assert not batchable(DecoderStack(tiny_model("mistral", sliding_window=64)), range(3))
