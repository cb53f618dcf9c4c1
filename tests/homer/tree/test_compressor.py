"""The merge tree on tiny random-weight Llama, Mistral and Qwen2 decoders."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model.architectures import UnsupportedModelError
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.pruning import keep_mask
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests.conftest import assert_tree_invariants, tiny_model, uncalibrated

KINDS = ["llama", "mistral", "qwen2"]
# fp32 on CPU: our layer loop calls the same modules as the model's forward, so only the
# final layer's MLP run on the last row alone (instead of all rows) may differ in rounding.
LOGITS_ATOL = 1e-4


def compress(model, doc_len, mcl=128, warmup=3, final=None, seed=0, observer=None, **kw):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix, doc, suffix = (torch.randint(0, vocab, (n,), generator=g) for n in (5, doc_len, 4))
    settings = CompressorSettings(
        max_chunk_len=mcl,
        warmup_layers=warmup,
        final_cache_len=final or mcl,
        scoring=kw.pop("scoring", uncalibrated()),
        want_logits=True,
        **kw,
    )
    compressor = HomerCompressor(DecoderStack(model), settings, None, observer)
    return compressor.tree.compress(prefix, doc, suffix), (prefix, doc, suffix)


@pytest.mark.parametrize("kind", KINDS)
def test_single_chunk_matches_plain_forward(kind):
    model = tiny_model(kind, vocab_size=256)
    result, (p, d, s) = compress(model, 60)
    assert result.plan.height == 0
    ids = torch.cat([p, d, s])[None]
    with torch.no_grad():
        out = model(ids, use_cache=True)
    torch.testing.assert_close(result.next_token_logits, out.logits[0, -1], atol=LOGITS_ATOL, rtol=0)
    for k, layer in zip(result.keys, out.cache.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("doc_len", "updates"), [(61, 6), (300, 4)])
def test_progress_is_reported_per_layer_for_one_leaf_and_per_leaf_for_a_tree(doc_len: int, updates: int) -> None:
    """A whole prefill (one leaf, every layer) moves its bar after each of the model's 6 layers, so the bar has an
    ETA; a tree after each leaf. Either way the steps add up to the document's tokens."""
    model = tiny_model("llama", vocab_size=256)
    g = torch.Generator().manual_seed(0)
    prefix, doc, suffix = (torch.randint(0, 256, (n,), generator=g) for n in (5, doc_len, 4))
    settings = CompressorSettings(
        max_chunk_len=128, warmup_layers=3, final_cache_len=128, scoring=uncalibrated(), want_logits=True
    )
    steps: list[int] = []
    HomerCompressor(DecoderStack(model), settings, None, None).tree.compress(prefix, doc, suffix, progress=steps.append)
    assert len(steps) == updates and sum(steps) == doc_len and all(s > 0 for s in steps)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [300, 1500])
def test_tree_invariants(kind, doc_len):
    model = tiny_model(kind, vocab_size=256)
    mcl = 128
    result, (p, _, s) = compress(model, doc_len, mcl=mcl)
    assert result.plan.height >= 2
    assert_tree_invariants(result, model, p.numel(), s.numel(), mcl)
    assert result.last_position == int(result.position_ids[-1])


def test_tree_taller_than_the_model_is_rejected():
    model = tiny_model("llama", vocab_size=256)
    with pytest.raises(ValueError, match="raise max_chunk_len"):
        compress(model, 8000, mcl=128)


def test_final_cache_len_is_respected():
    model = tiny_model("llama", vocab_size=256)
    result, _ = compress(model, 1000, mcl=128, final=64)
    assert result.keys[0].shape[2] == 64


def test_observer_sees_every_pruning_in_the_nodes_last_layer():
    model = tiny_model("llama", vocab_size=256)
    events = []
    result, _ = compress(model, 1000, mcl=128, final=64, observer=events.append)
    schedule = result.schedule
    # one event per node that had to shrink: 2**h leaves may or may not, every merged node does
    assert len(events) >= 2**result.plan.height - 1
    assert {e.layer for e in events} <= {level[-1] for level in schedule.levels}
    for e in events:
        assert bool(e.keep[~e.reducible].all()), "prefix and suffix are never pruned"
        assert e.scores.shape == e.keep.shape == e.origin.shape
    root = events[-1]
    assert root.layer == schedule.levels[-1][-1] and int(root.keep.sum()) == 64
    assert root.origin[root.keep].tolist() == result.origin.tolist()


def test_peak_kv_grows_with_tree_height_not_length():
    model = tiny_model("llama", vocab_size=256, num_hidden_layers=12)
    small, _ = compress(model, 1000, mcl=128, warmup=1)
    large, _ = compress(model, 8000, mcl=128, warmup=1)
    assert large.plan.height == small.plan.height + 3
    assert large.peak_kv_bytes < 2 * small.peak_kv_bytes


def test_keep_mask_protects_affixes_and_drops_lowest():
    scores = torch.tensor([-9.0, 5.0, 1.0, 3.0, 2.0, -9.0])
    reducible = torch.tensor([False, True, True, True, True, False])
    assert keep_mask(scores, reducible, 4).tolist() == [True, True, False, True, False, True]
    with pytest.raises(ValueError, match="reducible"):
        keep_mask(scores, reducible, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_keeps_invariants(dtype):
    model = tiny_model("qwen2", vocab_size=256).to(dtype)
    result, _ = compress(model, 700, mcl=128)
    assert result.keys[0].dtype == dtype
    assert torch.isfinite(result.next_token_logits).all()
    assert len({k.shape[2] for k in result.keys}) == 1


def test_yarn_rope_scaling_composes_with_homer():
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0}
    model = tiny_model("llama", vocab_size=256, rope_parameters=rope)
    assert model.model.rotary_emb.rope_type == "yarn"
    single, (p, d, s) = compress(model, 60)
    with torch.no_grad():
        ref = model(torch.cat([p, d, s])[None]).logits[0, -1]
    torch.testing.assert_close(single.next_token_logits, ref, atol=LOGITS_ATOL, rtol=0)
    tree, _ = compress(model, 1200, mcl=256)
    assert tree.plan.height >= 2 and torch.isfinite(tree.next_token_logits).all()


def test_unsupported_architectures_fail_with_a_clear_error():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModelError, match="llama, mistral, qwen2"):
        DecoderStack(gpt2)
