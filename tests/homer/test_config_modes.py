"""``resolve_mode``: the one function that decides which HOMER mode serves a call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from homer_integrations.homer.config import first_mode, resolve_mode


def compressed(question: str | None = None, max_chunk_len: int = 512, tree_height: int = 2) -> SimpleNamespace:
    """What ``resolve_mode`` reads of a ``CompressedDocument``."""
    stats = SimpleNamespace(max_chunk_len=max_chunk_len, tree_height=tree_height)
    return SimpleNamespace(question=question, stats=stats)


def test_the_most_specific_request_wins_then_the_default_then_the_question():
    assert resolve_mode("full", "query_aware", default="shared") == "full"
    assert resolve_mode(None, "query_aware", default="shared") == "query_aware"
    assert resolve_mode(None, None, default="full") == "full"
    assert resolve_mode(question="Who?") == "query_aware"
    assert resolve_mode() == resolve_mode(None) == "shared"
    assert first_mode(None, None) is None and first_mode(None, "full", "shared") == "full"


def test_the_chosen_request_is_checked_and_the_ones_after_it_are_not():
    with pytest.raises(ValueError, match="unknown HOMER mode 'bogus'"):
        resolve_mode(None, "bogus", default="shared")
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        first_mode(3)
    assert resolve_mode("shared", "bogus") == "shared"  # as the adapters did: a call's mode hides the setting


def test_a_compressed_document_serves_in_the_mode_it_was_compressed_in():
    window = 2048
    assert resolve_mode("shared", compressed=compressed("Who?"), window=window) == "query_aware"
    assert resolve_mode(compressed=compressed(max_chunk_len=window, tree_height=0), window=window) == "full"
    assert resolve_mode("full", compressed=compressed(), window=window) == "shared"
    assert resolve_mode(compressed=compressed(max_chunk_len=window, tree_height=1), window=window) == "shared"
    with pytest.raises(ValueError, match="unknown HOMER mode"):
        resolve_mode("bogus", compressed=compressed(), window=window)
