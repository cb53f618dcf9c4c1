"""Whole-document loaders: one LangChain ``Document`` per file, never split.

Thin over ``homer_integrations.documents`` (shared with the LlamaIndex readers and the CLI):
text and markup (.txt, .md, .markdown, .rst), PDF (pypdf) and HTML (beautifulsoup4). Errors are
``DocumentError``\\ s (``ValueError``) whose message starts with the file's path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.document_loaders import BaseLoader
from langchain_core.documents import Document

from homer_integrations.documents import DEFAULT_MAX_BYTES, DocumentError, ParsedDocument, iter_documents, read_document

logger = logging.getLogger(__name__)


def to_langchain_document(parsed: ParsedDocument) -> Document:
    """A LangChain ``Document`` with id = the file's path and the parser's metadata (``source`` etc.)."""
    return Document(id=parsed.source, page_content=parsed.text, metadata=dict(parsed.metadata))


class HomerDocumentLoader(BaseLoader):
    """Loads one whole file (any supported type) as one ``Document``; a bad file raises ``DocumentError``."""

    def __init__(self, file_path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.file_path = Path(file_path)
        self.max_bytes = max_bytes

    def lazy_load(self) -> Iterator[Document]:
        yield to_langchain_document(read_document(self.file_path, max_bytes=self.max_bytes))


class HomerDirectoryLoader(BaseLoader):
    """Loads every supported file under a directory, one whole ``Document`` each, in path order.

    A file that cannot be read is skipped with a warning and kept in ``errors`` (each names its
    file) while the others load; with ``strict=True`` the first bad file raises instead.
    ``options`` go to ``homer_integrations.documents.iter_documents`` (``suffixes``,
    ``include_hidden``, ``max_bytes``).
    """

    def __init__(
        self, path: str | Path, glob: str = "*", *, recursive: bool = True, strict: bool = False, **options: Any
    ) -> None:
        self.path = Path(path)
        self.glob = glob
        self.recursive = recursive
        self.strict = strict
        self.options = options
        self.errors: list[DocumentError] = []

    def lazy_load(self) -> Iterator[Document]:
        self.errors = []
        options = {"recursive": self.recursive, "strict": self.strict, **self.options}
        for result in iter_documents(self.path, self.glob, **options):
            if result.error is None:
                yield to_langchain_document(result.document)
                continue
            logger.warning("skipped %s", result.error)
            self.errors.append(result.error)
