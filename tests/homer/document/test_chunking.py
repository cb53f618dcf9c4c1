import pytest
import torch

from homer_integrations.homer.document.chunking import ChunkPlan, make_leaves


@pytest.mark.parametrize(("doc_len", "mcl"), [(5, 64), (100, 64), (1000, 128), (4093, 256), (5, 10)])
def test_leaves_split_evenly_share_positions_and_stay_below_mcl(doc_len, mcl):
    P, S = 3, 2
    plan = ChunkPlan.build(P, doc_len, S, mcl)
    doc = torch.arange(1000, 1000 + doc_len)
    leaves = make_leaves(torch.tensor([1, 2, 3]), doc, torch.tensor([7, 8]), plan)
    assert len(leaves) == 2**plan.height
    sizes = [int(leaf.reducible.sum()) for leaf in leaves]
    assert sum(sizes) == doc_len and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert torch.equal(torch.cat([leaf.input_ids[P:-S] for leaf in leaves]), doc)
    for leaf in leaves:
        assert leaf.input_ids.numel() <= mcl
        assert int(leaf.position_ids.max()) < mcl
        assert leaf.position_ids[:P].tolist() == [0, 1, 2]
        # every leaf's suffix sits at the same positions: P + E ..
        assert leaf.position_ids[-S:].tolist() == [P + plan.piece_len, P + plan.piece_len + 1]
        assert not leaf.reducible[:P].any() and not leaf.reducible[-S:].any()
        assert (leaf.origin[:P] == -1).all() and (leaf.origin[-S:] == -1).all()


def test_tree_height_is_log2_of_needed_leaves():
    assert ChunkPlan.build(10, 50, 10, 100).height == 0
    assert ChunkPlan.build(10, 81, 10, 100).height == 1
    assert ChunkPlan.build(10, 400, 10, 100).height == 3  # 5 leaves needed -> 8


def test_affixes_that_fill_the_chunk_are_rejected():
    with pytest.raises(ValueError, match="max_chunk_len"):
        ChunkPlan.build(60, 10, 40, 100)
    with pytest.raises(ValueError, match="no tokens"):
        ChunkPlan.build(1, 0, 1, 100)
