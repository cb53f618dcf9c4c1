"""What the leaf-tier tests share: the tiny settings, a compressor, token ids, the equality check."""

import torch

from homer_integrations.homer.layers.nodes import CompressorSettings
from homer_integrations.homer.leaves.tier_file import whole_tensors
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.tree.compressor import HomerCompressor
from tests.conftest import uncalibrated

KINDS = ["llama", "mistral", "qwen2"]
MCL, RESERVE = 128, 12
# The replay runs the suffix rows against cached K/V instead of the whole leaf in one call: the
# same arithmetic in another blocking, so fp32 results agree to rounding.
ATOL = 1e-4


def ids(model, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (n,), generator=g)


def compressor(model, **kw) -> HomerCompressor:
    settings = CompressorSettings(
        **{
            "max_chunk_len": MCL,
            "warmup_layers": 3,
            "final_cache_len": MCL,
            "scoring": uncalibrated(),
            "want_logits": True,
            "suffix_reserve": RESERVE,
            **kw,
        }
    )
    return HomerCompressor(DecoderStack(model), settings, None)


def assert_same_tier(tier, other, atol: float = 1e-5) -> None:
    """Two leaf tiers of one plan hold the same tensors, to ``atol``."""
    assert tier.plan == other.plan
    mine, theirs = whole_tensors(tier)[0], whole_tensors(other)[0]
    assert mine.keys() == theirs.keys()
    for name, t in mine.items():
        torch.testing.assert_close(t, theirs[name], atol=atol, rtol=0, msg=name)


def assert_same_compression(replayed, scratch) -> None:
    assert replayed.plan == scratch.plan
    assert torch.equal(replayed.origin, scratch.origin), "the same tokens survive"
    assert torch.equal(replayed.position_ids, scratch.position_ids)
    assert len(replayed.keys) == len(scratch.keys)
    for a, b in zip(replayed.keys + replayed.values, scratch.keys + scratch.values, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    torch.testing.assert_close(replayed.next_token_logits, scratch.next_token_logits, atol=ATOL, rtol=0)
