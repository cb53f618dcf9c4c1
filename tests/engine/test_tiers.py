"""HomerModel's two tiers: the shared root and the per-question path replayed from the leaf tier."""

import warnings
from pathlib import Path

import pytest
import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.leaves.tier_file import named, whole_tensors
from homer_integrations.homer.reading.strategies import (
    SHARED_ROOTS,
    AutoRoot,
    FlatReplay,
    FlatRoot,
    HeadwiseRoot,
    Recipe,
    RecomputeReplay,
    RecomputeRoot,
    TreeReplay,
    TreeRoot,
)
from homer_integrations.homer.scoring.chain import REPEAT_PROMPT, Scoring
from tests.conftest import tiny_model
from tests.homer.leaves.tier_helpers import assert_same_tier

CFG = dict(max_chunk_len=128, warmup_layers=3)
LAST_TOKEN = dict(scoring=Scoring.default(), question_scoring=Scoring.for_questions())
"""The paper's last-token shared scorer, questions pruned by the package's question recipe."""


def recipe_of(**switches) -> Recipe:
    """A ``Recipe`` with these switches and a two-segment calibration (fast on the tiny model)."""
    return Recipe(calibration_segments=2, **switches)


FAST = recipe_of()
"""The package's recipe."""


def make_engine(tokenizer, calib, cache=None, recipe: Recipe = FAST, **overrides) -> HomerModel:
    return HomerModel(
        tiny_model("llama"),
        tokenizer,
        HomerConfig(**{**CFG, **overrides}),
        calibration_dir=calib,
        document_cache=cache,
        progress=False,
        recipe=recipe,
    )


def plain_generate(engine: HomerModel, doc: str, question: str, new_tokens: int) -> str:
    """transformers' own greedy ``generate`` over the engine's layout of ``doc`` and ``question``, uncompressed."""
    lay, tok = engine.prompting.layout(question), engine.tokenizer
    spans = [(lay.prefix, True), (doc, False), (lay.suffix, True), (lay.continuation, True)]
    ids = torch.cat([encode(tok, text, first=i == 0, formatted=fmt) for i, (text, fmt) in enumerate(spans)])[None]
    out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    return tmp_path_factory.mktemp("calib")


@pytest.fixture(scope="module")
def text(novel):
    return novel[:6000]  # ~1.5k tokens: a tree of height 4 at max_chunk_len 128


def test_second_question_replays_from_the_tier_without_rerunning_the_leaves(tokenizer, calib, text):
    engine = make_engine(tokenizer, calib, mode="query_aware")
    first = engine.run(text, "Who is Mr. Bingley?", max_new_tokens=4)
    first.text()
    assert first.info.mode == "query_aware" and first.info.cache_source == "computed"
    assert first.info.document_seconds > 0
    second = engine.run(text, "Where is Netherfield?", max_new_tokens=4)
    second.text()
    assert second.info.cache_source == "memory" and second.info.document_seconds == 0
    stats = engine.document_cache.stats()
    assert stats.computations == 1, "one leaf tier for both questions"
    (entry,) = engine.document_cache.entries()
    assert entry.kind == "leaf_tier" and entry.document_tokens == first.info.document_tokens


def test_a_first_query_aware_question_computes_no_calibration(tokenizer, text, tmp_path):
    # question attention reads no bias: a fresh engine must not spend minutes calibrating for it
    engine = make_engine(tokenizer, tmp_path, mode="query_aware")
    asked = engine.run(text, "Who is Mr. Bingley?", max_new_tokens=3)
    asked.text()
    assert asked.info.cache_tokens < asked.info.document_tokens, "the question's compression pruned"
    assert not list(tmp_path.iterdir()), "no calibration table computed"
    shared = engine.run(text, "Who is Mr. Bingley?", mode="shared", max_new_tokens=3)
    shared.text()
    assert list(tmp_path.iterdir()), "the shared root's merged nodes still calibrate"


def test_replayed_compression_equals_a_query_aware_compression_from_scratch(tokenizer, calib, text):
    # the calibrated scorer, real word units and score memory, a real chat layout
    # (with the last-token shared scorer: no reconstruction prior in the tier)
    engine = make_engine(tokenizer, calib, mode="query_aware", recipe=recipe_of(replay=TreeReplay(), **LAST_TOKEN))
    question = "Who is Mr. Bingley?"
    replayed = engine.compress(text[:4000], question=question)
    layout = engine.prompting.layout(question)
    prefix_ids, document_ids, suffix_ids = engine.prompting.encode_span(layout.prefix, text[:4000], layout.suffix)
    tier, _ = engine.tiers.leaf_tier(layout.prefix, text[:4000])
    assert tier.plan.planned_suffix_len == engine.prompting.shared_suffix_len < suffix_ids.numel()
    scratch = (
        engine.tiers.builder()
        .compressor(True, query_aware=True)
        .tree.compress(
            prefix_ids,
            document_ids,
            suffix_ids,
            word_ids=engine.tiers.unit_ids(text[:4000], document_ids, engine.tiers.question_scoring.unit),
            plan=tier.plan.with_suffix(suffix_ids.numel()),
        )
    )
    assert scratch.plan.height >= 3
    assert torch.equal(replayed.origin, scratch.origin), "the same tokens survive"
    for a, b in zip(replayed.keys + replayed.values, scratch.keys + scratch.values, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_one_engine_serves_both_tiers_per_call(tokenizer, calib, text):
    engine = make_engine(tokenizer, calib)
    aware = engine.run(text, "Who?", mode="query_aware", max_new_tokens=4)
    aware.text()
    shared = engine.run(text, "Who?", mode="shared", max_new_tokens=4)
    shared.text()
    assert (shared.info.mode, aware.info.mode) == ("shared", "query_aware")
    kinds = sorted(e.kind for e in engine.document_cache.entries())
    assert kinds == ["leaf_tier", "root"]
    assert engine.prompting.layout("Who?", "shared").suffix != engine.prompting.layout("Who?", "query_aware").suffix
    # the root's key does not depend on the configured mode: one root serves both configurations
    shared_engine = make_engine(tokenizer, calib, mode="shared")
    assert shared_engine.tiers.keys.root("p", "doc", "s") == engine.tiers.keys.root("p", "doc", "s")


def test_tier_is_kept_on_disk_and_served_to_a_fresh_process(tokenizer, calib, text, tmp_path):
    question = "Who is Mr. Bingley?"
    writer = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    expected = writer.answer(text, question, max_new_tokens=6)
    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    stream = reader.run(text, question, max_new_tokens=6)
    assert stream.text() == expected
    assert stream.info.cache_source == "disk"
    assert reader.document_cache.stats().computations == 0
    (entry,) = reader.document_cache.entries()
    assert entry.kind == "leaf_tier" and entry.on_disk and entry.disk_bytes > 0


def test_the_stored_tier_of_a_document_of_one_leaf_is_read_back(tokenizer, calib, text, tmp_path):
    short = text[:150]  # one leaf: its tier runs every layer of the model
    writer = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    writer.answer(short, "Who?", max_new_tokens=4)
    tier = writer.document_cache.get(writer.tiers.keys.tier(writer.prompting.layout("Who?").prefix, short))
    assert isinstance(tier, LeafTier) and tier.plan.num_leaves == 1
    assert tier.leaf_layers == writer.model.config.num_hidden_layers


@pytest.mark.parametrize(
    ("mode", "split"), [("shared", "even"), ("query_aware", "even"), ("query_aware", "content"), ("full", "even")]
)
@pytest.mark.parametrize("length", [150, 600, 6000], ids=["one leaf", "a few leaves", "a tree"])
def test_every_stored_entry_is_read_back_by_a_new_engine(tokenizer, calib, text, tmp_path, mode, split, length):
    document = text[:length]
    expected = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode=mode, split=split).answer(
        document, "Who?", max_new_tokens=4
    )
    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode=mode, split=split)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing discarded, nothing left unkept
        stream = reader.run(document, "Who?", max_new_tokens=4)
        assert stream.text() == expected
    assert stream.info.cache_source == "disk"


def test_a_damaged_tier_on_disk_is_recomputed(tokenizer, calib, text, tmp_path):
    writer = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    expected = writer.answer(text, "Who?", max_new_tokens=4)
    layout = writer.prompting.layout("Who?")
    key = writer.tiers.keys.tier(layout.prefix, text)
    tier = writer.document_cache.get(key)
    assert isinstance(tier, LeafTier)
    damaged = whole_tensors(tier)[0] | {"hidden": torch.full_like(whole_tensors(tier)[0]["hidden"], float("nan"))}
    bad = named(damaged, key, tier.plan, tier.leaf_layers)
    writer.document_cache.stored.write(key, bad, None)  # a well-formed entry whose checksum matches
    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    with pytest.warns(UserWarning, match="NaN"):
        stream = reader.run(text, "Who?", max_new_tokens=4)
        assert stream.text() == expected
    assert stream.info.cache_source == "computed"


def test_query_aware_single_chunk_document_is_the_plain_forward(tokenizer, calib):
    engine = make_engine(tokenizer, calib, mode="query_aware")
    doc, question = "Alice has a red bicycle. The meeting is in room 42.", "Which room?"
    stream = engine.run(doc, question, max_new_tokens=5)
    answer = stream.text()
    assert stream.info.compression.tree_height == 0
    assert answer == plain_generate(engine, doc, question, 5)


def test_full_mode_keeps_the_whole_prompt_and_answers_like_a_plain_prefill(tokenizer, calib, text, tmp_path):
    engine = make_engine(tokenizer, calib, DocumentCache(tmp_path))
    doc, question = text[:3000], "Who is Mr. Bingley?"
    stream = engine.run(doc, question, mode="full", max_new_tokens=5)
    answer = stream.text()
    info = stream.info
    assert info.mode == "full" and info.cache_tokens == info.compression.prompt_tokens > 128
    assert info.compression.tree_height == 0
    assert answer == plain_generate(engine, doc, question, 5)
    again = make_engine(tokenizer, calib, DocumentCache(tmp_path)).run(doc, question, mode="full", max_new_tokens=5)
    assert again.text() == answer and again.info.cache_source == "disk", "validated against the window, not MCL"
    with pytest.raises(ValueError, match="window"):
        engine.answer(text * 2, question, mode="full")


def test_the_leaf_tier_splits_the_document_as_the_shared_root_does(tokenizer, calib, text):
    engine = make_engine(tokenizer, calib)
    root = engine.compress(text)
    layout = engine.prompting.layout("Who?", "query_aware")
    tier, _ = engine.tiers.leaf_tier(layout.prefix, text)
    shared = engine.prompting.layout("Who?", "shared")
    prefix_ids, document_ids, suffix_ids = engine.prompting.encode_span(shared.prefix, text, shared.suffix)
    plan = ChunkPlan.build(prefix_ids.numel(), document_ids.numel(), suffix_ids.numel(), engine.config.max_chunk_len)
    assert tier.plan.height == root.stats.tree_height == plan.height
    assert tier.plan.piece_len == plan.piece_len and tier.plan.effective_len == plan.effective_len


def test_reconstruction_root_is_one_depth_first_compression(tokenizer, calib, text):
    base = make_engine(tokenizer, calib, recipe=recipe_of(**LAST_TOKEN))
    engine = make_engine(tokenizer, calib)  # the default shared scorer: reconstruction
    scoring = base.tiers.scoring.with_reconstruction(encode(tokenizer, REPEAT_PROMPT))
    assert engine.tiers.scoring == scoring == scoring.with_reconstruction(encode(tokenizer, REPEAT_PROMPT))
    shared = engine.run(text, "Who?", mode="shared", max_new_tokens=3)
    shared.text()
    assert shared.info.mode == "shared" and shared.info.cache_source == "computed"
    assert shared.info.cache_tokens <= engine.config.final_cache_len < shared.info.document_tokens
    assert [e.kind for e in engine.document_cache.entries()] == ["root"], "no leaf tier for the shared root"
    assert engine.tiers.keys.root("a", "b", "c") != base.tiers.keys.root("a", "b", "c")
    again = engine.run(text, "Where?", mode="shared", max_new_tokens=3)
    again.text()
    assert again.info.cache_source == "memory"
    # a query-aware question builds the tier and scores with the question (no probe needed)
    asked = engine.run(text, "Who is Mr. Bingley?", mode="query_aware", max_new_tokens=3)
    asked.text()
    assert asked.info.cache_source == "computed" and engine.document_cache.stats().computations == 2


@pytest.mark.parametrize("mode", ["query_aware", "shared"])
def test_recompute_answers_as_generate_over_the_kept_tokens(tokenizer, calib, text, mode):
    """``RecomputeReplay``/``RecomputeRoot``: the cache is the plain prefill of the tokens the flat
    selection kept, so the engine answers exactly as transformers' ``generate`` over that prompt."""
    recomputes = recipe_of(replay=RecomputeReplay(), shared_root=RecomputeRoot())
    engine = make_engine(tokenizer, calib, mode=mode, recipe=recomputes, final_cache_len=64)
    flat = make_engine(
        tokenizer, calib, mode=mode, recipe=recipe_of(replay=FlatReplay(), shared_root=FlatRoot()), final_cache_len=64
    )
    question = "Who is Mr. Bingley?"
    doc = engine.compress(text, question=question if mode == "query_aware" else None)
    assert doc.stats.tree_height >= 2 and doc.stats.cache_tokens == 64
    assert torch.equal(doc.position_ids, torch.arange(64))
    same = flat.compress(text, question=question if mode == "query_aware" else None)
    assert torch.equal(doc.origin, same.origin), "the flat selection's tokens"
    kept = doc.origin[doc.origin >= 0]
    lay, tok = engine.prompting.layout(question, mode), engine.tokenizer
    prefix_ids, document_ids, suffix_ids = engine.prompting.encode_span(lay.prefix, text, lay.suffix)
    ids = torch.cat([prefix_ids, document_ids[kept], suffix_ids, encode(tok, lay.continuation, formatted=True)])[None]
    out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    expected = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert engine.answer(text, question, max_new_tokens=6) == expected
    assert engine.tiers.keys.root("a", "b", "c") != flat.tiers.keys.root("a", "b", "c")


@pytest.mark.parametrize("shared_root", ["flat", "tree"])
def test_shared_root_selection_is_a_setting_of_the_key(tokenizer, calib, text, shared_root):
    engine = make_engine(tokenizer, calib, recipe=recipe_of(shared_root=SHARED_ROOTS[shared_root]), final_cache_len=64)
    events = []
    engine.tiers.prune_observer = events.append
    doc = engine.compress(text)
    assert doc.stats.tree_height >= 2 and doc.stats.cache_tokens == 64
    layers = {e.layer for e in events}
    if shared_root == "flat":  # every pruning happened on the leaves' own scores, nothing above them
        assert len(layers) == 1
    else:  # the paper's tree prunes again at the merged nodes' layers
        assert len(layers) > 1
    other = make_engine(
        tokenizer, calib, recipe=recipe_of(shared_root=TreeRoot() if shared_root == "flat" else FlatRoot())
    )
    assert engine.tiers.keys.root("a", "b", "c") != other.tiers.keys.root("a", "b", "c")


def test_a_stored_tier_is_memory_mapped_and_not_counted_against_the_memory_budget(tokenizer, calib, text, tmp_path):
    question, later = "Who is Mr. Bingley?", "Where is Netherfield?"
    in_ram = make_engine(tokenizer, calib, DocumentCache(), mode="query_aware")
    expected = [in_ram.answer(text, q, max_new_tokens=6) for q in (question, later)]
    tier_bytes = in_ram.document_cache.entries()[0].nbytes

    # a memory budget a tenth of the tier: held in RAM it could not be kept, mapped it costs nothing
    cache = DocumentCache(tmp_path, memory_budget_bytes=tier_bytes // 10)
    engine = make_engine(tokenizer, calib, cache, mode="query_aware")
    first = engine.run(text, question, max_new_tokens=6)
    assert first.text() == expected[0] and first.info.cache_source == "computed"
    second = engine.run(text, later, max_new_tokens=6)
    assert second.text() == expected[1], "a replay from the mapped file answers as one from memory"
    assert second.info.cache_source == "memory" and cache.stats().computations == 1
    key = engine.tiers.keys.tier(engine.prompting.layout(question).prefix, text)
    tier = cache.get(key)
    assert isinstance(tier, LeafTier) and tier.mapped
    assert cache.stats().memory_bytes < tier_bytes // 10
    (entry,) = cache.entries()
    assert entry.in_memory and entry.nbytes == tier_bytes, "statistics still report the tier's size"

    # a fresh process maps it from disk; a flipped byte in the file is caught by the checksum
    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    assert reader.answer(text, later, max_new_tokens=6) == expected[1]
    assert reader.document_cache.get(key).mapped
    path = tmp_path / next(p.name for p in tmp_path.glob("*.safetensors"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    damaged = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    with pytest.warns(UserWarning, match="checksum"):
        stream = damaged.run(text, later, max_new_tokens=6)
        assert stream.text() == expected[1]
    assert stream.info.cache_source == "computed"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's memory maps (Linux)")
def test_a_tier_is_built_inside_its_stored_file_not_in_process_memory(tokenizer, calib, text, tmp_path):
    question = "Who is Mr. Bingley?"
    in_ram = make_engine(tokenizer, calib, DocumentCache(), mode="query_aware")
    expected = in_ram.answer(text, question, max_new_tokens=6)
    reference = in_ram.document_cache.get(in_ram.tiers.keys.tier(in_ram.prompting.layout(question).prefix, text))

    cache = DocumentCache(tmp_path)
    engine = make_engine(tokenizer, calib, cache, mode="query_aware")
    assert engine.answer(text, question, max_new_tokens=6) == expected
    tier = cache.get(engine.tiers.keys.tier(engine.prompting.layout(question).prefix, text))
    assert isinstance(tier, LeafTier) and tier.mapped
    (stored,) = tmp_path.glob("*.safetensors")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no staged file is left"
    address = tier.pieces[0].keys[0].untyped_storage().data_ptr()
    owners = [
        line.split(maxsplit=5)[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if int(line.split("-")[0], 16) <= address < int(line.split()[0].split("-")[1], 16)
    ]
    assert owners == [str(stored)], "the tier's K/V are pages of the stored entry, written during the build"
    assert_same_tier(tier, reference, atol=0)
    assert (
        make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware").answer(
            text, question, max_new_tokens=6
        )
        == expected
    ), "the file verifies and replays in a fresh cache"


def test_a_failed_tier_build_leaves_no_staged_file(tmp_path):
    cache = DocumentCache(tmp_path)
    allocate = cache.allocator("k" * 64)

    def build() -> LeafTier:
        allocate({"hidden": ((4, 2), torch.float32)})
        assert [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "the build writes into a staged file"
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        cache.get_or_compute("k" * 64, build)
    assert not [p for p in tmp_path.iterdir() if p.is_file()]


def test_a_disk_without_room_for_the_tier_builds_it_in_memory(tokenizer, calib, text, tmp_path, monkeypatch, caplog):
    """No space for the staged file is found before the build (blocks are reserved up front), never
    as a crash when a page of the mapping is written: the tier is built in memory and still answers."""
    import errno
    import os

    question = "Who is Mr. Bingley?"
    expected = make_engine(tokenizer, calib, DocumentCache(), mode="query_aware").answer(
        text, question, max_new_tokens=6
    )

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room, raising=False)
    engine = make_engine(tokenizer, calib, DocumentCache(tmp_path), mode="query_aware")
    with caplog.at_level("WARNING", logger="homer_integrations"):
        assert engine.answer(text, question, max_new_tokens=6) == expected
    assert "building the leaf tier" in caplog.text and "No space left" in caplog.text
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_headwise_root_spends_the_dense_roots_bytes_per_head_and_answers_the_same_from_disk(
    tokenizer, calib, text, tmp_path
):
    question = "Who is Mr. Bingley?"
    headwise = recipe_of(shared_root=HeadwiseRoot())
    engine = make_engine(tokenizer, calib, DocumentCache(tmp_path), headwise, final_cache_len=64)
    doc = engine.compress(text)
    dense = make_engine(tokenizer, calib, recipe=recipe_of(shared_root=FlatRoot()), final_cache_len=64).compress(text)
    lengths = doc.head_lengths
    assert lengths is not None and lengths.shape == (6, 2) and len(set(lengths.flatten().tolist())) > 1
    assert int(lengths.sum()) == 6 * 2 * 64, "L x Hkv x the budget, spread as the heads need"
    assert doc.nbytes == dense.nbytes and doc.stats.cache_tokens == doc.num_tokens == 64
    assert doc.origin.numel() > 64, "the heads keep more distinct tokens than one dense set of the budget"
    assert doc.stats.peak_kv_bytes > 1.5 * doc.nbytes, "the probe held its candidates (twice the budget's document)"
    assert engine.tiers.keys.root("a", "b", "c") != make_engine(tokenizer, calib).tiers.keys.root("a", "b", "c")
    first = engine.run(text, question, max_new_tokens=6)
    expected = first.text()
    assert first.info.cache_tokens == 64 and expected

    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), headwise, final_cache_len=64)
    again = reader.run(text, question, max_new_tokens=6)
    assert again.text() == expected and again.info.cache_source == "disk"


def test_headwise_root_refuses_a_model_with_sliding_windows(tokenizer, calib, text):
    model = tiny_model("mistral", sliding_window=96)
    cfg = HomerConfig(**{**CFG, "final_cache_len": 64})
    engine = HomerModel(
        model, tokenizer, cfg, calibration_dir=calib, progress=False, recipe=recipe_of(shared_root=HeadwiseRoot())
    )
    with pytest.raises(ValueError, match=r"sliding window: use Recipe\(shared_root=FlatRoot\(\)\)"):
        engine.compress(text)


def test_auto_root_is_headwise_where_the_model_allows_and_flat_where_it_has_sliding_windows(
    tokenizer, calib, text, caplog
):
    auto = make_engine(tokenizer, calib, final_cache_len=64)
    assert auto.recipe.shared_root == AutoRoot() and Recipe().shared_root == AutoRoot(), "the default"
    doc = auto.compress(text)
    headwise = make_engine(tokenizer, calib, recipe=recipe_of(shared_root=HeadwiseRoot()), final_cache_len=64).compress(
        text
    )
    assert doc.head_lengths is not None and torch.equal(doc.head_lengths, headwise.head_lengths)
    assert all(torch.equal(a, b) for a, b in zip(doc.keys, headwise.keys, strict=True))

    model = tiny_model("mistral", sliding_window=96)
    auto_cfg = HomerConfig(**{**CFG, "final_cache_len": 64})
    windowed = HomerModel(model, tokenizer, auto_cfg, calibration_dir=calib, progress=False, recipe=recipe_of())
    with caplog.at_level("INFO", logger="homer_integrations"):
        doc = windowed.compress(text)
    flat = HomerModel(
        model, tokenizer, auto_cfg, calibration_dir=calib, progress=False, recipe=recipe_of(shared_root=FlatRoot())
    ).compress(text)
    assert doc.head_lengths is None and "uses the flat root" in caplog.text and "sliding window" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(doc.keys, flat.keys, strict=True))


def test_a_headwise_root_numbered_past_the_chunk_length_is_read_back_from_disk(tokenizer, calib, text, tmp_path):
    engine = make_engine(tokenizer, calib, DocumentCache(tmp_path), final_cache_len=100)
    doc = engine.compress(text)
    assert doc.head_lengths is not None and doc.last_position >= 128, "the re-read numbers its candidates 0..W-1"
    reader = make_engine(tokenizer, calib, DocumentCache(tmp_path), final_cache_len=100)
    assert reader.run(text, "Who is Mr. Bingley?", mode="shared", max_new_tokens=2).info.cache_source == "disk"
