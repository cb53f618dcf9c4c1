"""Whole-document parsing on real files: text encodings, PDF (made with fpdf2), HTML, and every error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fpdf import FPDF

from homer_integrations.documents import (
    DocumentError,
    ParsedDocument,
    iter_documents,
    read_document,
)


def make_pdf(path: Path, pages: list[str], title: str | None = None) -> Path:
    """A real PDF with one text page per entry of ``pages``."""
    pdf = FPDF()
    if title:
        pdf.set_title(title)
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def test_plain_text_utf8(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("Élisabeth met Mr. Darcy at Netherfield.\r\nSecond line — with a dash.\n", encoding="utf-8")
    doc = read_document(path)
    assert isinstance(doc, ParsedDocument)
    assert doc.text == "Élisabeth met Mr. Darcy at Netherfield.\nSecond line — with a dash.\n"
    assert doc.metadata["source"] == str(path)
    assert doc.metadata["file_name"] == "notes.txt"
    assert doc.metadata["file_type"] == "text"
    assert doc.metadata["size_bytes"] == path.stat().st_size
    assert doc.metadata["encoding"] == "utf-8"
    assert doc.name == "notes.txt" and doc.source == str(path)


@pytest.mark.parametrize(
    ("suffix", "file_type"), [(".md", "markdown"), (".markdown", "markdown"), (".rst", "rst"), (".TXT", "text")]
)
def test_markup_suffixes(tmp_path: Path, suffix: str, file_type: str) -> None:
    path = tmp_path / f"readme{suffix}"
    path.write_text("# Title\n\nSome *markup* stays as written.\n", encoding="utf-8")
    doc = read_document(path)
    assert doc.text.startswith("# Title")
    assert doc.metadata["file_type"] == file_type


def test_text_encoding_fallbacks(tmp_path: Path) -> None:
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffcafé au lait".encode())
    assert read_document(bom).text == "café au lait"
    assert read_document(bom).metadata["encoding"] == "utf-8-sig"

    utf16 = tmp_path / "wide.txt"
    utf16.write_text("naïve résumé", encoding="utf-16")
    assert read_document(utf16).text == "naïve résumé"

    legacy = tmp_path / "legacy.txt"
    legacy.write_bytes("“Quoted” café".encode("cp1252"))
    doc = read_document(legacy)
    assert doc.text == "“Quoted” café"
    assert doc.metadata["encoding"] == "cp1252"


def test_pdf_pages_and_title(tmp_path: Path) -> None:
    path = make_pdf(
        tmp_path / "book.pdf",
        ["Chapter one. Elizabeth Bennet walks to Netherfield.", "Chapter two. Mr. Darcy writes a letter."],
        title="A Small Book",
    )
    doc = read_document(path)
    assert doc.metadata["file_type"] == "pdf"
    assert doc.metadata["pages"] == 2
    assert doc.metadata["title"] == "A Small Book"
    assert "Elizabeth Bennet walks to Netherfield" in doc.text
    assert "Mr. Darcy writes a letter" in doc.text
    assert doc.text.index("Chapter one") < doc.text.index("Chapter two")


def test_html_drops_script_style_keeps_title(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text(
        "<!DOCTYPE html><html><head><title>The  Page</title><style>p { color: red }</style>"
        "<script>var secret = 42;</script></head><body><!-- hidden note -->"
        "<h1>Heading</h1><p>Hello\n   <b>world</b>, spaced   out.</p><p>Line<br>break</p>"
        "<ul><li>one</li><li>two</li></ul><noscript>enable js</noscript></body></html>",
        encoding="utf-8",
    )
    doc = read_document(path)
    assert doc.metadata["title"] == "The Page"
    assert doc.metadata["file_type"] == "html"
    assert doc.text == "Heading\n\nHello world, spaced out.\n\nLine\nbreak\n\none\n\ntwo"
    for hidden in ("secret", "color", "hidden note", "enable js", "The Page"):
        assert hidden not in doc.text


def test_html_keeps_preformatted_text_and_reads_deep_nesting_in_linear_time(tmp_path: Path) -> None:
    """16,000 nested <div>s (192 KB) took 34 s: every tree edit walked to the tag's last descendant."""
    import time

    page = tmp_path / "pre.html"
    page.write_text("<div><pre>a   b\n  c</pre><p>x   <span>y</span></p></div>", encoding="utf-8")
    assert read_document(page).text == "a   b\nc\n\nx y"  # lines are stripped; spaces inside <pre> kept
    deep = tmp_path / "deep.html"
    deep.write_text("<div>x" * 16_000 + "</div>" * 16_000, encoding="utf-8")
    started = time.perf_counter()
    text = read_document(deep).text
    assert text.split() == ["x"] * 16_000
    assert time.perf_counter() - started < 15, "quadratic again (34 s before, about 1 s after, on two cores)"


def test_htm_suffix(tmp_path: Path) -> None:
    path = tmp_path / "old.htm"
    path.write_bytes("<html><body><p>caf\xe9</p></body></html>".encode("latin-1"))
    assert read_document(path).text == "café"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.txt", b"", "empty"),
        ("blank.md", b"  \n\t\n   ", "whitespace only"),
        ("nul.txt", b"hello\x00\x01\x02world" * 10, "binary"),
        ("noise.txt", bytes(range(1, 32)) * 20 + b"\x81\x8d", "binary"),
        ("empty.html", b"<html><head><title>t</title></head><body>  </body></html>", "no text"),
        ("nul.html", b"<html>\x00\x00</html>", "binary"),
        ("table.csv", b"a,b\n1,2\n", "unsupported file type '.csv'"),
        ("README", b"text", "unsupported file type '(no extension)'"),
        ("broken.pdf", b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\nthis is not a pdf body\n%%EOF", "broken PDF"),
        ("fake.pdf", b"just some text, no header", "not a PDF"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DocumentError) as info:
        read_document(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": ")
    assert reason in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)
    assert info.value.path == path


def test_truncated_pdf_is_broken(tmp_path: Path) -> None:
    good = make_pdf(tmp_path / "good.pdf", ["Some text on a page that is long enough to matter."])
    data = good.read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(DocumentError, match=r"cut\.pdf: (broken PDF|no extractable text)"):
        read_document(cut)


def test_pdf_without_text(tmp_path: Path) -> None:
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(10, 10, 50, 50)
    path = tmp_path / "drawing.pdf"
    pdf.output(str(path))
    with pytest.raises(DocumentError, match="no extractable text"):
        read_document(path)


def test_missing_directory_and_huge(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match=r"nowhere\.txt: no such file"):
        read_document(tmp_path / "nowhere.txt")
    folder = tmp_path / "folder.txt"
    folder.mkdir()
    with pytest.raises(DocumentError, match="is a directory"):
        read_document(folder)
    big = tmp_path / "big.txt"
    big.write_text("word " * 1000)
    with pytest.raises(DocumentError, match=r"big\.txt: file is 4\.9 KB, over the 1\.0 KB limit"):
        read_document(big, max_bytes=1024)
    assert read_document(big).text.startswith("word")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("hidden")
    path.chmod(0)
    try:
        with pytest.raises(DocumentError, match="cannot read"):
            read_document(path)
    finally:
        path.chmod(0o600)


def make_tree(root: Path) -> None:
    (root / "sub").mkdir()
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "b.md").write_text("# beta")
    (root / "c.txt").write_text("")  # empty: an error
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # not a document suffix: passed over
    (root / "sub" / "d.html").write_text("<p>delta</p>")
    (root / "sub" / "e.txt").write_bytes(b"\x00\x01binary")
    (root / ".hidden" / "f.txt").write_text("hidden")
    make_pdf(root / "sub" / "g.pdf", ["gamma page"])


def test_iter_documents_flat_and_recursive(tmp_path: Path) -> None:
    make_tree(tmp_path)
    flat = list(iter_documents(tmp_path))
    assert [r.path.name for r in flat] == ["a.txt", "b.md", "c.txt"]
    assert [r.ok for r in flat] == [True, True, False]
    assert flat[0].document is not None and flat[0].document.text == "alpha"
    assert flat[2].error is not None and "c.txt" in str(flat[2].error)

    deep = list(iter_documents(tmp_path, recursive=True))
    names = [r.path.name for r in deep]
    assert names == ["a.txt", "b.md", "c.txt", "d.html", "e.txt", "g.pdf"]
    texts = {r.path.name: r.document.text for r in deep if r.document is not None}
    assert texts == {"a.txt": "alpha", "b.md": "# beta", "d.html": "delta", "g.pdf": "gamma page"}
    assert {r.path.name for r in deep if not r.ok} == {"c.txt", "e.txt"}

    only_txt = [r.path.name for r in iter_documents(tmp_path, "*.txt", recursive=True, include_hidden=True)]
    assert only_txt == ["f.txt", "a.txt", "c.txt", "e.txt"]


def test_iter_documents_strict_stops_at_first_error(tmp_path: Path) -> None:
    make_tree(tmp_path)
    seen: list[str] = []
    with pytest.raises(DocumentError, match=r"c\.txt"):
        for result in iter_documents(tmp_path, strict=True):
            seen.append(result.path.name)
    assert seen == ["a.txt", "b.md"]


def test_iter_documents_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="no such directory"):
        list(iter_documents(tmp_path / "absent"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(DocumentError, match="not a directory"):
        list(iter_documents(tmp_path / "file.txt"))
