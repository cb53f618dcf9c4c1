"""int8 weights on the CPU: a real (tiny, random-weight) model quantized by torch, run through HOMER."""

import pytest
import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.quantization import quantize
from homer_integrations.homer.model.fingerprint import weights_fingerprint
from homer_integrations.homer.reading.strategies import Recipe
from tests.conftest import tiny_model

CFG = HomerConfig(max_chunk_len=128, warmup_layers=3)
RECIPE = Recipe(calibration_segments=2)


@torch.inference_mode()
def test_int8_model_tracks_fp32_logits_and_gets_its_own_cache_keys(tokenizer, tmp_path, novel):
    fp32, int8 = tiny_model("qwen2"), quantize(tiny_model("qwen2"), "int8")
    assert isinstance(int8.model.layers[0].self_attn.q_proj, torch.ao.nn.quantized.dynamic.Linear)
    ids = torch.tensor([tokenizer(novel[:400])["input_ids"][:64]])
    a, b = fp32(ids).logits[0, -8:], int8(ids).logits[0, -8:]
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.99
    assert not torch.equal(a, b), "the int8 path really runs"
    assert weights_fingerprint(fp32) != weights_fingerprint(int8), "int8 caches never mix with fp32 ones"

    engines = [
        HomerModel(m, tokenizer, CFG, calibration_dir=tmp_path, progress=False, recipe=RECIPE) for m in (fp32, int8)
    ]
    assert engines[0].tiers.keys.root("p", "d", "s") != engines[1].tiers.keys.root("p", "d", "s")
    doc = engines[1].compress(novel[:3000], mode="shared")
    assert doc.num_tokens <= 128 and doc.stats.tree_height >= 2
    assert engines[1].answer(doc, "Who is Mr. Bingley?", max_new_tokens=3)


def test_int8_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize(tiny_model(), "int4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float32"):
        quantize(tiny_model().to(torch.bfloat16), "int8")
    from homer_integrations.engine.loading import load_model

    with pytest.raises(ValueError, match="only int8 on the CPU"):
        load_model("/nonexistent", quantize="int4")  # type: ignore[arg-type]


def test_int8_model_uses_the_float_models_calibration(tokenizer, tmp_path):
    from homer_integrations.homer.scoring.calibration import CalibrationKey

    fp32 = HomerModel(tiny_model("qwen2"), tokenizer, CFG, calibration_dir=tmp_path, progress=False)
    int8 = HomerModel(quantize(tiny_model("qwen2"), "int8"), tokenizer, CFG, calibration_dir=tmp_path, progress=False)
    keys = [CalibrationKey.for_stack(e.stack, 128) for e in (fp32, int8)]
    assert keys[0] == keys[1]
    assert fp32.tiers.calibration.id == int8.tiers.calibration.id
    assert torch.equal(fp32.tiers.calibration.bias(progress=False), int8.tiers.calibration.bias(progress=False))
