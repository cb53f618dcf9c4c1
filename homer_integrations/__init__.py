"""homer-integrations: whole-document question answering with HOMER, for LangChain and LlamaIndex.

The names below load on first use (PEP 562), so ``homer-qa`` starts without torch and refuses bad
input in well under a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homer_integrations.engine.model import AnswerInfo, AnswerStream, HomerModel
    from homer_integrations.engine.prompting import InputTooLongError, PromptTooLongError
    from homer_integrations.homer.config import HomerConfig
    from homer_integrations.homer.decoding.generation import GenerationOptions
    from homer_integrations.homer.kv.compressed import CompressedDocument, CompressionStats

_EXPORTS = {
    "AnswerInfo": "homer_integrations.engine.model",
    "AnswerStream": "homer_integrations.engine.model",
    "HomerModel": "homer_integrations.engine.model",
    "CompressedDocument": "homer_integrations.homer.kv.compressed",
    "CompressionStats": "homer_integrations.homer.kv.compressed",
    "HomerConfig": "homer_integrations.homer.config",
    "GenerationOptions": "homer_integrations.homer.decoding.generation",
    "InputTooLongError": "homer_integrations.engine.prompting",
    "PromptTooLongError": "homer_integrations.engine.prompting",
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
