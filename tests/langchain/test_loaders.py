"""Whole-document loaders on real files: text, markdown, HTML, a PDF made with fpdf2, and broken files."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.documents import Document

from homer_integrations.documents import DocumentError
from homer_integrations.langchain import HomerDirectoryLoader, HomerDocumentLoader
from tests.test_documents import make_pdf  # real PDFs made with fpdf2

CHAPTER = "Chapter 1\n\nIt is a truth universally acknowledged.\n\nMr. Bennet replied that he had not."
FILES = {
    "a_story.txt": CHAPTER,
    "b_notes.md": "# Notes\n\nElizabeth walks to Netherfield.\n",
    "c_page.html": "<html><head><title>Longbourn</title><script>var x = 1;</script></head>"
    "<body><h1>Longbourn</h1><p>The Bennets live here.</p></body></html>",
    "e_broken.pdf": "%PDF-1.4\nthis is not really a pdf\n",
    "f_empty.txt": "",
    "g_ignored.csv": "a,b\n1,2\n",
    "sub/h_more.txt": "Lydia elopes with Wickham.",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Good and bad files of every kind, and one in a subfolder."""
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    make_pdf(tmp_path / "d_book.pdf", ["Darcy proposes at Hunsford.", "Elizabeth refuses him."])
    return tmp_path


def test_each_file_type_loads_whole_with_its_source(folder: Path):
    story = HomerDocumentLoader(folder / "a_story.txt").load()
    assert story == [Document(id=str(folder / "a_story.txt"), page_content=CHAPTER, metadata=story[0].metadata)]
    assert story[0].metadata["source"] == str(folder / "a_story.txt") and story[0].metadata["file_type"] == "text"

    (html,) = HomerDocumentLoader(folder / "c_page.html").load()
    assert "The Bennets live here." in html.page_content and "var x" not in html.page_content
    assert html.metadata["title"] == "Longbourn"

    (pdf,) = HomerDocumentLoader(folder / "d_book.pdf").load()
    assert "Darcy proposes at Hunsford." in pdf.page_content and "Elizabeth refuses him." in pdf.page_content
    assert pdf.metadata["pages"] == 2 and pdf.metadata["file_type"] == "pdf"


@pytest.mark.parametrize("name", ["e_broken.pdf", "f_empty.txt", "missing.txt"])
def test_a_bad_file_raises_an_error_naming_it(folder: Path, name: str):
    loader = HomerDocumentLoader(folder / name)
    with pytest.raises(DocumentError) as caught:
        loader.load()
    assert str(caught.value).startswith(str(folder / name))


def test_directory_skips_bad_files_and_loads_the_others(folder: Path):
    loader = HomerDirectoryLoader(folder)
    docs = list(loader.lazy_load())
    names = [d.metadata["file_name"] for d in docs]
    assert names == ["a_story.txt", "b_notes.md", "c_page.html", "d_book.pdf", "h_more.txt"]
    assert sorted(e.path.name for e in loader.errors) == ["e_broken.pdf", "f_empty.txt"]
    assert all(str(e).startswith(str(folder)) for e in loader.errors)

    flat = HomerDirectoryLoader(folder, "*.txt", recursive=False).load()
    assert [d.metadata["file_name"] for d in flat] == ["a_story.txt"]


def test_directory_strict_mode_stops_at_the_first_bad_file(folder: Path):
    loaded: list[Document] = []
    with pytest.raises(DocumentError, match=r"e_broken\.pdf"):
        for doc in HomerDirectoryLoader(folder, strict=True).lazy_load():
            loaded.append(doc)
    assert [d.metadata["file_name"] for d in loaded] == ["a_story.txt", "b_notes.md", "c_page.html", "d_book.pdf"]


def test_a_missing_directory_is_an_error(tmp_path: Path):
    with pytest.raises(DocumentError, match="no such directory"):
        HomerDirectoryLoader(tmp_path / "nowhere").load()
