"""Per-answer statistics as one JSON-ready dict for LlamaIndex responses and node metadata."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from homer_integrations.engine import AnswerInfo
from homer_integrations.usage import answer_metadata, token_usage


def answer_info_dict(info: AnswerInfo) -> dict[str, Any]:
    """The shared flat statistics and token usage of a finished answer, plus the full compression
    statistics (``compression``: leaves, tree height, cache bytes, ...; None for plain prompts)."""
    return {
        **answer_metadata(info),
        **asdict(token_usage(info)),
        "compression": None if info.compression is None else asdict(info.compression),
    }
