"""The leaf tier: a question replayed from the stored leaves equals a compression from scratch."""

import pytest
import torch

from homer_integrations.homer.compressor import CompressorSettings
from homer_integrations.homer.decoder import DecoderStack
from homer_integrations.homer.kv import cache_from_tensors
from homer_integrations.homer.leaf_tier import LeafTier
from homer_integrations.homer.pruning import standardise
from homer_integrations.homer.replay import TierCompressor
from tests.conftest import tiny_model, uncalibrated

KINDS = ["llama", "mistral", "qwen2"]
MCL, RESERVE = 128, 12
# The replay runs the suffix rows against cached K/V instead of the whole leaf in one call: the
# same arithmetic in another blocking, so fp32 results agree to rounding.
ATOL = 1e-4


def ids(model, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (n,), generator=g)


def compressor(model, **kw) -> TierCompressor:
    settings = CompressorSettings(
        **{
            "max_chunk_len": MCL,
            "warmup_layers": 3,
            "final_cache_len": MCL,
            "scoring": uncalibrated(),
            "want_logits": True,
            "suffix_reserve": RESERVE,
            **kw,
        }
    )
    return TierCompressor(DecoderStack(model), settings, None)


def assert_same_compression(replayed, scratch) -> None:
    assert replayed.plan == scratch.plan
    assert torch.equal(replayed.origin, scratch.origin), "the same tokens survive"
    assert torch.equal(replayed.position_ids, scratch.position_ids)
    assert len(replayed.keys) == len(scratch.keys)
    for a, b in zip(replayed.keys + replayed.values, scratch.keys + scratch.values, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    torch.testing.assert_close(replayed.next_token_logits, scratch.next_token_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("doc_len", "height"), [(60, 0), (200, 1), (400, 2), (800, 3)])
@pytest.mark.parametrize("units_and_memory", [False, True])
def test_replay_equals_compression_from_scratch(kind, doc_len, height, units_and_memory):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc = ids(model, 5, 1), ids(model, doc_len, 2)
    words = torch.arange(doc_len) // 3 if units_and_memory else None
    comp = compressor(model, scoring=uncalibrated(3, words=True, memory=True) if units_and_memory else uncalibrated())
    tier = comp.build_leaf_tier(prefix, doc, word_ids=words)
    for seed, suffix_len in [(3, 4), (4, RESERVE)]:  # two questions asked of one tier
        suffix = ids(model, suffix_len, seed)
        scratch = comp.compress(prefix, doc, suffix, word_ids=words)
        assert scratch.plan.height == height
        assert_same_compression(comp.replay(tier, suffix), scratch)


def test_replay_of_a_single_chunk_is_the_plain_forward():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 60, 2), ids(model, 4, 3)
    comp = compressor(model)
    replayed = comp.replay(comp.build_leaf_tier(prefix, doc), suffix)
    with torch.no_grad():
        out = model(torch.cat([prefix, doc, suffix])[None], use_cache=True)
    torch.testing.assert_close(replayed.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    for k, layer in zip(replayed.keys, out.cache.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, atol=1e-5, rtol=0)


def test_replay_reads_every_leaf_layer_from_the_tier_not_the_model():
    """The tier is the only source of the document: a tier of another document gives its answer."""
    model = tiny_model("qwen2", vocab_size=256)
    prefix, suffix = ids(model, 5, 1), ids(model, 4, 3)
    comp = compressor(model)
    doc_a, doc_b = ids(model, 400, 2), ids(model, 400, 5)
    tier_b = comp.build_leaf_tier(prefix, doc_b)
    assert_same_compression(comp.replay(tier_b, suffix), comp.compress(prefix, doc_b, suffix))
    assert not torch.allclose(
        comp.replay(tier_b, suffix).next_token_logits, comp.compress(prefix, doc_a, suffix).next_token_logits
    )


def test_a_suffix_longer_than_the_reserve_keeps_the_split():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc = ids(model, 5, 1), ids(model, 400, 2)
    comp = compressor(model)
    tier = comp.build_leaf_tier(prefix, doc)
    result = comp.replay(tier, ids(model, RESERVE + 10, 3))
    assert result.plan.piece_len == tier.plan.piece_len
    assert result.plan.suffix_len == RESERVE + 10
    assert len({k.shape[2] for k in result.keys}) == 1


def test_tier_tensors_round_trip_and_shapes_are_checked():
    model = tiny_model("mistral", vocab_size=256)
    comp = compressor(model)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 300, 2), ids(model, 4, 3)
    tier = comp.build_leaf_tier(prefix, doc, word_ids=torch.arange(300) // 2, key="abc")
    leaf_layers = len(comp._schedule(tier.plan).layers_at(0))
    assert tier.leaf_layers == leaf_layers
    assert tier.keys[0].shape == (1, 2, 300, model.config.hidden_size // 4)
    assert tier.nbytes > 0
    tensors, meta = tier.to_tensors()
    back = LeafTier.from_tensors(tensors, meta)
    assert back.key == "abc" and back.plan == tier.plan
    assert_same_compression(comp.replay(back, suffix), comp.replay(tier, suffix))
    tensors["k.0"] = tensors["k.0"][:, :10]
    with pytest.raises(ValueError, match="leaf tier"):
        LeafTier.from_tensors(tensors, meta)


def test_tier_built_with_other_settings_is_refused():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 200, 2), ids(model, 4, 3)
    tier = compressor(model).build_leaf_tier(prefix, doc)
    other = TierCompressor(
        DecoderStack(model),
        CompressorSettings(max_chunk_len=MCL, warmup_layers=0, final_cache_len=MCL, scoring=uncalibrated()),
        None,
    )
    with pytest.raises(ValueError, match="leaf layers"):
        other.replay(tier, suffix)


@pytest.mark.parametrize("kind", KINDS)
def test_flat_replay_of_a_single_leaf_is_the_tree_replay(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 100, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=64, scoring=uncalibrated(memory=True))
    tier = comp.build_leaf_tier(prefix, doc)
    assert tier.plan.height == 0
    assert_same_compression(comp.replay_flat(tier, suffix), comp.replay(tier, suffix))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [400, 800])
def test_flat_replay_keeps_the_best_leaf_tokens_and_runs_the_upper_layers_once(kind, doc_len):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, doc_len, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated(words=True))
    tier = comp.build_leaf_tier(prefix, doc, word_ids=torch.arange(doc_len) // 2)
    events = []
    comp.observer = events.append
    result = comp.replay_flat(tier, suffix)
    assert result.plan.height >= 2
    assert {k.shape[2] for k in result.keys + result.values} == {96}
    kept = result.origin[result.origin >= 0]
    assert torch.equal(kept, kept.sort().values), "document order"
    # every leaf was scored once, all in the last leaf layer; nothing above the leaves pruned
    assert {e.layer for e in events} == {tier.leaf_layers - 1}
    # below the merge, the kept tokens' K/V are the tier's own (prefix and suffix are averages)
    doc_rows = (result.origin >= 0).nonzero().squeeze(1)
    for layer in range(tier.leaf_layers):
        torch.testing.assert_close(result.keys[layer][:, :, doc_rows], tier.keys[layer][:, :, kept], atol=0, rtol=0)
    # words (units of two tokens) survive whole, but for a tie cut at the edge of each selection
    split = [w for w in set((kept // 2).tolist()) if (kept // 2 == w).sum() == 1 and 2 * w + 1 < doc_len]
    assert len(split) <= len(events)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [100, 400, 800])
def test_flat_compression_from_scratch_equals_the_flat_replay(kind, doc_len):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, doc_len, 2), ids(model, RESERVE, 3)
    words = torch.arange(doc_len) // 2
    comp = compressor(model, final_cache_len=64, scoring=uncalibrated(3, words=True))
    tier = comp.build_leaf_tier(prefix, doc, word_ids=words)
    assert_same_compression(comp.compress_flat(prefix, doc, suffix, word_ids=words), comp.replay_flat(tier, suffix))


@pytest.mark.parametrize("kind", KINDS)
def test_flat_reconstruction_root_prunes_each_leaf_once_by_its_probe_scores(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated().with_reconstruction(ids(model, 6, 4)))
    events = []
    comp.observer = events.append
    result = comp.compress_flat(prefix, doc, suffix)
    tier = compressor(model).build_leaf_tier(prefix, doc)
    assert result.plan.height >= 2
    assert {k.shape[2] for k in result.keys + result.values} == {96}
    kept = result.origin[result.origin >= 0]
    assert torch.equal(kept, kept.sort().values) and kept.numel() == 96 - 5 - RESERVE
    doc_rows = (result.origin >= 0).nonzero().squeeze(1)
    for layer in range(tier.leaf_layers):
        torch.testing.assert_close(result.keys[layer][:, :, doc_rows], tier.keys[layer][:, :, kept], atol=ATOL, rtol=0)
    # leaf 0 (longer than the target alone) was pruned by its standardised probe scores
    part = tier.leaf(0)
    cache = cache_from_tensors(part.keys, part.values)
    scores = comp._probe(cache, part.position_ids, doc[tier.plan.piece(0)], range(tier.leaf_layers))
    reducible = part.origin >= 0
    first = events[0]
    assert torch.equal(first.origin[first.reducible], part.origin[reducible])
    torch.testing.assert_close(
        first.scores[first.reducible], standardise(scores, reducible)[reducible], atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [400, 800])
def test_recompute_replay_is_the_plain_prefill_of_the_flat_selection(kind, doc_len):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, doc_len, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated(words=True))
    tier = comp.build_leaf_tier(prefix, doc, word_ids=torch.arange(doc_len) // 2)
    flat = comp.replay_flat(tier, suffix)
    result = comp.replay_recompute(tier, prefix, doc, suffix)
    assert result.plan == flat.plan and result.plan.height >= 2
    kept = flat.origin[flat.origin >= 0]
    assert torch.equal(result.origin, flat.origin), "the flat replay's tokens, in the same order"
    assert torch.equal(result.position_ids, torch.arange(96)), "each kept token its own position"
    with torch.no_grad():
        out = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True)
    torch.testing.assert_close(result.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    for k, v, layer in zip(result.keys, result.values, out.cache.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(v, layer.values, atol=1e-5, rtol=0)
    # the flat replay's cache is not a plain prefill of its tokens: the recompute changed what is read
    assert not torch.allclose(flat.keys[-1], result.keys[-1], atol=1e-3)


def test_recompute_of_a_single_leaf_is_the_flat_replay():
    model = tiny_model("qwen2", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 100, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=64)
    tier = comp.build_leaf_tier(prefix, doc)
    assert tier.plan.height == 0
    assert_same_compression(comp.replay_recompute(tier, prefix, doc, suffix), comp.replay_flat(tier, suffix))


def test_recompute_needs_the_tiers_own_document():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 400, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96)
    tier = comp.build_leaf_tier(prefix, doc)
    with pytest.raises(ValueError, match="400 document tokens"):
        comp.replay_recompute(tier, prefix, doc[:-1], suffix)


@pytest.mark.parametrize("kind", KINDS)
def test_recompute_shared_root_is_the_plain_prefill_of_the_flat_roots_tokens(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated().with_reconstruction(ids(model, 6, 4)))
    flat = comp.compress_flat(prefix, doc, suffix)
    result = comp.compress_flat(prefix, doc, suffix, recompute=True)
    assert torch.equal(result.origin, flat.origin) and result.plan == flat.plan
    kept = flat.origin[flat.origin >= 0]
    with torch.no_grad():
        out = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True)
    torch.testing.assert_close(result.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    for k, layer in zip(result.keys, out.cache.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, atol=1e-5, rtol=0)
