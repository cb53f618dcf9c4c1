"""Where the package keeps files (bundled data, the user's cache directory), and whether a file is this user's own
private file: what the keyed cache's secret and ``homer-qa serve``'s announcement must be before they are trusted."""

from __future__ import annotations

import os
import stat
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


def not_private(st: os.stat_result, fix: str) -> str | None:
    """Why a file of ``st`` is not this user's own private file (``fix`` ends the reason), or None."""
    if not hasattr(os, "getuid"):  # no POSIX owners and modes (Windows)
        return None
    if st.st_uid != os.getuid():
        return f"belongs to user {st.st_uid}, not to you (user {os.getuid()})"
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):o}: others may read or write it ({fix})"
    return None
