"""Fixtures for the LangChain adapter tests: documents cut from the bundled novel by token count."""

from __future__ import annotations

from collections.abc import Callable

import pytest

NOVEL_START = "It is a truth universally acknowledged"


@pytest.fixture(scope="session")
def novel_excerpt(smol_engine, novel) -> Callable[[int, int], str]:
    """``excerpt(tokens, skip=0)``: ``tokens`` tokens of the novel from chapter 1, after ``skip`` tokens,
    cut at a line end so the text stays natural."""
    ids = smol_engine.token_ids(novel[novel.index(NOVEL_START) :][:200_000])

    def excerpt(tokens: int, skip: int = 0) -> str:
        text = smol_engine.tokenizer.decode(ids[skip : skip + tokens])
        return text[: text.rfind("\n")].strip()

    return excerpt
