"""An edited document's leaf tier copies the leaves its edit did not touch from the tier of the version before."""

import io

import pytest
import torch

from homer_integrations.cli import cache as cache_command
from homer_integrations.homer.leaves.leaf_pass import LeafPass
from tests.conftest import mode_engine
from tests.homer.leaves.tier_helpers import assert_same_tier

QUESTION = "Who is Mr. Bingley?"


@pytest.fixture(scope="module")
def versions(novel: str) -> tuple[str, str]:
    """About 1,100 tokens of Pride and Prejudice, and the same with one paragraph in the middle rewritten."""
    start = novel.index("It is a truth universally acknowledged")
    v1 = novel[start : start + 4500]
    paragraphs = [i for i in range(len(v1)) if v1.startswith("\n\n", i)]
    middle = len(paragraphs) // 2
    a, b = paragraphs[middle], paragraphs[middle + 1]
    return v1, v1[:a] + "\n\nShe said nothing more, and the matter rested there a while." + v1[b:]


def counted(monkeypatch) -> list[int]:
    """Leaves run through the leaf layers from now on (one entry per leaf)."""
    computed: list[int] = []
    leaf_part = LeafPass.leaf_part

    def counting(self, prefix, piece_ids, offset, layers):
        computed.append(offset)
        return leaf_part(self, prefix, piece_ids, offset, layers)

    monkeypatch.setattr(LeafPass, "leaf_part", counting)
    return computed


def tier_of(engine, document: str):
    return engine.tiers.leaf_tier(engine.prompting.layout("", "query_aware").prefix, document)[0]


def test_an_edited_documents_tier_computes_only_the_leaves_around_the_edit(
    tokenizer, calibration, versions, monkeypatch
):
    v1, v2 = versions
    engine = mode_engine(tokenizer, calibration, split="content")
    engine.cache_document(v1)
    computed = counted(monkeypatch)
    engine.cache_document(v2)
    tier = tier_of(engine, v2)
    assert tier.plan.num_leaves >= 12
    assert 1 <= len(computed) <= 3, computed

    fresh = mode_engine(tokenizer, calibration, split="content")
    computed.clear()
    scratch = tier_of(fresh, v2)
    assert len(computed) == scratch.plan.num_leaves, "a fresh engine holds no leaves to copy"
    assert_same_tier(tier, scratch)
    kept = engine.compress(v2, question=QUESTION).origin
    assert torch.equal(kept, fresh.compress(v2, question=QUESTION).origin)
    assert engine.answer(v2, QUESTION, max_new_tokens=4) == fresh.answer(v2, QUESTION, max_new_tokens=4)


def test_even_splits_copy_nothing(tokenizer, calibration, versions, monkeypatch):
    v1, v2 = versions
    engine = mode_engine(tokenizer, calibration)
    assert engine.tiers.leaf_index is None
    engine.cache_document(v1)
    computed = counted(monkeypatch)
    engine.cache_document(v2)
    assert len(computed) == tier_of(engine, v2).plan.num_leaves


def store_engine(tokenizer, calibration, store):
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe
    from tests.conftest import tiny_model

    config = HomerConfig(max_chunk_len=128, warmup_layers=3, split="content", mode="query_aware")
    return HomerModel(
        tiny_model(), tokenizer, config, calibration_dir=calibration, progress=False, store=store,
        recipe=Recipe(calibration_segments=2),
    )  # fmt: skip


def test_a_tier_read_from_the_store_lends_its_leaves(tokenizer, calibration, versions, monkeypatch, tmp_path):
    v1, v2 = versions
    assert store_engine(tokenizer, calibration, tmp_path).cache_document(v1)[1] == "computed"
    engine = store_engine(tokenizer, calibration, tmp_path)  # a new process's memory: nothing held
    assert engine.cache_document(v1)[1] == "disk"
    computed = counted(monkeypatch)
    engine.cache_document(v2)
    assert 1 <= len(computed) <= 3, computed
    expected = mode_engine(tokenizer, calibration, split="content")
    assert engine.answer(v2, QUESTION, max_new_tokens=4) == expected.answer(v2, QUESTION, max_new_tokens=4)


def test_a_new_process_copies_the_leaves_of_a_tier_an_earlier_one_stored(
    tokenizer, calibration, versions, monkeypatch, tmp_path
):
    v1, v2 = versions
    assert store_engine(tokenizer, calibration, tmp_path).cache_document(v1)[1] == "computed"
    engine = store_engine(tokenizer, calibration, tmp_path)  # a new process: it never saw v1
    computed = counted(monkeypatch)
    assert engine.cache_document(v2)[1] == "computed"
    tier = tier_of(engine, v2)
    assert 1 <= len(computed) <= 3 < tier.plan.num_leaves, computed
    expected = mode_engine(tokenizer, calibration, split="content")
    assert_same_tier(tier, tier_of(expected, v2))
    assert engine.answer(v2, QUESTION, max_new_tokens=4) == expected.answer(v2, QUESTION, max_new_tokens=4)


def test_an_evicted_tier_costs_nothing_as_each_leaf_is_an_entry_of_its_own(
    tokenizer, calibration, versions, monkeypatch, tmp_path
):
    v1, v2 = versions
    first = store_engine(tokenizer, calibration, tmp_path)
    first.cache_document(v1)
    first.document_cache.store.remove(first.entry_key(v1))  # the tier evicted, its leaves still stored
    engine = store_engine(tokenizer, calibration, tmp_path)
    computed = counted(monkeypatch)
    engine.cache_document(v2)
    tier = tier_of(engine, v2)
    assert 1 <= len(computed) <= 3 < tier.plan.num_leaves, "the unchanged leaves read from their entries"
    assert_same_tier(tier, tier_of(mode_engine(tokenizer, calibration, split="content"), v2))


def stored_kinds(engine) -> dict[str, list]:
    """The store's entries by kind (``root``, ``leaf_tier``, ``leaf``)."""
    kinds: dict[str, list] = {}
    for entry in engine.document_cache.store.entries().values():
        kinds.setdefault(entry.kind, []).append(entry)
    return kinds


def test_a_content_split_tier_is_stored_as_its_leaves_each_stored_once(tokenizer, calibration, versions, tmp_path):
    v1, v2 = versions
    engine = store_engine(tokenizer, calibration, tmp_path)
    engine.cache_document(v1)
    one = tier_of(engine, v1)
    assert one.leaf_keys is not None and len(one.leaf_keys) == one.plan.num_leaves
    assert len(stored_kinds(engine)["leaf"]) == one.plan.num_leaves
    engine.cache_document(v2)
    two = tier_of(engine, v2)
    kinds = stored_kinds(engine)
    assert len(kinds["leaf"]) == len(set(one.leaf_keys) | set(two.leaf_keys)) < 2 * one.plan.num_leaves
    (head,) = [e for e in kinds["leaf_tier"] if e.key == engine.entry_key(v2)]
    leaves = sum(e.disk_bytes for e in kinds["leaf"])
    assert head.disk_bytes < leaves / 10, "the tier's own entry holds its prefix and its leaves' keys"
    listing = io.StringIO()
    cache_command._ls(engine.document_cache, False, listing)
    lines = listing.getvalue().splitlines()
    assert len(lines) == 1 + 2 + 1 and lines[-1].startswith(
        f"2 document(s) and {len(kinds['leaf'])} leaves their tiers share"
    )
    reader = store_engine(tokenizer, calibration, tmp_path)  # a new process
    read = tier_of(reader, v2)
    assert read.mapped and read.leaf_keys == two.leaf_keys
    assert_same_tier(read, tier_of(mode_engine(tokenizer, calibration, split="content"), v2))


def test_removing_a_tier_takes_along_the_leaves_no_other_tier_lists(tokenizer, calibration, versions, tmp_path):
    v1, v2 = versions
    engine = store_engine(tokenizer, calibration, tmp_path)
    engine.cache_document(v1)
    engine.cache_document(v2)
    one, two = set(tier_of(engine, v1).leaf_keys), set(tier_of(engine, v2).leaf_keys)
    assert one - two and one & two, "the edit changed a few leaves and kept the rest"
    cache = engine.document_cache
    said = io.StringIO()
    cache_command._rm(cache, [engine.entry_key(v1)[:12]], False, said)  # homer-qa cache rm <key as ls shows it>
    assert said.getvalue().startswith(f"removed 1 cached document(s) and {len(one - two)} leaves no other")
    assert {e.key for e in stored_kinds(engine)["leaf"]} == two, "v1's own leaves went, the shared ones stayed"
    assert cache.discard(engine.entry_key(v2))
    assert "leaf" not in stored_kinds(engine) and "leaf_tier" not in stored_kinds(engine)
    assert store_engine(tokenizer, calibration, tmp_path).cache_document(v2)[1] == "computed"


def test_removing_tiers_together_takes_every_leaf_they_list_once(tokenizer, calibration, versions, tmp_path):
    engine = store_engine(tokenizer, calibration, tmp_path)
    keys = [engine.entry_key(v) for v in versions]
    for v in versions:
        engine.cache_document(v)
    leaves = set().union(*(tier_of(engine, v).leaf_keys for v in versions))
    assert engine.document_cache.discard_many([*keys, keys[0], "no-such-key"]) == (2, len(leaves))
    assert not stored_kinds(engine) and engine.document_cache.discard_many(keys) == (0, 0)


@pytest.mark.parametrize("damage", ["removed", "corrupted"])
def test_a_lost_leaf_is_computed_again_and_the_rest_read(
    tokenizer, calibration, versions, monkeypatch, tmp_path, damage
):
    v1, _ = versions
    engine = store_engine(tokenizer, calibration, tmp_path)
    engine.cache_document(v1)
    lost = tier_of(engine, v1).leaf_keys[3]
    if damage == "removed":
        assert engine.document_cache.store.remove(lost)
    else:
        path = engine.document_cache.store.tensors_file(lost)
        path.write_bytes(path.read_bytes()[:-64] + b"\x00" * 64)
    reader = store_engine(tokenizer, calibration, tmp_path)
    computed = counted(monkeypatch)
    with pytest.warns(UserWarning, match=f"its leaf {lost[:12]}"):
        reader.cache_document(v1)
    assert len(computed) == 1, "only the lost leaf"
    assert_same_tier(tier_of(reader, v1), tier_of(mode_engine(tokenizer, calibration, split="content"), v1))
    assert store_engine(tokenizer, calibration, tmp_path).cache_document(v1)[1] == "disk", "whole again"
