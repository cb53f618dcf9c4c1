"""LangChain integration: chat and text models over HOMER, whole-document loaders, per-query routing."""

from homer_integrations.langchain.chat_models import ChatHomer

__all__ = ["ChatHomer"]
