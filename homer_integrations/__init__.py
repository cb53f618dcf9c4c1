"""homer-integrations: whole-document question answering with HOMER, for LangChain and LlamaIndex."""

from homer_integrations.engine import AnswerInfo, AnswerStream, HomerModel
from homer_integrations.homer.compressed import CompressedDocument, CompressionStats
from homer_integrations.homer.config import HomerConfig
from homer_integrations.homer.generation import GenerationOptions

__all__ = [
    "AnswerInfo",
    "AnswerStream",
    "CompressedDocument",
    "CompressionStats",
    "GenerationOptions",
    "HomerConfig",
    "HomerModel",
]
__version__ = "0.1.0"
