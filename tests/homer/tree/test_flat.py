"""The flat selection across all leaves, from the tier or from scratch, and its plain-prefill re-read."""

from dataclasses import replace

import pytest
import torch

from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.scoring.probing import probe_scores
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.tree.recompute import whole_units
from tests.conftest import tiny_model, uncalibrated
from tests.homer.leaves.tier_helpers import ATOL, KINDS, RESERVE, assert_same_compression, compressor, ids


@pytest.mark.parametrize("kind", KINDS)
def test_flat_replay_of_a_single_leaf_is_the_tree_replay(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 100, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=64, scoring=uncalibrated(memory=True))
    tier = comp.leaves.build(prefix, doc)
    assert tier.plan.height == 0
    assert_same_compression(comp.flat.replay_flat(tier, suffix), comp.tree.replay(tier, suffix))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("doc_len", [400, 800])
def test_flat_replay_keeps_the_best_leaf_tokens_and_runs_the_upper_layers_once(kind, doc_len):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, doc_len, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated(words=True))
    tier = comp.leaves.build(prefix, doc, word_ids=torch.arange(doc_len) // 2)
    events = []
    comp.nodes.observer = events.append
    result = comp.flat.replay_flat(tier, suffix)
    assert result.plan.height >= 2
    assert {k.shape[2] for k in result.keys + result.values} == {96}
    kept = result.origin[result.origin >= 0]
    assert torch.equal(kept, kept.sort().values), "document order"
    # every leaf was scored once, all in the last leaf layer; nothing above the leaves pruned
    assert {e.layer for e in events} == {tier.leaf_layers - 1}
    # below the merge, the kept tokens' K/V are the tier's own (prefix and suffix are averages)
    doc_rows = (result.origin >= 0).nonzero().squeeze(1)
    stored = tier.document_rows(kept)
    for layer in range(tier.leaf_layers):
        torch.testing.assert_close(result.keys[layer][:, :, doc_rows], stored.keys[layer], atol=0, rtol=0)
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
    tier = comp.leaves.build(prefix, doc, word_ids=words)
    assert_same_compression(
        comp.flat.compress_flat(prefix, doc, suffix, word_ids=words), comp.flat.replay_flat(tier, suffix)
    )


@pytest.mark.parametrize("kind", KINDS)
def test_flat_reconstruction_root_prunes_each_leaf_once_by_its_probe_scores(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated().with_reconstruction(ids(model, 6, 4)))
    events = []
    comp.nodes.observer = events.append
    result = comp.flat.compress_flat(prefix, doc, suffix)
    tier = compressor(model).leaves.build(prefix, doc)
    assert result.plan.height >= 2
    assert {k.shape[2] for k in result.keys + result.values} == {96}
    kept = result.origin[result.origin >= 0]
    assert torch.equal(kept, kept.sort().values) and kept.numel() == 96 - 5 - RESERVE
    doc_rows = (result.origin >= 0).nonzero().squeeze(1)
    stored = tier.document_rows(kept)
    for layer in range(tier.leaf_layers):
        torch.testing.assert_close(result.keys[layer][:, :, doc_rows], stored.keys[layer], atol=ATOL, rtol=0)
    # leaf 0 (longer than the target alone) was pruned by its standardised probe scores
    part = tier.leaf(0)
    cache = cache_from_tensors(part.keys, part.values)
    scores = probe_scores(
        comp.nodes.stack,
        comp.nodes.scoring.scorer,
        cache,
        part.position_ids,
        doc[tier.plan.piece(0)],
        range(tier.leaf_layers),
    )
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
    tier = comp.leaves.build(prefix, doc, word_ids=torch.arange(doc_len) // 2)
    flat = comp.flat.replay_flat(tier, suffix)
    result = comp.flat.replay_recompute(tier, prefix, doc, suffix)
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
    tier = comp.leaves.build(prefix, doc)
    assert tier.plan.height == 0
    assert_same_compression(comp.flat.replay_recompute(tier, prefix, doc, suffix), comp.flat.replay_flat(tier, suffix))


def test_recompute_needs_the_tiers_own_document():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 400, 2), ids(model, 4, 3)
    comp = compressor(model, final_cache_len=96)
    tier = comp.leaves.build(prefix, doc)
    with pytest.raises(ValueError, match="400 document tokens"):
        comp.flat.replay_recompute(tier, prefix, doc[:-1], suffix)


@pytest.mark.parametrize("kind", KINDS)
def test_recompute_shared_root_is_the_plain_prefill_of_the_flat_roots_tokens(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated().with_reconstruction(ids(model, 6, 4)))
    flat = comp.flat.compress_flat(prefix, doc, suffix)
    result = comp.flat.compress_flat(prefix, doc, suffix, recompute=True)
    assert torch.equal(result.origin, flat.origin) and result.plan == flat.plan
    kept = flat.origin[flat.origin >= 0]
    with torch.no_grad():
        out = model(torch.cat([prefix, doc[kept], suffix])[None], use_cache=True)
    torch.testing.assert_close(result.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    for k, layer in zip(result.keys, out.cache.layers, strict=True):
        torch.testing.assert_close(k, layer.keys, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_recompute_root_runs_the_leaves_only_up_to_the_probe_layer(kind):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    scoring = uncalibrated().with_reconstruction(ids(model, 6, 4))
    scoring = replace(scoring, scorer=replace(scoring.scorer, probe_layer=1))
    comp = compressor(model, final_cache_len=96, scoring=scoring)
    ran: list[range] = []
    leaf_part = comp.leaves.leaf_part
    comp.leaves.leaf_part = lambda *args: ran.append(args[-1]) or leaf_part(*args)  # records each leaf's layers
    flat = comp.flat.compress_flat(prefix, doc, suffix)  # the upper layers read the leaves' outputs: every leaf layer
    every, ran[:] = ran[:], []
    result = comp.flat.compress_flat(prefix, doc, suffix, recompute=True)
    assert len(every) == len(ran) > 1 and all(len(r) > 2 for r in every)
    assert all(r == range(2) for r in ran), "the re-read needs nothing past the probe's layer"
    assert torch.equal(result.origin, flat.origin), "and selects the same tokens"


def test_recompute_with_whole_units_rereads_every_unit_the_selection_touched():
    model = tiny_model("llama", vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 800, 2), ids(model, RESERVE, 3)
    comp = compressor(model, final_cache_len=96, scoring=uncalibrated().with_reconstruction(ids(model, 6, 4)))
    flat = comp.flat.compress_flat(prefix, doc, suffix, recompute=True)
    kept = flat.origin[flat.origin >= 0]
    units = torch.arange(800) * 10  # single tokens, but for five 7-token units (7-digit numbers) it cut
    numbers = [int(k) for k in kept if int(k) + 7 <= 800 and int(k) + 1 not in kept][:5]
    for first in numbers:
        units[first : first + 7] = units[first]
    whole = comp.flat.compress_flat(prefix, doc, suffix, recompute=True, whole=units)
    reread = whole.origin[whole.origin >= 0]
    assert torch.equal(reread, whole_units(kept, units))
    assert all(set(range(first, first + 7)) <= set(reread.tolist()) for first in numbers)
    assert reread.numel() > kept.numel()
    with torch.no_grad():
        out = model(torch.cat([prefix, doc[reread], suffix])[None], use_cache=True)
    torch.testing.assert_close(whole.next_token_logits, out.logits[0, -1], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="recompute=True"):
        comp.flat.compress_flat(prefix, doc, suffix, whole=units)  # only the re-read can keep units whole


def test_whole_units_closes_short_units_and_stops_at_its_growth():
    units = torch.tensor([0, 1, 1, 1, 2, 3, 3, 3, 3, 3, 4])  # unit 3 is five tokens long
    kept = torch.tensor([2, 5, 10])
    assert whole_units(kept, units, growth=3.0).tolist() == [1, 2, 3, 5, 6, 7, 8, 9, 10]
    assert whole_units(kept, units, longest=3, growth=3.0).tolist() == [1, 2, 3, 5, 10]  # unit 3 is too long to close
    assert whole_units(kept, units, growth=2.0).tolist() == [2, 5, 10]  # 9 tokens is past 2 x 3: as kept
