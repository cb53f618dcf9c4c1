"""The ragged head-wise cache: it answers as the same tokens removed from a dense cache, or hidden per head."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.kv.headwise import (
    PREFIX,
    HeadwiseAttention,
    HeadwiseLayer,
    headwise_cache,
    register_headwise_attention,
)
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.headwise import keep_ragged
from tests.conftest import tiny_model

sys.path.insert(0, str(Path(__file__).parents[3] / "research"))  # it puts benchmarks/ on the path itself
from headwise_probe import hidden_slots  # padded slots hidden from SDPA: tested against removed slots


def prefilled(kind: str, length: int = 30) -> tuple:
    model = tiny_model(kind, vocab_size=256)
    context = torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    return model, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def continue_after(model, cache, start: int, rows: int) -> torch.Tensor:
    """Logits of ``rows`` tokens read after ``cache`` and of one decoding step after them: [rows + 1, V]."""
    follow = torch.tensor([[5, 6, 7, 8, 9][:rows]])
    with torch.no_grad():
        first = model(input_ids=follow, position_ids=torch.arange(start, start + rows)[None], cache=cache).logits
        step = model(input_ids=torch.tensor([[11]]), position_ids=torch.tensor([[start + rows]]), cache=cache).logits
    return torch.cat([first[0], step[0]])


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("rows", [1, 5])
def test_one_token_set_in_every_head_answers_as_the_dense_cache_of_those_tokens(kind: str, rows: int) -> None:
    model, keys, values = prefilled(kind)
    kept = torch.ones(30, dtype=torch.bool)
    kept[[3, 7, 8, 20]] = False
    removed = cache_from_tensors([k[:, :, kept] for k in keys], [v[:, :, kept] for v in values])
    dense = continue_after(model, removed, 30, rows)
    survives = kept.expand(len(keys), keys[0].shape[1], -1)
    flat_keys, flat_values, lengths = keep_ragged(keys, values, survives)
    register_headwise_attention(model)
    ragged = headwise_cache(flat_keys, flat_values, lengths)
    torch.testing.assert_close(continue_after(model, ragged, 30, rows), dense, atol=1e-5, rtol=1e-5)
    assert isinstance(ragged.layers[0], HeadwiseLayer) and ragged.layers[0].keys.shape[2] == rows + 1
    assert torch.equal(ragged.layers[0].stored_keys[0], keys[0][0, 0, kept])  # stored rows left as they were


@pytest.mark.parametrize("rows", [1, 5])
def test_each_head_attends_only_to_its_own_tokens(rows: int) -> None:
    model, keys, values = prefilled("qwen2")
    g = torch.Generator().manual_seed(1)
    survives = torch.rand(len(keys), keys[0].shape[1], 30, generator=g) < 0.5
    survives[:, :, :2] = True  # every head keeps some token
    flat_keys, flat_values, lengths = keep_ragged(keys, values, survives)
    assert lengths.tolist() == survives.sum(-1).tolist() and len({*lengths.flatten().tolist()}) > 1
    hidden = [~alive for alive in survives]  # per layer [Hkv, 30]
    with hidden_slots(hidden):
        expected = continue_after(model, cache_from_tensors(keys, values), 30, rows)
    register_headwise_attention(model)
    ragged = continue_after(model, headwise_cache(flat_keys, flat_values, lengths), 30, rows)
    torch.testing.assert_close(ragged, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ragged, continue_after(model, cache_from_tensors(keys, values), 30, rows), atol=1e-3)


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_the_wrapped_attention_leaves_dense_caches_and_masks_as_they_were(base: str) -> None:
    model, keys, values = prefilled("llama")
    model.set_attn_implementation(base)
    before = continue_after(model, cache_from_tensors(keys, values), 30, 5)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        plain = model(ids).logits
    assert register_headwise_attention(model) and register_headwise_attention(model)  # idempotent: wraps once
    assert model.config._attn_implementation == PREFIX + base
    assert ALL_ATTENTION_FUNCTIONS[PREFIX + base] == HeadwiseAttention(base)
    assert DecoderStack(model).backend == base, "the stack sees the implementation the wrapper calls"
    torch.testing.assert_close(continue_after(model, cache_from_tensors(keys, values), 30, 5), before)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain)


@pytest.mark.parametrize(("kind", "window"), [("llama", None), ("mistral", 8)])
def test_a_one_row_step_on_a_cpu_runs_the_models_eager_attention(kind: str, window: int | None) -> None:
    overrides = {"sliding_window": window} if window else {}
    model = tiny_model(kind, vocab_size=256, **overrides)
    context = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(0))

    def step(attention: str) -> torch.Tensor:
        """One decoding step after the context (prefilled with SDPA), with ``attention``."""
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            cache = model(context, use_cache=True).cache
            if attention == "registered":
                assert register_headwise_attention(model)
            else:
                model.set_attn_implementation(attention)
            return model(input_ids=torch.tensor([[11]]), position_ids=torch.tensor([[30]]), cache=cache).logits[0, -1]

    eager, sdpa = step("eager"), step("sdpa")
    registered = step("registered")  # last: it renames the model's implementation
    # SDPA's boolean mask (a sliding window of 8 over 31 keys) is handed to eager as eager's own additive mask
    assert torch.equal(registered, eager)
    torch.testing.assert_close(registered, sdpa)


def test_a_headwise_document_round_trips_and_a_damaged_one_is_refused() -> None:
    from homer_integrations.homer.kv.compressed import CompressedDocument, CompressionStats, check_consistent

    _, keys, values = prefilled("llama")
    survives = torch.rand(len(keys), keys[0].shape[1], 30, generator=torch.Generator().manual_seed(2)) < 0.5
    survives[:, :, :2] = True
    flat_keys, flat_values, lengths = keep_ragged(keys, values, survives)
    stats = CompressionStats(30, 30, 15, 0, 0.0, 0, 0, 1, 64)
    doc = CompressedDocument(
        "k", tuple(flat_keys), tuple(flat_values), torch.arange(30), torch.arange(30), 29, None, None, stats, lengths
    )
    check_consistent(doc)
    assert doc.num_tokens == -(-int(lengths.sum()) // lengths.numel())
    back = CompressedDocument.from_tensors(*doc.to_tensors())
    assert torch.equal(back.head_lengths, lengths) and all(
        torch.equal(a, b) for a, b in zip(back.keys, doc.keys, strict=True)
    )
    tensors, meta = doc.to_tensors()
    for damage, reason in (
        (lambda t: t["head_lengths"].add_(1), "rows"),
        (lambda t: t["head_lengths"].zero_(), "keeps no token"),
        (lambda t: t.update({"head_lengths": t["head_lengths"][:, :1]}), "rows"),
        (lambda t: t.update({"k.1": t["k.1"][None]}), "head_dim"),
    ):
        broken = {name: t.clone() for name, t in tensors.items()}
        damage(broken)
        with pytest.raises(ValueError, match=reason):
            CompressedDocument.from_tensors(broken, meta)
