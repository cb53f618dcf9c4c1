"""Whole-document readers: one LlamaIndex ``Document`` per file, never split.

Thin over ``homer_integrations.documents`` (shared with the LangChain loaders and the CLI), which
parses text/markdown, PDF and HTML and raises ``DocumentError`` naming the file on bad input.
A document's id is its path, so reading the same files again gives the same ids. The file
readers also work as ``SimpleDirectoryReader(file_extractor={".pdf": HomerPDFReader()})``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import Document

from homer_integrations.documents import (
    DEFAULT_MAX_BYTES,
    FILE_TYPES,
    DocumentError,
    ParsedDocument,
    iter_documents,
    read_document,
)

logger = logging.getLogger(__name__)

HIDDEN_FROM_MODEL = ("source", "file_type", "size_bytes", "encoding", "pages")
"""Metadata kept on the document but left out of LLM prompts and of the BM25 index."""


def to_llama_document(parsed: ParsedDocument, extra_info: dict[str, Any] | None = None) -> Document:
    """A LlamaIndex ``Document`` with id = path, the parser's metadata and ``extra_info``."""
    metadata = {**parsed.metadata, **(extra_info or {})}
    hidden = [k for k in HIDDEN_FROM_MODEL if k in metadata]
    return Document(
        id_=parsed.source,
        text=parsed.text,
        metadata=metadata,
        excluded_llm_metadata_keys=hidden,
        excluded_embed_metadata_keys=hidden,
    )


class HomerFileReader(BaseReader):
    """Reads one whole file of any supported type (``SUPPORTED_SUFFIXES``) into one ``Document``.

    Raises ``DocumentError`` (a ``ValueError`` starting with the path) for a missing, empty,
    binary, broken or unsupported file.
    """

    file_types: ClassVar[frozenset[str] | None] = None
    """The ``file_type`` values this reader accepts (None: all)."""

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes

    def lazy_load_data(
        self, file: str | Path, extra_info: dict[str, Any] | None = None, fs: Any = None
    ) -> Iterator[Document]:
        path = Path(file)
        if fs is not None:
            raise DocumentError(path, f"{type(self).__name__} reads local files only, not through {type(fs).__name__}")
        kind = FILE_TYPES.get(path.suffix.lower())
        if self.file_types is not None and kind not in self.file_types:
            raise DocumentError(path, f"{type(self).__name__} reads {', '.join(sorted(self.file_types))} files only")
        yield to_llama_document(read_document(path, max_bytes=self.max_bytes), extra_info)


class HomerTextReader(HomerFileReader):
    """Plain text and markup (.txt, .md, .markdown, .rst), whole."""

    file_types = frozenset({"text", "markdown", "rst"})


class HomerPDFReader(HomerFileReader):
    """A whole PDF (pypdf): the pages' text joined by blank lines; ``pages`` in the metadata."""

    file_types = frozenset({"pdf"})


class HomerHTMLReader(HomerFileReader):
    """A whole HTML page (beautifulsoup4): visible text with block elements on their own lines."""

    file_types = frozenset({"html"})


class HomerDirectoryReader(BaseReader):
    """Every supported file under a directory, one whole ``Document`` each, in sorted path order.

    A bad file is skipped with a warning and kept in ``errors`` (``DocumentError``\\ s naming
    the files), or, with ``strict=True``, stops the reading with that error.
    """

    def __init__(self, input_dir: str | Path, *, recursive: bool = True, strict: bool = False, **options: Any) -> None:
        """``options`` go to ``iter_documents``: ``pattern``, ``suffixes``, ``include_hidden``, ``max_bytes``."""
        self.input_dir = Path(input_dir)
        self.recursive = recursive
        self.strict = strict
        self.options = options
        self.errors: list[DocumentError] = []

    def lazy_load_data(self, extra_info: dict[str, Any] | None = None) -> Iterator[Document]:
        self.errors = []
        results = iter_documents(self.input_dir, recursive=self.recursive, strict=self.strict, **self.options)
        for result in results:
            if result.document is not None:
                yield to_llama_document(result.document, extra_info)
            elif result.error is not None:
                logger.warning("skipped %s", result.error)
                self.errors.append(result.error)


def read_directory(path: str | Path, *, recursive: bool = True) -> list[Document]:
    """Every supported file under ``path``, whole (``HomerDirectoryReader``); ``ValueError`` naming what
    went wrong when none could be read (the query engines' ``from_directory``)."""
    reader = HomerDirectoryReader(path, recursive=recursive)
    documents = reader.load_data()
    if not documents:
        problems = "; ".join(str(e) for e in reader.errors) or "no supported files"
        raise ValueError(f"no documents could be read from {path}: {problems}")
    return documents
