"""The engine's per-answer statistics as plain dicts for LlamaIndex responses and node metadata."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from homer_integrations.engine import AnswerInfo


def answer_info_dict(info: AnswerInfo) -> dict[str, Any]:
    """``AnswerInfo`` as a JSON-ready dict; ``compression`` is None for plain prompts."""
    data = asdict(info)
    if info.compression is not None:
        data["compression"]["compression_ratio"] = round(info.compression.compression_ratio, 3)
    return data
