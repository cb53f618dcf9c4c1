"""Embedded models on disk: the float32 checkpoint converted once, and a half-precision copy beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from homer_integrations.engine.loading import SMOLLM2, converted_dir, load_embedded


def _weights_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def test_a_bfloat16_load_keeps_a_half_size_copy_with_exactly_the_cast_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, smol_parts
) -> None:
    full = converted_dir(SMOLLM2)  # the session's float32 copy (``smol_parts`` converted it)
    cast = {k: v.to(torch.bfloat16) for k, v in smol_parts[0].state_dict().items()}

    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path / "fresh"))
    direct, tokenizer = load_embedded(SMOLLM2, torch.bfloat16)  # no float32 copy: from the GGUF file
    assert direct.dtype == torch.bfloat16 and tokenizer("Bath")["input_ids"]
    assert not (converted_dir(SMOLLM2) / "config.json").exists(), "no float32 copy is written for it"
    for name, tensor in direct.state_dict().items():
        assert torch.equal(tensor, cast[name]), name
    kept = converted_dir(SMOLLM2, torch.bfloat16)
    assert kept.name.endswith("-bfloat16") and (kept / "config.json").is_file()
    assert _weights_bytes(kept) < 0.6 * _weights_bytes(full)
    assert not list(kept.parent.glob("*.work")) and not list(kept.parent.glob("*.staging")), "nothing left behind"

    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path / "upgraded"))
    converted_dir(SMOLLM2).parent.mkdir(parents=True)
    converted_dir(SMOLLM2).symlink_to(full)  # a cache that already holds the float32 copy
    with caplog.at_level("INFO", logger="homer_integrations.engine.loading"):
        from_full, _ = load_embedded(SMOLLM2, torch.bfloat16)
    assert "copy of" in caplog.text and "from GGUF" not in caplog.text, "written from the float32 copy"
    for name, tensor in from_full.state_dict().items():
        assert torch.equal(tensor, cast[name]), name
