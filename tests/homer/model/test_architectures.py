"""Every supported family on tiny random-weight configs: the decoder loop against the model's own forward."""

import pytest
import torch
from transformers import (
    DynamicCache,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.model import decoder
from homer_integrations.homer.model.architectures import FAMILIES, UnsupportedModelError, check_supported
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests import conftest
from tests.conftest import uncalibrated

TINY = {**conftest.TINY, "vocab_size": 256}
WINDOW = 24  # below every test's chunk length, so sliding layers must cut
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
GEMMA_LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2
KINDS = ["qwen3", "gemma3", "phi3", "phi4_partial_rotary", "llama3_rope", "mistral_window", "qwen2_window"]
# fp32 on CPU: the loop calls the model's own modules in the model's order; only the root's last
# MLP runs on the last row alone, which may change rounding.
LOGITS_ATOL = 1e-4
MCL = 128


def build(kind: str, attn: str = "sdpa") -> PreTrainedModel:
    """A tiny random-weight model of ``kind`` in eval mode, with attention backend ``attn``."""
    torch.manual_seed(0)
    if kind == "qwen3":
        config, cls = Qwen3Config(**TINY, head_dim=16), Qwen3ForCausalLM
    elif kind == "gemma3":
        config = Gemma3TextConfig(
            **TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=GEMMA_LAYERS
        )
        cls = Gemma3ForCausalLM
    elif kind == "phi3":
        config, cls = Phi3Config(**TINY, pad_token_id=0), Phi3ForCausalLM
    elif kind == "phi4_partial_rotary":
        config, cls = Phi3Config(**TINY, pad_token_id=0, partial_rotary_factor=0.75), Phi3ForCausalLM
    elif kind == "llama3_rope":
        config, cls = LlamaConfig(**TINY, rope_parameters=LLAMA3_ROPE), LlamaForCausalLM
    elif kind == "mistral_window":
        config, cls = MistralConfig(**TINY, sliding_window=WINDOW), MistralForCausalLM
    elif kind == "qwen2_window":  # sliding from layer 3 up
        config = Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3)
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(kind)
    config._attn_implementation = attn
    return cls(config).eval()


def compress(model: PreTrainedModel, doc_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prefix, doc, suffix = (torch.randint(0, 256, (n,), generator=g) for n in (5, doc_len, 4))
    settings = CompressorSettings(
        max_chunk_len=MCL, warmup_layers=2, final_cache_len=MCL, scoring=uncalibrated(), want_logits=True
    )
    result = HomerCompressor(DecoderStack(model), settings, None).tree.compress(prefix, doc, suffix)
    return result, (prefix, doc, suffix)


def run_stack(stack: DecoderStack, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache):
    """Our loop over all layers for ``ids`` [R] after ``cache``: (logits [V], each layer's last query)."""
    hidden = stack.embed(ids)
    rope = stack.rotary(hidden, positions)
    queries = []
    for layer_idx in range(stack.num_layers):
        hidden, query = stack.attention(layer_idx, hidden, rope, cache, query_rows=1)
        queries.append(query)
        hidden = stack.mlp(layer_idx, hidden)
    return stack.logits(hidden[:, -1:]), queries


def test_every_family_has_a_unit():
    assert {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3"} <= set(FAMILIES)


@pytest.mark.parametrize("kind", KINDS)
def test_single_chunk_matches_plain_forward(kind):
    model = build(kind)
    result, (p, d, s) = compress(model, 60)
    assert result.plan.height == 0
    with torch.no_grad():
        out = model(torch.cat([p, d, s])[None], use_cache=True)
    torch.testing.assert_close(result.next_token_logits, out.logits[0, -1], atol=LOGITS_ATOL, rtol=0)
    for ours, theirs in zip(result.keys, out.cache.layers, strict=True):
        kept = theirs.keys.shape[2]  # a sliding cache layer keeps only its window's tail
        torch.testing.assert_close(ours[:, :, -kept:], theirs.keys, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_the_feed_forward_in_blocks_gives_the_same_rows(kind, monkeypatch):
    stack = DecoderStack(build(kind))
    hidden = torch.randn(1, 50, stack.model.config.hidden_size)
    with torch.no_grad():
        whole = stack.mlp(0, hidden)
        monkeypatch.setattr(decoder, "MLP_ROWS", 16)  # 50 rows: three full blocks and a short one
        blocks = stack.mlp(0, hidden)
    torch.testing.assert_close(blocks, whole, atol=1e-6, rtol=1e-6)  # a GEMM over fewer rows may round apart


@pytest.mark.parametrize(
    ("device", "attn", "accelerator_rows"), [("cpu", "sdpa", False), ("meta", "sdpa", True), ("meta", "eager", False)]
)
def test_row_blocks_grow_on_an_accelerator_unless_attention_is_eager(device, attn, accelerator_rows):
    """The meta device stands for an accelerator: no arithmetic runs, only the block size is read."""
    stack = DecoderStack(build("qwen3", attn=attn).to(device))
    assert stack._block_rows(16) == (decoder.ACCELERATOR_ROWS if accelerator_rows else 16)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "mistral_window"])
def test_attention_in_blocks_gives_the_same_rows_and_cache(kind, attn, monkeypatch):
    """Row blocks after a cached prefix (a window shorter than a block, blocks crossing it): the same
    hidden rows, last queries and cached keys as the whole leaf at once."""
    stack = DecoderStack(build(kind, attn=attn))
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(2))

    def run(rows: int) -> tuple[torch.Tensor, list[torch.Tensor], DynamicCache]:
        monkeypatch.setattr(decoder, "ATTENTION_ROWS", rows)
        cache = DynamicCache()
        run_stack(stack, ids[:20], torch.arange(20), cache)  # the prefix: later rows have past > 0
        logits, queries = run_stack(stack, ids[20:], torch.arange(20, 70), cache)
        return logits, queries, cache

    with torch.no_grad():
        whole, blocks = run(4096), run(16)  # 50 rows: three full blocks and a short one
    torch.testing.assert_close(blocks[0], whole[0], atol=1e-5, rtol=0)
    for ours, theirs in zip(blocks[1], whole[1], strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    for ours, theirs in zip(blocks[2].layers, whole[2].layers, strict=True):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=0)

    def last_queries(rows: int) -> torch.Tensor:  # 20 query rows: the tails of two blocks of 16
        monkeypatch.setattr(decoder, "ATTENTION_ROWS", rows)
        hidden = stack.embed(ids)
        with torch.no_grad():
            return stack.attention(0, hidden, stack.rotary(hidden, torch.arange(70)), DynamicCache(), query_rows=20)[1]

    torch.testing.assert_close(last_queries(16), last_queries(4096), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("kind", "attn", "empty_calls"), [("qwen3", "sdpa", 1), ("qwen3", "eager", 5), ("gemma3", "sdpa", 5)]
)
def test_rows_with_nothing_cached_run_as_one_block_where_no_mask_is_built(kind, attn, empty_calls, monkeypatch):
    """SDPA's causal flag serves a prefill with nothing cached (a re-read) whole, so it skips the masked
    half instead of computing blocks under masks; eager attention (a mask always) and a window shorter
    than the rows keep the blocks. After a cached prefix the rows go in blocks as before."""
    stack = DecoderStack(build(kind, attn=attn))
    monkeypatch.setattr(decoder, "ATTENTION_ROWS", 16)
    calls: list[int] = []
    attend = stack.family.attend
    monkeypatch.setattr(stack.family, "attend", lambda i, rows, *a: calls.append(rows.shape[1]) or attend(i, rows, *a))
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(2))
    hidden = stack.embed(ids)
    with torch.no_grad():
        stack.attention(0, hidden, stack.rotary(hidden, torch.arange(70)), DynamicCache())
        assert len(calls) == empty_calls and sum(calls) == 70
        calls.clear()
        cache = DynamicCache()
        run_stack(stack, ids[:20], torch.arange(20), cache)
        calls.clear()
        stack.attention(0, hidden[:, 20:], stack.rotary(hidden[:, 20:], torch.arange(20, 70)), cache)
    assert calls == [16, 16, 16, 2], "after a cache, blocks under masks"


@pytest.mark.parametrize("kind", KINDS)
def test_pruning_queries_are_the_ones_attention_uses(kind):
    """Softmax of our last-row query against the cached keys = the model's own attention row, every layer."""
    model = build(kind, attn="eager")
    stack = DecoderStack(model)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache()
    with torch.no_grad():
        ours, queries = run_stack(stack, ids, torch.arange(40), cache)
        out = model(ids[None], output_attentions=True)
    torch.testing.assert_close(ours, out.logits[0, -1], atol=LOGITS_ATOL, rtol=0)
    groups = stack.num_heads // stack.num_kv_heads
    for layer_idx, query in enumerate(queries):
        keys = cache.layers[layer_idx].keys.repeat_interleave(groups, dim=1)
        logits = (query @ keys.transpose(2, 3))[0, :, -1] * stack.scaling  # [H, T]
        window = stack.window(layer_idx)
        if window is not None:
            logits[:, : 40 - window] = float("-inf")
        expected = out.attentions[layer_idx][0, :, -1]
        torch.testing.assert_close(logits.softmax(-1), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_tree_invariants_and_decoding_from_the_cache(kind):
    model = build(kind)
    result, (p, _, s) = compress(model, 700)
    assert result.plan.height >= 2
    conftest.assert_tree_invariants(result, model, p.numel(), s.numel(), MCL)
    assert torch.isfinite(result.next_token_logits).all()

    # A question after the cache: transformers' forward (its own masks, sliding windows included)
    # and our loop must agree, so what compression computed is what decoding sees.
    question = torch.tensor([7, 8, 9])
    positions = torch.arange(result.last_position + 1, result.last_position + 4)
    with torch.no_grad():
        theirs = model(
            question[None],
            position_ids=positions[None],
            cache=cache_from_tensors(result.keys, result.values),
            use_cache=True,
        ).logits[0, -1]
        ours, _ = run_stack(DecoderStack(model), question, positions, cache_from_tensors(result.keys, result.values))
    torch.testing.assert_close(ours, theirs, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["gemma3", "qwen3"])
def test_generation_runs_from_the_compressed_cache(kind, tokenizer):
    model = build(kind)
    result, _ = compress(model, 700)
    cache = cache_from_tensors(result.keys, result.values)
    state = DecodeState()
    options = GenerationOptions(max_new_tokens=6)
    text = "".join(decode(model, tokenizer, cache, torch.tensor([7, 8]), result.last_position + 1, options, state))
    assert state.finish_reason in ("length", "eos") and len(state.token_ids) >= 1
    assert isinstance(text, str)
    assert cache.get_seq_length() == result.keys[0].shape[2] + 2 + len(state.token_ids) - 1


@pytest.mark.parametrize("positions", ["monotonic", "merged"])
def test_a_sliding_layer_sees_only_its_window(positions):
    """In leaves (monotonic positions) and merged nodes (repeated positions): a sliding layer's row i
    does not depend on tokens before ``i - window + 1``; a global layer's does."""
    stack = DecoderStack(build("gemma3"))
    assert [stack.window(i) for i in range(6)] == [WINDOW, WINDOW, None] * 2
    pos = torch.arange(40) if positions == "monotonic" else torch.cat([torch.arange(20), torch.arange(20)])
    hidden = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(0))
    changed = hidden.clone()
    changed[:, 0] += 1.0
    rope = stack.rotary(hidden, pos)
    with torch.no_grad():
        for layer_idx, local in ((0, True), (2, False)):
            a, _ = stack.attention(layer_idx, hidden, rope, DynamicCache())
            b, _ = stack.attention(layer_idx, changed, rope, DynamicCache())
            assert not torch.allclose(a[:, 1:WINDOW], b[:, 1:WINDOW]), "row 0 is inside the early rows' window"
            assert torch.equal(a[:, WINDOW:], b[:, WINDOW:]) == local


def test_sliding_rows_after_a_cache_match_one_pass():
    """Rows appended after cached tokens (leaf tiers, questions) see the same window as in one pass."""
    stack = DecoderStack(build("gemma3"))
    hidden = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(0))
    rope = stack.rotary(hidden, torch.arange(40))
    head = {k: (c[:, :30], s[:, :30]) for k, (c, s) in rope.items()}
    tail = {k: (c[:, 30:], s[:, 30:]) for k, (c, s) in rope.items()}
    with torch.no_grad():
        for layer_idx in (0, 2):
            whole, _ = stack.attention(layer_idx, hidden, rope, DynamicCache())
            cache = DynamicCache()
            stack.attention(layer_idx, hidden[:, :30], head, cache)
            rest, _ = stack.attention(layer_idx, hidden[:, 30:], tail, cache)
            torch.testing.assert_close(rest, whole[:, 30:], atol=1e-5, rtol=0)


def test_gemma3_uses_its_local_rope_and_scaled_embeddings():
    stack = DecoderStack(build("gemma3"))
    rope = stack.rotary(torch.zeros(1, 5, 64), torch.arange(5))
    assert set(rope) == {"sliding_attention", "full_attention"}
    assert not torch.allclose(rope["sliding_attention"][0], rope["full_attention"][0])
    ids = torch.tensor([1, 2, 3])
    plain = stack.backbone.embed_tokens.weight[ids]
    torch.testing.assert_close(stack.embed(ids)[0], plain * 64**0.5)


def test_llama3_rope_scaling_reaches_the_rotary_tables():
    stack = DecoderStack(build("llama3_rope"))
    assert stack.backbone.rotary_emb.rope_type == "llama3"
    torch.manual_seed(0)
    plain = DecoderStack(LlamaForCausalLM(LlamaConfig(**TINY)).eval())
    ours = stack.rotary(torch.zeros(1, 1, 64), torch.tensor([100]))["default"][0]
    default = plain.rotary(torch.zeros(1, 1, 64), torch.tensor([100]))["default"][0]
    assert not torch.allclose(ours, default), "low frequencies are stretched by the llama3 rule"


def test_unsupported_settings_fail_with_a_clear_error():
    encoder = Gemma3TextConfig(**TINY, head_dim=16, use_bidirectional_attention=True)
    with pytest.raises(UnsupportedModelError, match="bidirectional"):
        check_supported(encoder)
    with pytest.raises(UnsupportedModelError, match="at least 2 decoder layers"):
        check_supported(Qwen3Config(**{**TINY, "num_hidden_layers": 1}, head_dim=16))


def test_calibration_runs_on_sliding_and_global_layers():
    from homer_integrations.homer.scoring.calibration import compute_bias

    stack = DecoderStack(build("gemma3"))
    ids = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(2))
    bias = compute_bias(stack, ids, 64, segments=2, progress=False)
    assert bias.shape == (6, 64) and torch.isfinite(bias).all()
