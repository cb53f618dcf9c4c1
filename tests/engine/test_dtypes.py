"""``dtype="auto"``: the timed probe, the override, and what a load then gets."""

from __future__ import annotations

import logging

import pytest
import torch

from homer_integrations.engine import dtypes
from homer_integrations.engine.dtypes import BF16_MIN_SPEEDUP, DTYPE_ENV, cpu_bf16_speedup, parse_dtype, resolve_dtype
from homer_integrations.engine.loading import load_model


def test_explicit_dtypes_pass_through_by_object_or_name() -> None:
    assert resolve_dtype(torch.float16, None) is torch.float16
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert resolve_dtype("torch.float32", None) is torch.float32


def test_unknown_dtype_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'int4'.*auto, float32, bfloat16, float16"):
        parse_dtype("int4")


def test_auto_on_the_cpu_follows_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    speedup = cpu_bf16_speedup()
    assert speedup > 0 and cpu_bf16_speedup() == speedup  # measured once per process
    expected = torch.bfloat16 if speedup >= BF16_MIN_SPEEDUP else torch.float32
    assert resolve_dtype("auto", None) is expected
    assert resolve_dtype("auto", torch.device("cpu")) is expected


def test_the_automatic_choice_is_logged_once_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    dtypes._cpu_auto.cache_clear()
    with caplog.at_level(logging.INFO, logger="homer_integrations.engine.dtypes"):
        resolve_dtype("auto", None)
        resolve_dtype("auto", None)
    lines = [r.getMessage() for r in caplog.records if r.name == "homer_integrations.engine.dtypes"]
    assert len(lines) == 1 and "as fast as float32" in lines[0] and DTYPE_ENV in lines[0]


@pytest.mark.parametrize(("env", "expected"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_the_environment_overrides_auto_but_not_an_explicit_dtype(
    monkeypatch: pytest.MonkeyPatch, env: str, expected: torch.dtype
) -> None:
    monkeypatch.setenv(DTYPE_ENV, env)
    assert resolve_dtype("auto", None) is expected
    assert resolve_dtype(torch.float16, None) is torch.float16


def test_a_bad_environment_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="'fp8' is not supported"):
        resolve_dtype("auto", None)


def test_a_saved_model_loads_in_the_resolved_dtype(tmp_path, monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    from tests.conftest import tiny_model

    tiny_model("qwen2", vocab_size=len(tokenizer)).save_pretrained(tmp_path)  # saved in float32
    tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    model, _ = load_model(str(tmp_path))
    assert model.dtype is torch.bfloat16
    monkeypatch.delenv(DTYPE_ENV)
    model, _ = load_model(str(tmp_path), dtype="auto", quantize="int8")  # int8 is built from float32 weights
    assert model.model.embed_tokens.weight.dtype is torch.float32
