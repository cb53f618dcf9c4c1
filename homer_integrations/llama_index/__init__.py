"""LlamaIndex adapters over the shared ``HomerModel``: an LLM, a whole-document query engine,
whole-document readers and a HOMER-or-retrieval router."""

from homer_integrations.llama_index.llm import HomerLLM
from homer_integrations.llama_index.query_engine import HomerQueryEngine

__all__ = ["HomerLLM", "HomerQueryEngine"]
