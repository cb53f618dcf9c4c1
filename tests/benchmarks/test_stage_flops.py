"""stage_flops: the bytes a decoding step reads, the yardstick of the decoding stage, and the stages it times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import mode_engine, tiny_model

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import stage_flops


@pytest.mark.parametrize("tied", [True, False])
def test_a_decoding_step_reads_every_weight_but_the_input_embedding_table(tied: bool) -> None:
    model = tiny_model("llama", vocab_size=1000, tie_word_embeddings=tied)
    table = model.get_input_embeddings().weight
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    expected = everything if tied else everything - table.numel() * table.element_size()
    assert stage_flops.decoded_bytes(model) == expected
    # tied or not, the output layer's vocab x hidden weights are read once a step
    assert stage_flops.decoded_bytes(model) >= model.get_output_embeddings().weight.numel() * table.element_size()


def test_the_timed_stages_are_the_ones_a_question_runs(tokenizer, calibration, novel) -> None:
    """A question within the window scores every leaf and re-reads its selection: both timers fire."""
    engine = mode_engine(tokenizer, calibration)
    calls: dict[str, list[float]] = {}
    with stage_flops.timed_stages(calls):
        engine.answer(novel[:1500], "Who is the narrator?", mode="query_aware", max_new_tokens=1)
    assert set(calls) == {"score_leaves", "prefill_kept"}
    assert all(len(v) == 1 and v[0] > 0 for v in calls.values())
