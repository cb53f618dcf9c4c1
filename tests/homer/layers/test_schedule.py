import pytest

from homer_integrations.homer.layers.schedule import LayerSchedule

# Llama-2-7b in the paper: 32 layers, W = 12, so M = 20 merging layers shared by h + 1 levels;
# lpc = M // (h+1), lo = M - lpc*(h+1). Worked out by hand from section 3 of the paper.
PAPER_7B = {
    0: [(0, 32)],
    1: [(0, 22), (22, 32)],
    2: [(0, 20), (20, 26), (26, 32)],
    3: [(0, 17), (17, 22), (22, 27), (27, 32)],
    4: [(0, 16), (16, 20), (20, 24), (24, 28), (28, 32)],
    5: [(0, 17), (17, 20), (20, 23), (23, 26), (26, 29), (29, 32)],
    6: [(0, 20), (20, 22), (22, 24), (24, 26), (26, 28), (28, 30), (30, 32)],
}


@pytest.mark.parametrize("height", sorted(PAPER_7B))
def test_paper_llama2_7b_schedule(height):
    schedule = LayerSchedule.build(num_layers=32, warmup_layers=12, height=height)
    assert [(r.start, r.stop) for r in schedule.levels] == PAPER_7B[height]


@pytest.mark.parametrize(("layers", "warmup", "height"), [(30, 18, 0), (30, 18, 5), (24, 12, 4), (6, 0, 5)])
def test_levels_cover_all_layers_once_in_order(layers, warmup, height):
    schedule = LayerSchedule.build(layers, warmup, height)
    flat = [i for r in schedule.levels for i in r]
    assert flat == list(range(layers))
    assert all(len(r) >= 1 for r in schedule.levels)
    assert len(schedule.layers_at(0)) >= warmup + 1


def test_rejects_impossible_schedules():
    with pytest.raises(ValueError, match="warmup_layers"):
        LayerSchedule.build(10, 10, 0)
    with pytest.raises(ValueError, match="merging layers"):
        LayerSchedule.build(10, 8, 3)
