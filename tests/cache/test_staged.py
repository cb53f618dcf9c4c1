"""``StagedTensors``: a safetensors file laid out first, filled in place, read back by safetensors itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from homer_integrations.cache.staged import METADATA_RESERVE, StagedTensors


def test_a_staged_file_filled_in_place_is_a_safetensors_file(tmp_path: Path) -> None:
    layout = {
        "hidden": ((5, 3), torch.float32),
        "k.0": ((2, 5, 4), torch.bfloat16),
        "word_ids": ((5,), torch.long),
        "empty": ((0, 4), torch.float16),
    }
    path = tmp_path / "tier.safetensors"
    path.touch()
    staged = StagedTensors(path, layout)
    assert {n: (tuple(t.shape), t.dtype) for n, t in staged.tensors.items()} == layout
    values = {
        "hidden": torch.randn(5, 3),
        "k.0": torch.randn(2, 5, 4).bfloat16(),
        "word_ids": torch.tensor([0, 0, 1, 2, 2]),
        "empty": torch.empty(0, 4, dtype=torch.float16),
    }
    for name, value in values.items():
        staged.tensors[name].copy_(value)
    assert staged.backs(staged.tensors["k.0"][1]) and not staged.backs(values["hidden"])
    assert staged.finish({"format": "test", "key": "abc"}) == path

    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "test", "key": "abc"}
        assert set(f.keys()) == set(values)
        for name, value in values.items():
            assert torch.equal(f.get_tensor(name), value), name


def test_metadata_beyond_the_reserve_and_unsupported_dtypes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    path.touch()
    staged = StagedTensors(path, {"x": ((2,), torch.float32)})
    with pytest.raises(ValueError, match="header bytes"):
        staged.finish({"plan": "x" * (METADATA_RESERVE + 100)})
    with pytest.raises(ValueError, match="dtype"):
        StagedTensors(path, {"x": ((2,), torch.complex64)})
