"""The leaf tier: a question replayed from the stored leaves equals a compression from scratch."""

from dataclasses import replace

import pytest
import torch

from homer_integrations.homer.kv.compressed import CacheSpec
from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.leaves.leaf_tier import LeafPiece
from homer_integrations.homer.leaves.tier_file import tier_from_tensors, whole_tensors
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests.conftest import tiny_model, uncalibrated
from tests.homer.leaves.tier_helpers import (
    ATOL,
    KINDS,
    MCL,
    RESERVE,
    assert_same_compression,
    assert_same_tier,
    compressor,
    ids,
)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("doc_len", "height"), [(60, 0), (200, 1), (400, 2), (800, 3)])
@pytest.mark.parametrize("units_and_memory", [False, True])
def test_replay_equals_compression_from_scratch(kind, doc_len, height, units_and_memory):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc = ids(model, 5, 1), ids(model, doc_len, 2)
    words = torch.arange(doc_len) // 3 if units_and_memory else None
    comp = compressor(model, scoring=uncalibrated(3, words=True, memory=True) if units_and_memory else uncalibrated())
    tier = comp.leaves.build(prefix, doc, word_ids=words)
    for seed, suffix_len in [(3, 4), (4, RESERVE)]:  # two questions asked of one tier
        suffix = ids(model, suffix_len, seed)
        scratch = comp.tree.compress(prefix, doc, suffix, word_ids=words)
        assert scratch.plan.height == height
        assert_same_compression(comp.tree.replay(tier, suffix), scratch)


def test_replay_of_a_single_chunk_is_the_plain_forward():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 60, 2), ids(model, 4, 3)
    comp = compressor(model)
    replayed = comp.tree.replay(comp.leaves.build(prefix, doc), suffix)
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
    tier_b = comp.leaves.build(prefix, doc_b)
    assert_same_compression(comp.tree.replay(tier_b, suffix), comp.tree.compress(prefix, doc_b, suffix))
    assert not torch.allclose(
        comp.tree.replay(tier_b, suffix).next_token_logits, comp.tree.compress(prefix, doc_a, suffix).next_token_logits
    )


def test_a_suffix_longer_than_the_reserve_keeps_the_split():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc = ids(model, 5, 1), ids(model, 400, 2)
    comp = compressor(model)
    tier = comp.leaves.build(prefix, doc)
    result = comp.tree.replay(tier, ids(model, RESERVE + 10, 3))
    assert result.plan.piece_len == tier.plan.piece_len
    assert result.plan.suffix_len == RESERVE + 10
    assert len({k.shape[2] for k in result.keys}) == 1


def test_tier_tensors_round_trip_and_shapes_are_checked():
    model = tiny_model("mistral", vocab_size=256)
    comp = compressor(model)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 300, 2), ids(model, 4, 3)
    tier = comp.leaves.build(prefix, doc, word_ids=torch.arange(300) // 2, key="abc")
    leaf_layers = len(comp.nodes.schedule(tier.plan).layers_at(0))
    assert tier.leaf_layers == leaf_layers
    assert whole_tensors(tier)[0]["k.0"].shape == (2, 300, model.config.hidden_size // 4)
    spans = map(tier.plan.piece, range(tier.plan.num_leaves))
    assert [p.length for p in tier.pieces] == [span.stop - span.start for span in spans]
    assert tier.nbytes > 0
    tensors, meta = whole_tensors(tier)
    back = tier_from_tensors(tensors, meta)
    assert back.key == "abc" and back.plan == tier.plan
    assert_same_compression(comp.tree.replay(back, suffix), comp.tree.replay(tier, suffix))
    spec = CacheSpec(tier.leaf_layers + 1, 2, tier.pieces[0].keys[0].shape[3], torch.float32, MCL)
    tier.validate(spec)
    with pytest.raises(ValueError, match="4 leaves for a model of"):  # leaves that leave no layer to merge in
        tier.validate(replace(spec, num_layers=tier.leaf_layers))
    tensors["k.0"] = tensors["k.0"][:, :10]
    with pytest.raises(ValueError, match="leaf tier"):
        tier_from_tensors(tensors, meta)


def test_a_tier_whose_pieces_are_held_apart_reads_and_stores_as_one_laid_out_whole():
    model = tiny_model("llama", vocab_size=256)
    comp = compressor(model)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 350, 2), ids(model, 4, 3)
    tier = comp.leaves.build(prefix, doc, key="abc")
    stored = whole_tensors(tier)[0]
    assert tier.pieces[1].keys[0].untyped_storage().data_ptr() == stored["k.0"].untyped_storage().data_ptr()
    clone = lambda ts: tuple(t.clone() for t in ts)  # noqa: E731
    pieces = tuple(LeafPiece(clone(p.keys), clone(p.values), p.hidden.clone()) for p in tier.pieces)
    apart = replace(tier, storage=None, pieces=pieces)
    apart.check()
    assert apart.nbytes == tier.nbytes
    assert_same_tier(apart, tier, atol=0)
    assert_same_compression(comp.tree.replay(apart, suffix), comp.tree.replay(tier, suffix))
    kept = torch.tensor([0, 3, 120, 121, 349])
    rows = apart.document_rows(kept)
    assert torch.equal(rows.keys[1], stored["k.1"][None][:, :, kept])
    assert torch.equal(rows.hidden, stored["hidden"][None][:, kept])
    short = replace(apart, pieces=(*apart.pieces[:-1], apart.document_rows(torch.arange(340, 349))))
    with pytest.raises(ValueError, match=r"K/V are not"):
        short.check()


def test_tier_built_with_other_settings_is_refused():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 200, 2), ids(model, 4, 3)
    tier = compressor(model).leaves.build(prefix, doc)
    other = HomerCompressor(
        DecoderStack(model),
        CompressorSettings(max_chunk_len=MCL, warmup_layers=0, final_cache_len=MCL, scoring=uncalibrated()),
        None,
    )
    with pytest.raises(ValueError, match="leaf layers"):
        other.tree.replay(tier, suffix)
