"""Whole-document readers on real files: text, markdown, HTML, a generated PDF, and broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_index.core import SimpleDirectoryReader
from llama_index.core.schema import MetadataMode

from homer_integrations.documents import DocumentError
from homer_integrations.llama_index import HomerQueryEngine
from homer_integrations.llama_index.readers import (
    HomerDirectoryReader,
    HomerFileReader,
    HomerHTMLReader,
    HomerPDFReader,
    HomerTextReader,
)
from tests.test_documents import make_pdf  # the document-parsing tests' real-PDF helper

PARAGRAPHS = "First paragraph about the lighthouse.\n\nSecond paragraph about the keeper."


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text(PARAGRAPHS, encoding="utf-8")
    (tmp_path / "readme.md").write_text("# Title\n\nSome *markdown* text.", encoding="utf-8")
    (tmp_path / "page.html").write_text(
        "<html><head><title>The Page</title><style>p{}</style></head>"
        "<body><h1>Heading</h1><p>Visible text.</p><script>hidden()</script></body></html>",
        encoding="utf-8",
    )
    make_pdf(tmp_path / "book.pdf", ["Page one of the book.", "Page two of the book."])
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "broken.pdf").write_bytes(b"%PDF-1.7\nthis is not really a pdf")
    (sub / "empty.txt").write_text("", encoding="utf-8")
    (sub / "image.png").write_bytes(b"\x89PNG\r\n")  # unsupported suffix: passed over silently
    return tmp_path


def test_text_reader_keeps_the_whole_file(folder):
    (doc,) = HomerTextReader().load_data(folder / "notes.txt", extra_info={"collection": "demo"})
    assert doc.text == PARAGRAPHS
    assert doc.doc_id == str(folder / "notes.txt")
    assert doc.metadata["file_type"] == "text" and doc.metadata["collection"] == "demo"
    # bookkeeping metadata stays out of prompts
    assert "size_bytes" not in doc.get_content(metadata_mode=MetadataMode.LLM)
    assert "notes.txt" in doc.get_content(metadata_mode=MetadataMode.LLM)


def test_html_and_pdf_readers(folder):
    (page,) = HomerHTMLReader().load_data(folder / "page.html")
    assert "Heading" in page.text and "Visible text." in page.text
    assert "hidden()" not in page.text and "p{}" not in page.text
    assert page.metadata["title"] == "The Page"

    (book,) = HomerPDFReader().load_data(folder / "book.pdf")
    assert "Page one of the book." in book.text and "Page two of the book." in book.text
    assert book.metadata["pages"] == 2


def test_readers_refuse_bad_files_naming_them(folder):
    with pytest.raises(DocumentError, match=r"broken\.pdf: (broken PDF|not a PDF)"):
        HomerPDFReader().load_data(folder / "sub" / "broken.pdf")
    with pytest.raises(DocumentError, match=r"empty\.txt: file is empty"):
        HomerFileReader().load_data(folder / "sub" / "empty.txt")
    with pytest.raises(DocumentError, match=r"notes\.txt: HomerPDFReader reads pdf files only"):
        HomerPDFReader().load_data(folder / "notes.txt")
    with pytest.raises(DocumentError, match="no such file"):
        HomerFileReader().load_data(folder / "missing.txt")


def test_directory_reader_skips_bad_files_or_stops(folder):
    reader = HomerDirectoryReader(folder)
    docs = reader.load_data()
    assert [Path(d.doc_id).name for d in docs] == ["book.pdf", "notes.txt", "page.html", "readme.md"]
    assert sorted(e.path.name for e in reader.errors) == ["broken.pdf", "empty.txt"]

    assert len(HomerDirectoryReader(folder, recursive=False).load_data()) == 4
    with pytest.raises(DocumentError, match=r"broken\.pdf"):
        HomerDirectoryReader(folder, strict=True).load_data()


def test_file_readers_plug_into_simple_directory_reader(folder):
    docs = SimpleDirectoryReader(
        input_files=[folder / "book.pdf", folder / "page.html"],
        file_extractor={".pdf": HomerPDFReader(), ".html": HomerHTMLReader()},
    ).load_data()
    assert len(docs) == 2  # one document per file, not one per page
    assert "Page two of the book." in docs[0].text


def test_query_engine_from_directory(folder, smol_engine, tmp_path):
    engine = HomerQueryEngine.from_directory(folder, engine=smol_engine)
    assert len(engine.documents) == 4
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "bad.pdf").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"no documents could be read .*bad\.pdf"):
        HomerQueryEngine.from_directory(empty, engine=smol_engine)
