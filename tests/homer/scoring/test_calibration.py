import torch

from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.calibration import CalibrationKey, CalibrationStore, compute_bias
from tests.conftest import tiny_model


def test_bias_table_shape_and_values(tmp_path):
    stack = DecoderStack(tiny_model("llama", vocab_size=256))
    ids = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))
    bias = compute_bias(stack, ids, max_chunk_len=64, segments=4, query_rows=8, progress=False)
    assert bias.shape == (stack.num_layers, 64)
    assert torch.isfinite(bias).all()
    # the table is an average of per-distance logits, so layers differ
    assert not torch.allclose(bias[0], bias[-1])


def test_last_row_only_matches_a_manual_last_token_average():
    stack = DecoderStack(tiny_model("qwen2", vocab_size=256))
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(1))
    bias = compute_bias(stack, ids, max_chunk_len=64, segments=1, query_rows=1, progress=False)
    # one segment, last row only: bias[l, d] is the raw max-over-heads logit of token 63 to 63 - d
    from transformers import DynamicCache

    from homer_integrations.homer.scoring.scorers import attention_logits

    hidden = stack.embed(ids)
    rope = stack.rotary(hidden, torch.arange(64))
    cache = DynamicCache()
    hidden, q = stack.attention(0, hidden, rope, cache, query_rows=1)
    expected = attention_logits(q, cache.layers[0].keys, stack.scaling).amax(0).flip(0)
    torch.testing.assert_close(bias[0], expected, atol=1e-5, rtol=0)


def test_store_round_trip_and_corruption(tmp_path):
    stack = DecoderStack(tiny_model("llama", vocab_size=256))
    key = CalibrationKey.for_stack(stack, 64)
    store = CalibrationStore(tmp_path)
    assert store.find(key) is None
    bias = torch.randn(stack.num_layers, 64)
    path = store.save(key, bias, segments=3)
    assert torch.equal(store.find(key), bias)
    path.write_bytes(b"not a safetensors file")
    assert store.find(key) is None


def test_key_depends_on_chunk_length_dtype_rope_and_weights():
    model = tiny_model("llama", vocab_size=256)
    base = CalibrationKey.for_stack(DecoderStack(model), 64)
    assert CalibrationKey.for_stack(DecoderStack(model), 128).id != base.id
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert (
        CalibrationKey.for_stack(DecoderStack(tiny_model("llama", vocab_size=256, rope_parameters=rope)), 64).id
        != base.id
    )
    assert CalibrationKey.for_stack(DecoderStack(tiny_model("llama", vocab_size=256, seed=1)), 64).id != base.id
    assert CalibrationKey.for_stack(DecoderStack(model.to(torch.bfloat16)), 64).id != base.id


def test_the_embedded_model_ships_a_table_for_each_dtype_auto_may_pick():
    """dtype="auto" loads bfloat16 on a CPU that computes it fast: no first-use calibration for either."""
    from homer_integrations.engine.loading import SMOLLM2, load_embedded
    from homer_integrations.paths import PACKAGE_DATA

    store = CalibrationStore(PACKAGE_DATA / "nowhere", bundled_dir=PACKAGE_DATA / "calibration")
    for dtype in (torch.float32, torch.bfloat16):
        model, _ = load_embedded(SMOLLM2, dtype)
        key = CalibrationKey.for_stack(DecoderStack(model), SMOLLM2.max_chunk_len)
        assert key.dtype == str(dtype).removeprefix("torch.")
        assert store.locate(key) == PACKAGE_DATA / "calibration" / f"{key.id}.safetensors"
