"""homer-integrations: whole-document question answering with HOMER, for LangChain and LlamaIndex.

The names below load on first use (PEP 562), so ``homer-qa`` starts without torch and refuses bad
input in well under a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homer_integrations.engine import AnswerInfo, AnswerStream, HomerModel
    from homer_integrations.homer.compressed import CompressedDocument, CompressionStats
    from homer_integrations.homer.config import HomerConfig
    from homer_integrations.homer.generation import GenerationOptions
    from homer_integrations.prompting import InputTooLongError, PromptTooLongError

_EXPORTS = {
    "AnswerInfo": "homer_integrations.engine",
    "AnswerStream": "homer_integrations.engine",
    "HomerModel": "homer_integrations.engine",
    "CompressedDocument": "homer_integrations.homer.compressed",
    "CompressionStats": "homer_integrations.homer.compressed",
    "HomerConfig": "homer_integrations.homer.config",
    "GenerationOptions": "homer_integrations.homer.generation",
    "InputTooLongError": "homer_integrations.prompting",
    "PromptTooLongError": "homer_integrations.prompting",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AnswerInfo",
    "AnswerStream",
    "CompressedDocument",
    "CompressionStats",
    "GenerationOptions",
    "HomerConfig",
    "HomerModel",
    "InputTooLongError",
    "PromptTooLongError",
]
__version__ = "0.1.0"
