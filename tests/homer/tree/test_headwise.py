"""The head-wise root's candidates: HOMER's selection of twice the budget, or a short document whole."""

import pytest
import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.homer.tree.headwise import select_candidates
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory) -> HomerModel:
    config = HomerConfig(max_chunk_len=128, warmup_layers=3, final_cache_len=64)
    calib = tmp_path_factory.mktemp("calib")
    recipe = Recipe(calibration_segments=2)
    return HomerModel(tiny_model("llama"), tokenizer, config, calibration_dir=calib, progress=False, recipe=recipe)


def candidates(engine: HomerModel, text: str, **kw):
    tiers = engine.tiers
    ids = tiers.prompting.encode_span("Context:\n", text, "\nEnd of context.")
    built = select_candidates(tiers.builder().compressor(True, query_aware=False), *ids, tiers.repeat_ids, **kw)
    return ids, built


def test_candidates_as_many_as_the_document_are_one_plain_prefill_of_it(engine, novel):
    (prefix, document, suffix), built = candidates(engine, novel[:2000], factor=100.0)
    assert document.numel() > 4 * 64, "a document the budget would prune"
    P, N, S = prefix.numel(), document.numel(), suffix.numel()
    assert torch.equal(built.origin, torch.cat([torch.full((P,), -1), torch.arange(N), torch.full((S,), -1)]))
    assert torch.equal(built.position_ids, torch.arange(P + N + S))
    assert built.plan.height > 0, "reported with the split HOMER would have used"
    ids = torch.cat([prefix, document, suffix])[None]
    with torch.inference_mode():
        cache = engine.model(ids, use_cache=True).cache
    for layer, (k, v) in enumerate(zip(built.keys, built.values, strict=True)):
        torch.testing.assert_close(k, cache.layers[layer].keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, cache.layers[layer].values, atol=1e-4, rtol=1e-4)


def test_homer_selects_twice_the_budget(engine, novel):
    (prefix, document, suffix), built = candidates(engine, novel[:2000])
    fixed = prefix.numel() + suffix.numel()
    assert built.origin.numel() == fixed + 2 * (64 - fixed), "CANDIDATES x the budget's document tokens"
    kept = built.origin[built.origin >= 0]
    assert bool((kept[1:] > kept[:-1]).all()) and kept.numel() < document.numel(), "a selection, in order"
    assert torch.equal(built.position_ids, torch.arange(built.origin.numel())), "re-read by one prefill"


def test_a_document_past_the_probes_room_is_selected_to_fit_it(engine, novel):
    (prefix, document, suffix), built = candidates(engine, novel[:9000], factor=100.0)
    window = engine.model.config.max_position_embeddings
    assert document.numel() + prefix.numel() + suffix.numel() > window // 2
    assert built.origin.numel() < document.numel(), "HOMER cut it"
    assert built.origin.numel() + engine.tiers.repeat_ids.numel() + (built.origin >= 0).sum() <= window, (
        "the candidates, the prompt and one segment of their repeat stay inside the window"
    )


def test_candidates_keep_every_word_they_touch_whole(engine, novel):
    text = novel[:2000]
    words = engine.tiers.unit_ids(text, engine.tiers.prompting.encode_span("", text, "")[1], "word")
    _, cut = candidates(engine, text)
    _, whole = candidates(engine, text, whole=words)
    touched = words[cut.origin[cut.origin >= 0]].unique()
    kept = whole.origin[whole.origin >= 0]
    assert torch.equal(kept, torch.isin(words, touched).nonzero()[:, 0]), "the same selection, its words whole"
    assert kept.numel() > (cut.origin >= 0).sum(), "the selection had cut words"
    assert torch.equal(whole.position_ids, torch.arange(whole.origin.numel())), "re-read by one prefill"
