"""Where the package keeps files: bundled data, and the user's cache directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PACKAGE_DATA = Path(__file__).parent / "data"
CACHE_ENV = "HOMER_INTEGRATIONS_CACHE"
NOVEL_START = "It is a truth universally acknowledged"
"""The first sentence of Pride and Prejudice (chapter 1), where excerpts start by default."""


def cache_root() -> Path:
    """Root of everything the package caches: ``$HOMER_INTEGRATIONS_CACHE`` or the platform cache dir."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path(platformdirs.user_cache_dir("homer-integrations"))


def bundled_text(name: str = "prideprejudice") -> str:
    """A bundled public-domain novel: ``prideprejudice`` or ``northangerabbey``."""
    path = PACKAGE_DATA / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"no bundled text named {name!r} (looked for {path})")
    return path.read_text(encoding="utf-8")


def bundled_excerpt(tokenizer: PreTrainedTokenizerBase, tokens: int, start_marker: str = NOVEL_START) -> str:
    """About ``tokens`` tokens of the bundled Pride and Prejudice, from ``start_marker`` on.

    The text from the marker's first occurrence (``""``: from the title page) is tokenized with
    ``tokenizer`` (no special tokens), cut to its first ``tokens`` tokens and decoded, so it
    re-encodes to about ``tokens`` tokens. Shorter when the rest of the novel is shorter.
    """
    novel = bundled_text("prideprejudice")
    ids = tokenizer(novel[novel.index(start_marker) :], add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:tokens])
