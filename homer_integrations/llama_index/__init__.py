"""LlamaIndex adapters over the shared ``HomerModel``: an LLM, a whole-document query engine, a query engine
across documents that cites its sources, whole-document readers and a HOMER-or-retrieval router."""

from homer_integrations.llama_index.corpus import HomerCorpusQueryEngine
from homer_integrations.llama_index.llm import HomerLLM
from homer_integrations.llama_index.query_engine import HomerQueryEngine
from homer_integrations.llama_index.readers import (
    HomerDirectoryReader,
    HomerFileReader,
    HomerHTMLReader,
    HomerPDFReader,
    HomerTextReader,
)
from homer_integrations.llama_index.retrieval import ExcerptSynthesizer, bm25_query_engine
from homer_integrations.llama_index.router import HomerRouterQueryEngine
from homer_integrations.llama_index.selector import HomerRouteSelector

__all__ = [
    "ExcerptSynthesizer",
    "HomerCorpusQueryEngine",
    "HomerDirectoryReader",
    "HomerFileReader",
    "HomerHTMLReader",
    "HomerLLM",
    "HomerPDFReader",
    "HomerQueryEngine",
    "HomerRouteSelector",
    "HomerRouterQueryEngine",
    "HomerTextReader",
    "bm25_query_engine",
]
