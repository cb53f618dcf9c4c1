"""The head-wise attention is registered once, when an engine is built; decoding changes no global state."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.kv.headwise import (
    PREFIX,
    HeadwiseAttention,
    headwise_cache,
    headwise_ready,
    register_headwise_attention,
)
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.headwise import keep_ragged
from homer_integrations.homer.tree.headwise import headwise_refusal
from tests.conftest import tiny_model

OPTIONS = GenerationOptions(max_new_tokens=4)


def build(tokenizer, tmp_path, model=None) -> HomerModel:
    config = HomerConfig(max_chunk_len=128, warmup_layers=3, final_cache_len=64)
    return HomerModel(model or tiny_model("llama"), tokenizer, config, calibration_dir=tmp_path, progress=False)


def prefilled(model, length: int = 30) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer [1, Hkv, length, d] keys and values of random tokens."""
    context = torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(context[None], use_cache=True).cache
    return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def ragged(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """A head-wise cache keeping about half of each head's slots, a different half per head."""
    survives = torch.rand(len(keys), keys[0].shape[1], keys[0].shape[2], generator=torch.Generator().manual_seed(1))
    survives = survives < 0.5
    survives[:, :, :2] = True
    return headwise_cache(*keep_ragged(keys, values, survives))


def answer(model, tokenizer, cache: DynamicCache, start: int) -> tuple[str, list[int]]:
    state = DecodeState()
    text = "".join(decode(model, tokenizer, cache, torch.tensor([5, 6, 7]), start, OPTIONS, state))
    return text, state.token_ids


def registry() -> tuple[dict, dict]:
    return dict(ALL_ATTENTION_FUNCTIONS._global_mapping), dict(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping)


def test_building_an_engine_registers_the_headwise_attention(tokenizer, tmp_path) -> None:
    model = tiny_model("llama")
    base = model.config._attn_implementation
    engine = build(tokenizer, tmp_path, model)
    assert headwise_ready(model) and model.config._attn_implementation == PREFIX + base
    assert ALL_ATTENTION_FUNCTIONS[PREFIX + base] == HeadwiseAttention(base)
    assert ALL_MASK_ATTENTION_FUNCTIONS[PREFIX + base] is ALL_MASK_ATTENTION_FUNCTIONS[base]
    assert engine.stack.backend == base, "compression still sees the model's own implementation"
    before = registry()
    build(tokenizer, tmp_path, model)  # a second engine on the same model: nothing changes
    assert registry() == before and model.config._attn_implementation == PREFIX + base


def test_decoding_changes_neither_the_config_nor_the_registry(tokenizer, tmp_path) -> None:
    engine = build(tokenizer, tmp_path)
    keys, values = prefilled(engine.model)
    name, before = engine.model.config._attn_implementation, registry()
    text, tokens = answer(engine.model, engine.tokenizer, ragged(keys, values), 30)
    assert tokens and isinstance(text, str)
    answer(engine.model, engine.tokenizer, cache_from_tensors(keys, values), 30)
    assert engine.model.config._attn_implementation == name
    assert registry() == before


def test_a_dense_cache_answers_through_the_engine_as_through_the_bare_model(tokenizer, tmp_path) -> None:
    bare = tiny_model("llama")
    engine = build(tokenizer, tmp_path)  # the same random weights (seed 0)
    keys, values = prefilled(bare)
    expected = answer(bare, tokenizer, cache_from_tensors(keys, values), 30)
    assert answer(engine.model, tokenizer, cache_from_tensors(keys, values), 30) == expected


def test_a_headwise_cache_on_a_model_without_the_attention_is_refused(tokenizer) -> None:
    model = tiny_model("llama")
    keys, values = prefilled(model)
    with pytest.raises(ValueError, match="register_headwise_attention"):
        answer(model, tokenizer, ragged(keys, values), 30)
    assert not headwise_ready(model), "decoding registered nothing"


def test_flash_attention_is_left_alone_and_refused_a_headwise_root() -> None:
    model = tiny_model("llama")
    model.config._attn_implementation = "flash_attention_2"  # never run: the kernels read this name
    assert not register_headwise_attention(model)
    assert model.config._attn_implementation == "flash_attention_2"
    assert "SDPA or eager" in headwise_refusal(DecoderStack(model), 64, 10, 5)
