"""LangChain integration: chat and text models over HOMER, whole-document loaders, per-query routing, questions
across documents with their sources."""

from homer_integrations.langchain.chat_models import ChatHomer
from homer_integrations.langchain.corpus import HomerCorpusQA
from homer_integrations.langchain.document_loaders import HomerDirectoryLoader, HomerDocumentLoader
from homer_integrations.langchain.llms import HomerLLM
from homer_integrations.langchain.router import HomerRouter

__all__ = ["ChatHomer", "HomerCorpusQA", "HomerDirectoryLoader", "HomerDocumentLoader", "HomerLLM", "HomerRouter"]
