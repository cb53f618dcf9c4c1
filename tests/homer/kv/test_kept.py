"""The kept cache: it answers as transformers' own cache over the same K/V, without writing or copying them."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig

from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.kv.headwise import register_headwise_attention
from homer_integrations.homer.kv.kept import KeptKV, KeptLayer, kept_attention, kept_cache, kept_decoding
from tests.conftest import tiny_model


def prefilled(kind: str, length: int = 40, dtype: torch.dtype = torch.float32, **overrides) -> tuple:
    model = tiny_model(kind, vocab_size=256, **overrides).to(dtype)
    context = torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    return model, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def continue_after(model, cache, start: int, rows: int, steps: int = 3) -> torch.Tensor:
    """Logits of ``rows`` tokens read after ``cache`` and of ``steps`` decoding steps after them: [rows + steps, V]."""
    follow = torch.arange(5, 5 + rows)[None]
    with torch.no_grad():
        out = [model(input_ids=follow, position_ids=torch.arange(start, start + rows)[None], cache=cache).logits[0]]
        for i in range(steps):
            position = torch.tensor([[start + rows + i]])
            out.append(model(input_ids=torch.tensor([[11 + i]]), position_ids=position, cache=cache).logits[0])
    return torch.cat(out)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("rows", [1, 6, 20])
def test_a_kept_cache_answers_as_the_dynamic_cache_over_the_same_tensors(kind: str, rows: int) -> None:
    model, keys, values = prefilled(kind)
    register_headwise_attention(model)
    expected = continue_after(model, cache_from_tensors(keys, values), 40, rows)
    before = [k.clone() for k in keys]
    kept = kept_cache(keys, values, capacity=2)  # smaller than what is fed: the tail grows
    torch.testing.assert_close(continue_after(model, kept, 40, rows), expected, atol=1e-5, rtol=1e-5)
    layer = kept.layers[0]
    assert isinstance(layer, KeptLayer) and layer.stored_keys is keys[0]
    assert layer.keys.shape[2] == rows + 3 and kept.get_seq_length() == 40 + rows + 3
    assert all(torch.equal(k, b) for k, b in zip(keys, before, strict=True)), "the stored K/V were written"


def test_grouped_query_attention_is_computed_without_repeating_heads() -> None:
    """Four query heads per K/V head, in bfloat16 as on a CPU that computes it: the kept product against the
    model's eager attention over repeated heads."""
    model, keys, values = prefilled("qwen2", dtype=torch.bfloat16, num_attention_heads=8, num_key_value_heads=2)
    register_headwise_attention(model)
    expected = continue_after(model, cache_from_tensors(keys, values), 40, 4).float()
    got = continue_after(model, kept_cache(keys, values, 16), 40, 4).float()
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.02)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.85


@pytest.mark.parametrize("kernel", ["split", "sdpa"])
def test_a_long_read_goes_to_the_fused_kernel_with_the_grouped_products_result(
    monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """A read of ``FUSED_ROWS`` rows or more (a question, its passages after a kept root) through PyTorch's fused
    attention (on a CPU the flash kernel over the stored K/V and the tail apart, ``_split``; elsewhere the
    fused function over both) answers as the grouped product does over the same K/V, with a tail longer than
    the read."""
    from homer_integrations.homer.kv import kept

    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2)
    register_headwise_attention(model)
    calls = []
    if kernel == "split":
        flash = kept._FLASH_CPU
        monkeypatch.setattr(kept, "_FLASH_CPU", lambda *a, **k: calls.append(1) or flash(*a, **k))
    else:
        monkeypatch.setattr(kept, "_FLASH_CPU", None)
        fused = kept.F.scaled_dot_product_attention
        monkeypatch.setattr(kept.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))

    def two_reads(cache) -> torch.Tensor:  # 24 rows and 3 steps, then 20 more rows after them (a tail of 47)
        first = continue_after(model, cache, 40, 24)
        return torch.cat([first, continue_after(model, cache, 40 + 27, 20, steps=0)])

    fast = two_reads(kept_cache(keys, values, 8))
    assert len(calls) == 2 * len(keys), "the 24- and 20-row reads did not take the fused kernel"
    monkeypatch.setattr(kept, "FUSED_ROWS", 10**6)
    torch.testing.assert_close(fast, two_reads(kept_cache(keys, values, 8)), atol=1e-5, rtol=1e-5)


def test_long_continuations_run_in_blocks_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from homer_integrations.homer.kv import kept

    model, keys, values = prefilled("llama")
    register_headwise_attention(model)
    whole = continue_after(model, kept_cache(keys, values, 8), 40, 6)
    monkeypatch.setattr(kept, "_SCORE_BYTES", 4 * 4 * (40 + 6) * 2)  # two query rows a block
    torch.testing.assert_close(continue_after(model, kept_cache(keys, values, 8), 40, 6), whole)


def test_sliding_window_and_soft_capped_layers_go_to_the_models_own_attention() -> None:
    stored, tail = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 2, 4)
    calls = []

    def base(module, query, key, value, mask, **kwargs):
        calls.append((key.shape[2], kwargs["sliding_window"]))
        return query.transpose(1, 2), None

    q = torch.randn(1, 2, 2, 4)
    kept_attention(None, q, KeptKV(stored, tail), KeptKV(stored, tail), None, base=base, sliding_window=3)
    assert calls == [(7, 3)]
    with pytest.raises(ValueError, match="sliding-window"):
        kept_attention(None, q, KeptKV(stored, tail), KeptKV(stored, tail), None, softcap=30.0)


def test_which_models_decode_over_kept_layers() -> None:
    assert kept_decoding(tiny_model("qwen2").config) and kept_decoding(tiny_model("llama").config)
    assert not kept_decoding(tiny_model("mistral", sliding_window=16).config)
    gemma = Gemma3TextConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    assert not kept_decoding(gemma)


def eager_weights(model, keys, values, rows: int) -> tuple:
    """(the ``rows`` tokens fed after the 40 cached, their positions, every layer's eager attention weights
    [1, H, rows, 40 + rows]) over ``keys``/``values``; the model is registered for kept caches after."""
    follow, positions = torch.arange(5, 5 + rows)[None], torch.arange(40, 40 + rows)[None]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(
            input_ids=follow, position_ids=positions, cache=cache_from_tensors(keys, values), output_attentions=True
        ).attentions
    register_headwise_attention(model)
    return follow, positions, eager


def test_the_attention_each_stored_token_receives_is_summed_as_the_models_own_weights() -> None:
    """``attended`` against the eager attention's weights (``output_attentions``) over the same cache, summed
    over layers, heads and the rows fed: the sources' evidence is the model's own attention."""
    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2)
    follow, positions, eager = eager_weights(model, keys, values, 6)
    expected = sum(a[0, :, :, :40].sum(dim=(0, 1)) for a in eager)
    attended = torch.zeros(40)
    with torch.no_grad():
        model(input_ids=follow, position_ids=positions, cache=kept_cache(keys, values, 8, attended))
    torch.testing.assert_close(attended, expected, atol=1e-4, rtol=1e-4)


def test_a_fused_read_sums_the_attention_of_its_last_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read past ``FUSED_ROWS``: ``attended`` holds what its last ``ATTENDED_ROWS`` rows paid, as the
    eager weights say; the rows before them (passages read after the root) are not counted."""
    from homer_integrations.homer.kv import kept

    monkeypatch.setattr(kept, "FUSED_ROWS", 4)
    monkeypatch.setattr(kept, "ATTENDED_ROWS", 3)
    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2)
    follow, positions, eager = eager_weights(model, keys, values, 10)
    expected = sum(a[0, :, -3:, :40].sum(dim=(0, 1)) for a in eager)
    attended = torch.zeros(40)
    with torch.no_grad():
        model(input_ids=follow, position_ids=positions, cache=kept_cache(keys, values, 8, attended))
    torch.testing.assert_close(attended, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [3, 10])
def test_rows_written_before_a_read_are_summed_with_the_stored_ones(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """``attended`` longer than the stored tokens (an ``Echo`` written into the tail first) sums what the read
    pays those tail rows too, by the grouped product (3 rows) and by the split fused read (10 rows)."""
    from homer_integrations.homer.kv import kept

    monkeypatch.setattr(kept, "FUSED_ROWS", 4)
    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2)
    follow, positions, eager = eager_weights(model, keys, values, rows)
    expected = sum(a[0, :, :, :40].sum(dim=(0, 1)) for a in eager)
    attended = torch.zeros(40)
    cache = kept_cache([k[:, :, :34] for k in keys], [v[:, :, :34] for v in values], 8, attended)
    for layer, k, v in zip(cache.layers, keys, values, strict=True):
        layer.update(k[:, :, 34:], v[:, :, 34:])  # the last 6 tokens as rows after the stored 34
    with torch.no_grad():
        model(input_ids=follow, position_ids=positions, cache=cache)
    torch.testing.assert_close(attended, expected, atol=1e-4, rtol=1e-4)


def test_a_fused_reads_sums_wait_in_deferred_until_they_are_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sums a split read needs a product of its own for are left in ``deferred`` (the answer's first token
    is not kept waiting); run, they are the eager weights' sums."""
    from homer_integrations.homer.kv import kept

    monkeypatch.setattr(kept, "FUSED_ROWS", 4)
    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2)
    follow, positions, eager = eager_weights(model, keys, values, 10)
    attended, deferred = torch.zeros(40), []
    with torch.no_grad():
        model(input_ids=follow, position_ids=positions, cache=kept_cache(keys, values, 8, attended, 0, deferred))
    assert len(deferred) == len(keys) and float(attended.sum()) == 0.0
    for work in deferred:
        work()
    torch.testing.assert_close(attended, sum(a[0, :, :, :40].sum(dim=(0, 1)) for a in eager), atol=1e-4, rtol=1e-4)


def test_only_the_layers_from_attended_from_add_their_attention() -> None:
    model, keys, values = prefilled("qwen2", num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4)
    register_headwise_attention(model)
    follow, positions = torch.arange(5, 8)[None], torch.arange(40, 43)[None]
    sums = {}
    for first in (0, 2, 4):
        attended = torch.zeros(40)
        with torch.no_grad():
            model(input_ids=follow, position_ids=positions, cache=kept_cache(keys, values, 4, attended, first))
        sums[first] = float(attended.sum())
    rows_heads = 3 * 4  # each counted layer's rows and heads spread a whole share over stored and tail tokens
    assert 2 * rows_heads * 0.5 < sums[2] < 2 * rows_heads and sums[4] == 0.0
    assert sums[0] > sums[2] * 1.5
