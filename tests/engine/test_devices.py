"""Half precision and GPU attention backends: what a GPU user runs, on tiny random-weight models.

The CUDA cases (bf16 and fp16; SDPA, and flash-attention 2 where ``flash_attn`` is installed) are
skipped without CUDA; the package never needs a GPU. The CPU bf16 case runs everywhere, so the
checks themselves are exercised on every machine.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.nn.functional import cosine_similarity

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests import conftest
from tests.conftest import uncalibrated

CUDA = torch.cuda.is_available()
FLASH = CUDA and importlib.util.find_spec("flash_attn") is not None
no_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
no_flash = pytest.mark.skipif(not FLASH, reason="needs CUDA and flash_attn")
CASES = [
    pytest.param("cpu", torch.bfloat16, "sdpa", id="cpu-bf16-sdpa"),
    pytest.param("cuda", torch.bfloat16, "sdpa", id="cuda-bf16-sdpa", marks=no_cuda),
    pytest.param("cuda", torch.float16, "sdpa", id="cuda-fp16-sdpa", marks=no_cuda),
    pytest.param("cuda", torch.bfloat16, "flash_attention_2", id="cuda-bf16-flash", marks=no_flash),
    pytest.param("cuda", torch.float16, "flash_attention_2", id="cuda-fp16-flash", marks=no_flash),
]
MCL = 128
MIN_COSINE = 0.995
"""Logits of our loop vs the model's forward in half precision: rounding differs in the order of
operations only, so the logit vectors stay nearly parallel (fp32 on CPU agrees to 1e-4, see
test_architectures)."""


def model_on(kind: str, device: str, dtype: torch.dtype, attn: str, vocab_size: int = 256):
    model = conftest.tiny_model(kind, vocab_size=vocab_size).to(device=device, dtype=dtype)
    model.config._attn_implementation = attn
    return model


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("device", "dtype", "attn"), CASES)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_one_chunk_matches_the_models_forward(kind: str, device: str, dtype: torch.dtype, attn: str) -> None:
    model = model_on(kind, device, dtype, attn)
    prefix, doc, suffix = ids(5, 0), ids(60, 1), ids(4, 2)
    settings = CompressorSettings(
        max_chunk_len=MCL, warmup_layers=2, final_cache_len=MCL, scoring=uncalibrated(), want_logits=True
    )
    result = HomerCompressor(DecoderStack(model), settings, None).tree.compress(prefix, doc, suffix)
    assert result.plan.height == 0 and all(k.dtype == dtype and k.device.type == device for k in result.keys)
    with torch.no_grad():
        theirs = model(torch.cat([prefix, doc, suffix])[None].to(device)).logits[0, -1].float()
    ours = result.next_token_logits.float().to(device)
    assert float(cosine_similarity(ours, theirs, dim=0)) > MIN_COSINE
    assert int(ours.argmax()) == int(theirs.argmax())


@pytest.mark.parametrize(("device", "dtype", "attn"), CASES)
def test_a_tree_in_half_precision_keeps_its_invariants_and_decodes(device: str, dtype: torch.dtype, attn: str) -> None:
    model = model_on("llama", device, dtype, attn)
    prefix, doc, suffix = ids(5, 0), ids(700, 3), ids(4, 2)
    settings = CompressorSettings(
        max_chunk_len=MCL, warmup_layers=2, final_cache_len=MCL, scoring=uncalibrated(), want_logits=True
    )
    result = HomerCompressor(DecoderStack(model), settings, None).tree.compress(prefix, doc, suffix)
    assert result.plan.height >= 2
    conftest.assert_tree_invariants(result, model, prefix.numel(), suffix.numel(), MCL)
    question = ids(3, 4).to(device)
    positions = torch.arange(result.last_position + 1, result.last_position + 4, device=device)
    with torch.no_grad():
        logits = model(
            question[None], position_ids=positions[None], cache=cache_from_tensors(result.keys, result.values)
        ).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(("device", "dtype", "attn"), CASES)
def test_the_engine_answers_and_keeps_a_half_precision_cache_on_disk(
    device: str, dtype: torch.dtype, attn: str, tokenizer, novel: str, tmp_path
) -> None:
    model = model_on("llama", device, dtype, attn, vocab_size=len(tokenizer))
    config = HomerConfig(max_chunk_len=128, warmup_layers=3)
    text = novel[:3000]

    def engine() -> HomerModel:  # a new engine and cache object over the same directory: a fresh process
        cache = DocumentCache(tmp_path)
        return HomerModel(
            model,
            tokenizer,
            config,
            calibration_dir=tmp_path / "cal",
            progress=False,
            document_cache=cache,
            recipe=Recipe(calibration_segments=2),
        )

    first = engine().run(text, "Who is Mr. Bingley?", max_new_tokens=4)
    answer = first.text()
    assert first.info.output_tokens >= 1 and first.info.cache_source == "computed"
    doc = engine().compress(text)
    assert doc.keys[0].dtype == dtype and doc.keys[0].device.type == device

    fresh = engine()
    again = fresh.run(text, "Who is Mr. Bingley?", max_new_tokens=4)
    assert again.text() == answer and again.info.cache_source == "disk"
