"""Token accounting and per-answer statistics in the shapes frameworks report them.

Cache accounting follows the prompt-caching convention (Anthropic, OpenAI, LangChain's
``input_token_details``): the compressed span (template head + document + fixed suffix) is
*cache creation* on the call that compressed it and *cache read* on every call that reused
it; ``input_tokens`` is the whole prompt: that span plus the tokens fed after the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homer_integrations.engine import AnswerInfo


@dataclass(frozen=True)
class TokenUsage:
    """Token counts of one answer; ``cache_creation + cache_read <= input_tokens``."""

    input_tokens: int
    output_tokens: int
    cache_creation: int
    cache_read: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def token_usage(info: AnswerInfo) -> TokenUsage:
    """Usage of a finished answer (its stream exhausted)."""
    cached = info.compression.prompt_tokens if info.compression is not None else 0
    created = cached if info.cache_source == "computed" else 0
    return TokenUsage(
        input_tokens=cached + info.input_tokens,
        output_tokens=info.output_tokens,
        cache_creation=created,
        cache_read=cached - created,
    )


def answer_metadata(info: AnswerInfo) -> dict[str, Any]:
    """HOMER statistics of a finished answer as a flat, JSON-ready dict.

    ``mode`` is the HOMER mode that served (``shared``, ``query_aware``, ``full``; None for a
    plain prompt); ``cache_source`` is ``computed`` / ``memory`` / ``disk`` (None for a plain
    prompt); ``compress_seconds`` is the time spent getting the cache on this call, of which
    ``document_seconds`` computing the cached entry (0 when it came from the cache).
    """
    data: dict[str, Any] = {
        "mode": info.mode,
        "cache_source": info.cache_source,
        "document_tokens": info.document_tokens,
        "cache_tokens": info.cache_tokens,
        "compress_seconds": round(info.compress_seconds, 4),
        "document_seconds": round(info.document_seconds, 4),
        "finish_reason": info.finish_reason,
        "time_to_first_token": None if info.time_to_first_token is None else round(info.time_to_first_token, 4),
        "total_seconds": round(info.total_seconds, 4),
    }
    if info.compression is not None:
        data["compression_ratio"] = round(info.compression.compression_ratio, 3)
        data["compression_seconds"] = round(info.compression.seconds, 4)
    return data
