"""Content-defined leaves: boundaries at statement ends chosen by their own tokens, a tree over any number of
leaves, replayed from a leaf tier exactly as computed from scratch; the even split is unchanged."""

from collections import Counter
from itertools import pairwise

import pytest
import torch

from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.content_split import content_bounds, content_plan
from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.leaves.tier_file import tier_from_tensors, whole_tensors
from homer_integrations.homer.tree.merge_tree import MergeTree
from homer_integrations.homer.tree.merging import merge_siblings
from tests.conftest import mode_engine, tiny_model
from tests.homer.leaves.tier_helpers import KINDS, RESERVE, assert_same_compression, compressor, ids


@pytest.fixture(scope="module")
def chapters(novel: str) -> str:
    """About 3,800 tokens of Pride and Prejudice: ~50 leaves of at most 100 tokens."""
    start = novel.index("It is a truth universally acknowledged")
    return novel[start : start + 16000]


def leaves_of(tokenizer, text: str, max_len: int) -> list[tuple[int, ...]]:
    document = encode(tokenizer, text)
    bounds = content_bounds(document, unit_ids(tokenizer, text, "statement"), max_len)
    return [tuple(document[a:b].tolist()) for a, b in pairwise(bounds)]


def test_boundaries_are_statement_ends_and_pieces_fit(tokenizer, chapters):
    document, statements = encode(tokenizer, chapters), unit_ids(tokenizer, chapters, "statement")
    bounds = content_bounds(document, statements, 100)
    lengths = [b - a for a, b in pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == document.numel()
    assert min(lengths) >= 1 and max(lengths) <= 100
    cuts = torch.tensor(bounds[1:-1])
    inside = statements[cuts] == statements[cuts - 1]  # a cut that is not a statement end
    sizes = torch.bincount(statements - statements.min())
    assert bool((sizes[statements[cuts[inside]] - statements.min()] > 100).all()), "only in too long statements"
    assert 0.6 < sum(lengths) / len(lengths) / 100 < 0.8, "leaves about 2/3 full"
    plan = content_plan(10, document, 0, 128, RESERVE, statements)
    assert plan.bounds is not None and plan.num_leaves >= 40
    assert plan.height == (plan.num_leaves - 1).bit_length() and plan.piece_len == max(
        plan.piece(i).stop - plan.piece(i).start for i in range(plan.num_leaves)
    )


def test_editing_a_paragraph_changes_at_most_three_leaves(tokenizer, chapters):
    before = leaves_of(tokenizer, chapters, 100)
    assert len(before) >= 40
    paragraphs = [i for i in range(len(chapters)) if chapters.startswith("\n\n", i)]
    changed = []
    for k in range(len(paragraphs) // 3, 2 * len(paragraphs) // 3, 4):  # edits in the middle third
        start, stop = paragraphs[k], paragraphs[k + 1]
        edited = chapters[:start] + "\n\nShe said nothing more, and the matter rested there a while." + chapters[stop:]
        after = leaves_of(tokenizer, edited, 100)
        new = Counter(after) - Counter(before)
        assert sum(new.values()) <= 3, (k, sum(new.values()))
        changed.append(sum(new.values()))
    assert len(changed) >= 5 and sum(changed) / len(changed) < 2.5


def test_even_plans_are_as_before():
    plan = ChunkPlan.build(5, 803, 4, 128, RESERVE)
    base, extra = divmod(803, plan.num_leaves)
    assert plan.bounds is None and plan.num_leaves == 2**plan.height == 8
    for i in range(plan.num_leaves):
        start = i * base + min(i, extra)
        assert plan.piece(i) == slice(start, start + base + (i < extra))
    model = tiny_model("llama", vocab_size=256)
    tier = compressor(model).leaves.build(ids(model, 5, 1), ids(model, 300, 2))
    assert '"bounds"' not in whole_tensors(tier)[1]["plan"], "even tiers are stored as before"


def power_of_two_tree(tree: MergeTree, leaf, plan, schedule, progress):
    """``MergeTree.tree`` before content splits: 2**h leaves, halved by index."""
    nodes = tree.nodes
    nodes.begin()

    def sub(first: int, height: int, target: int, is_root: bool = False):
        if height == 0:
            return leaf(first, target, is_root)
        left = sub(first, height - 1, plan.child_target_len)
        nodes.alive.append(left)
        right = sub(first + 2 ** (height - 1), height - 1, plan.child_target_len)
        nodes.alive.pop()
        merged = merge_siblings(left, right)
        nodes.run_layers(merged, schedule.layers_at(height), target, is_root)
        return merged

    return sub(0, plan.height, nodes.settings.final_cache_len, True)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_even_tree_is_bit_identical_to_the_power_of_two_tree(kind, monkeypatch):
    model = tiny_model(kind, vocab_size=256)
    prefix, doc, suffix = ids(model, 5, 1), ids(model, 803, 2), ids(model, 4, 3)
    comp = compressor(model)
    now = comp.tree.compress(prefix, doc, suffix)
    tier = comp.leaves.build(prefix, doc)
    replayed = comp.tree.replay(tier, suffix)
    monkeypatch.setattr(MergeTree, "tree", power_of_two_tree)
    before = comp.tree.compress(prefix, doc, suffix)
    assert now.plan.height == 3 and now.plan.bounds is None
    for a, b in [(now, before), (replayed, comp.tree.replay(tier, suffix))]:
        assert torch.equal(a.origin, b.origin) and torch.equal(a.position_ids, b.position_ids)
        assert all(torch.equal(x, y) for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True))
        assert torch.equal(a.next_token_logits, b.next_token_logits)


def content_doc(model, comp, leaves: int) -> torch.Tensor:
    """Document ids whose content split (token windows: no statements) has ``leaves`` leaves."""
    for length in range(100, 2000, 7):
        doc = ids(model, length, 2)
        if comp.nodes.plan(5, doc, 0, RESERVE).num_leaves == leaves:
            return doc
    raise AssertionError(f"no document of {leaves} content leaves")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("leaves", [2, 3, 4, 5, 6])
def test_content_replay_equals_compression_from_scratch(kind, leaves):
    model = tiny_model(kind, vocab_size=256)
    comp = compressor(model, split="content")
    prefix, doc = ids(model, 5, 1), content_doc(model, comp, leaves)
    tier = comp.leaves.build(prefix, doc)
    assert tier.plan.bounds is not None and tier.plan.num_leaves == leaves
    back = tier_from_tensors(*whole_tensors(tier))
    assert back.plan == tier.plan, "bounds round-trip"
    for seed, suffix_len in [(3, 4), (4, RESERVE)]:
        suffix = ids(model, suffix_len, seed)
        scratch = comp.tree.compress(prefix, doc, suffix, plan=tier.plan.with_suffix(suffix_len))
        assert scratch.plan.num_leaves == leaves
        assert_same_compression(comp.tree.replay(back, suffix), scratch)
        # the flat selection: leaf by leaf, and every leaf scored in one batch, keep the same tokens
        flat = comp.flat.replay_flat(tier, suffix)
        assert torch.equal(comp.flat.replay_recompute(tier, prefix, doc, suffix).origin, flat.origin)


def test_an_engine_with_content_leaves_answers_and_keys_them_apart(tokenizer, calibration, text):
    content, even = mode_engine(tokenizer, calibration, split="content"), mode_engine(tokenizer, calibration)
    assert isinstance(content.answer(text, "Who is Mr. Bingley?", max_new_tokens=3), str)
    assert content.entry_key(text, "query_aware") != even.entry_key(text, "query_aware")
    assert content.entry_key(text) == even.entry_key(text), "a document kept whole (auto: full) is split nowhere"
    assert content.entry_key(text, "shared") != even.entry_key(text, "shared")
    tier, _ = content.tiers.leaf_tier(content.prompting.layout("", "query_aware").prefix, text)
    assert tier.plan.bounds is not None and tier.plan.num_leaves > 1
    assert isinstance(content.answer(text, "Who?", mode="shared", max_new_tokens=2), str)


@pytest.mark.parametrize("statements", [None, torch.arange(5600) // 8], ids=["token_windows", "statements"])
def test_repeated_content_holds_no_peak_and_still_fills_leaves(statements):
    """Equal statements tie: none of them is a boundary, so a repetitive document is cut by length alone
    (not into one-token leaves)."""
    bounds = content_bounds(torch.arange(1, 9).repeat(700), statements, 100)
    lengths = [b - a for a, b in pairwise(bounds)]
    assert max(lengths) <= 100 and sum(lengths) / len(lengths) >= 95
