"""Fixtures for the LangChain adapter tests: documents cut from the bundled novel by token count, and
fresh engines (SmolLM2, or a tiny random-weight Llama for plumbing tests) with empty document caches."""

from __future__ import annotations

from collections.abc import Callable

import pytest

NOVEL_START = "It is a truth universally acknowledged"


@pytest.fixture(scope="session")
def novel_excerpt(smol_engine, novel) -> Callable[[int, int], str]:
    """``excerpt(tokens, skip=0)``: ``tokens`` tokens of the novel from chapter 1, after ``skip`` tokens,
    cut at a line end so the text stays natural."""
    ids = smol_engine.prompting.token_ids(novel[novel.index(NOVEL_START) :][:200_000])

    def excerpt(tokens: int, skip: int = 0) -> str:
        text = smol_engine.tokenizer.decode(ids[skip : skip + tokens])
        return text[: text.rfind("\n")].strip()

    return excerpt


@pytest.fixture
def fresh_engine(smol_parts):
    """A new engine over the session's SmolLM2 weights, with an empty document cache (to count compressions),
    answering from the shared root unless a call names another mode (pinned, as ``smol_engine``)."""
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.engine.loading import SMOLLM2
    from homer_integrations.homer.config import ModelDefaults

    model, tokenizer = smol_parts
    defaults = ModelDefaults(max_chunk_len=SMOLLM2.max_chunk_len, warmup_layers=SMOLLM2.warmup_layers)
    config = HomerConfig(mode="shared")
    return HomerModel(model, tokenizer, config, model_name=SMOLLM2.name, defaults=defaults, progress=False)


@pytest.fixture
def tiny_engine(tokenizer, calibration):
    """A new engine over a tiny random-weight Llama with the real SmolLM2 tokenizer (``mode_engine``:
    ``max_chunk_len`` 128, so a 2,000-token document is a 16-leaf tree) and an empty document cache,
    answering from the shared root. For plumbing tests (compress once, read the cache, usage metadata):
    one compression takes about a second where SmolLM2's head-wise root takes 40. Its answers are
    arbitrary but deterministic tokens (greedy): tests check their counts, not their words."""
    from tests.conftest import mode_engine

    return mode_engine(tokenizer, calibration, mode="shared")
