"""LlamaIndex adapters over the shared ``HomerModel``: an LLM, a whole-document query engine,
whole-document readers and a HOMER-or-retrieval router."""

from homer_integrations.llama_index.llm import HomerLLM

__all__ = ["HomerLLM"]
