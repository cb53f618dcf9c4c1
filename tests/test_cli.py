"""``homer-qa`` end to end on real files: the embedded SmolLM2 model, a real disk cache, and its error paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from homer_integrations.cli import DEMO_QUESTIONS, loading, main, remote
from homer_integrations.paths import PACKAGE_DATA
from homer_integrations.question_sets import question_set
from tests.conftest import REPO
from tests.test_documents import make_pdf

SMOL_SHARED = ("--model", "smollm2-135m-instruct", "--mode", "shared")
"""What the real-model tests pin: the fast embedded model on the shared root (the defaults are the 1.5B
model and ``query_aware``)."""


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run ``ask`` in this process even if the developer has a ``homer-qa serve`` running
    (``tests/test_cli_serve.py`` tests the hand-over)."""
    monkeypatch.setattr(remote, "find_server", lambda: None)


@pytest.fixture(scope="module")
def passage(novel: str) -> str:
    """About 250 tokens from the start of chapter 1 (the Bennets and Netherfield)."""
    start = novel.index("It is a truth universally acknowledged")
    return novel[start : start + 1100]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ask_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run_cli(capsys, "ask", *argv, "--json", "--no-progress")
    assert code == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------- error paths (no model)
@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("missing.txt", None, "no such file"),
        ("empty.txt", b"", "empty"),
        ("blank.md", b"\n \n\t", "whitespace only"),
        ("binary.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00" * 50, "binary"),
        ("image.png", b"\x89PNG\r\n\x1a\n", "unsupported file type"),
        ("broken.pdf", b"%PDF-1.4\nnot really a pdf", "broken PDF"),
    ],
)
def test_bad_files_give_one_line_and_a_nonzero_exit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: bytes | None, reason: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    loads_before = loading.load_parts.cache_info().misses
    code, out, err = run_cli(capsys, "ask", str(path), "-q", "What is this?", "--cache-dir", str(tmp_path / "c"))
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"homer-qa: error: {path}: ") and reason in lines[0]
    assert loading.load_parts.cache_info().misses == loads_before, "bad input must fail before loading a model"


def test_a_directory_is_not_a_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "notes.txt"
    folder.mkdir()
    code, _, err = run_cli(capsys, "ask", str(folder), "-q", "Why?")
    assert code == 1 and "is a directory" in err and len(err.strip().splitlines()) == 1


def test_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "doc.txt"
    path.write_text("Some text.")
    code, _, err = run_cli(capsys, "ask", str(path))
    assert code == 2 and "-q QUESTION" in err
    code, _, err = run_cli(capsys, "ask", str(path), "-q", "   ")
    assert code == 2 and "empty" in err
    code, _, err = run_cli(capsys, "ask", str(path), "-q", "Why?", "--top-p", "0")
    assert code == 2 and "generation options" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", str(path), "--mode", "sideways"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["ask", str(path), "--max-new-tokens", "0"])


def test_the_console_script_reports_a_missing_file_without_a_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("homer-qa")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "homer_integrations.cli"]
    missing = tmp_path / "nowhere.pdf"
    done = subprocess.run([*command, "ask", str(missing), "-q", "Who?"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == f"homer-qa: error: {missing}: no such file"
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_cache_commands_on_an_empty_default_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path))
    code, out, _ = run_cli(capsys, "cache", "ls")
    assert code == 0 and out.strip() == f"no cached documents in {tmp_path / 'documents'}"
    code, out, _ = run_cli(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["directory"] == str(tmp_path / "documents") and info["disk_entries"] == 0
    code, out, _ = run_cli(capsys, "cache", "clear")
    assert code == 0 and out.startswith("removed 0 cached document(s)")
    code, _, err = run_cli(capsys, "cache", "rm")
    assert code == 1 and "cache rm needs the documents to remove" in err
    code, _, err = run_cli(capsys, "cache", "ls", "book.txt")
    assert code == 1 and "cache ls takes no documents" in err


# ----------------------------------------------------------------------------- modes (tiny model)
@pytest.fixture
def tiny_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer) -> list[str]:
    """``ask`` options for a tiny random-weight model (loaded in place of any named one) with the real
    SmolLM2 tokenizer; its calibration is kept under ``tmp_path``."""
    from tests.conftest import tiny_model

    parts = (tiny_model(), tokenizer)
    monkeypatch.setattr(loading, "load_parts", lambda name, dtype, device, quantize=None: parts)
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(tmp_path / "cache"))
    return ["--model", "tiny", "--max-chunk-len", "128", "--warmup-layers", "3", "--no-disk-cache"]


@pytest.mark.parametrize("mode", [None, "shared", "query_aware", "full"])
def test_mode_goes_with_every_question_and_the_summary_says_which_served(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str, tiny_cli: list[str], mode: str | None
) -> None:
    book = tmp_path / "chapter1.txt"
    book.write_text(passage, encoding="utf-8")
    questions = ["-q", "Who has taken Netherfield Park?", "-q", "What is Mrs. Bennet's wish?"]
    chosen = [] if mode is None else ["--mode", mode]
    result = ask_json(capsys, str(book), *questions, *tiny_cli, *chosen, "--max-new-tokens", "2")
    served = mode or "full"  # the engine's default, auto: the passage fits the window, so it is kept whole
    assert result["mode"] == served
    assert [a["mode"] for a in result["answers"]] == [served, served]
    assert [a["cache_source"] for a in result["answers"]] == ["computed", "memory"]
    first, second = result["answers"]
    assert first["document_seconds"] > 0 and second["document_seconds"] == 0
    assert result["cache"]["computations"] == 1, "one root, prefill or leaf tier for both questions"

    code, out, err = run_cli(capsys, "ask", str(book), *questions, *tiny_cli, *chosen, "--max-new-tokens", "2")
    assert code == 0, err
    lines = out.split("--- summary ---")[1].splitlines()
    assert f"{served} mode)" in lines[1]
    q1, q2 = (line for line in lines if line.startswith(("Q1:", "Q2:")))
    assert f"; {served} mode; " in q1 and f"; {served} mode; " in q2
    if served == "query_aware":
        assert q1.startswith("Q1: leaf tier built in") and q2.startswith("Q2: leaf tier found in memory")
    else:
        assert q1.startswith(f"Q1: {'prefilled' if served == 'full' else 'compressed'} in")
        assert q2.startswith("Q2: cache hit in memory")


def test_past_the_window_the_summary_says_passages_were_read_and_no_tier_built(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, novel: str, tiny_cli: list[str]
) -> None:
    book = tmp_path / "long.txt"
    book.write_text(novel[:16000], encoding="utf-8")  # about 3,600 tokens: past the tiny model's 2,048
    question = ["-q", "Who has taken Netherfield Park?", "--max-new-tokens", "2", "--max-chunk-len", "256"]
    tiny_cli = [*tiny_cli, *question]  # 256-token leaves: a merge tree that holds the document
    result = ask_json(capsys, str(book), *tiny_cli)
    (answer,) = result["answers"]
    assert answer["mode"] == "query_aware" and answer["reads_tier"] is False
    assert answer["document_tokens"] > 2048 and answer["document_seconds"] == 0
    code, out, err = run_cli(capsys, "ask", str(book), *tiny_cli)
    assert code == 0, err
    (q1,) = (line for line in out.split("--- summary ---")[1].splitlines() if line.startswith("Q1:"))
    assert q1.startswith("Q1: past the model's window: the passages BM25 ranks best re-read, no leaf tier;")


def test_split_content_keeps_its_own_leaf_tier(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str, tiny_cli: list[str]
) -> None:
    book = tmp_path / "chapter1.txt"
    book.write_text(passage, encoding="utf-8")
    on_disk = [a for a in tiny_cli if a != "--no-disk-cache"] + ["--cache-dir", str(tmp_path / "store")]
    common = [str(book), "-q", "Who has taken Netherfield Park?", *on_disk, "--mode", "query_aware"]
    common += ["--max-new-tokens", "1"]
    sources = [
        ask_json(capsys, *common, *split)["answers"][0]["cache_source"]
        for split in (["--split", "content"], [], ["--split", "content"], ["--split", "even"])
    ]
    assert sources == ["computed", "computed", "disk", "disk"], "each split its own tier, each kept on disk"
    store = ["--cache-dir", str(tmp_path / "store")]
    code, out, err = run_cli(capsys, "cache", "rm", "nothing-here", *store)
    assert code == 1 and "no cached document is named 'nothing-here'" in err
    code, out, _ = run_cli(capsys, "cache", "ls", *store, "--json")
    removed_names = {p.stem for p in (tmp_path / "store").glob("*.json")}
    code, out, err = run_cli(capsys, "cache", "rm", "chapter1.txt", *store, "--json")
    removed = json.loads(out)
    assert code == 0 and removed["removed"] == 2 and removed["leaves_removed"] >= 1, "both tiers, the leaves too"
    assert not list((tmp_path / "store").glob("*.safetensors")), "nothing of the document is left"
    locks = {p.stem for p in (tmp_path / "store" / "locks").glob("*.lock")}
    assert not locks & {e.removeprefix(".") for e in removed_names}, "their lock files went too (issue 82)"
    ask_json(capsys, *common, "--split", "content")
    code, out, err = run_cli(capsys, "cache", "clear", *store, "--json")
    cleared = json.loads(out)
    assert code == 0 and cleared["removed"] == 1 and cleared["leaves_removed"] >= 1, "leaves are not documents"
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", str(book), "-q", "Who?", "--split", "pages"])
    assert exit_info.value.code == 2 and "invalid choice: 'pages'" in capsys.readouterr().err


def test_how_the_cache_is_built_is_not_a_command_line_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the shared root's builder and the other research switches are a Recipe (homer.reading.strategies), not a flag
    book = tmp_path / "chapter1.txt"
    book.write_text("Some text.", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", str(book), "-q", "Who?", "--shared-root", "flat"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --shared-root" in capsys.readouterr().err


def test_an_unknown_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "doc.txt"
    path.write_text("Some text.")
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", str(path), "-q", "Why?", "--mode", "fast"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--mode: invalid choice: 'fast'" in err and "'shared', 'query_aware', 'full'" in err


# ----------------------------------------------------------------------------- the real model
@pytest.mark.real_model
def test_ask_compresses_once_then_answers_from_disk(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str
) -> None:
    book = tmp_path / "chapter1.txt"
    book.write_text(passage, encoding="utf-8")
    store = tmp_path / "store"
    questions = ["-q", "Who has taken Netherfield Park?", "-q", "What is Mrs. Bennet's wish?"]
    common = [str(book), *questions, "--cache-dir", str(store), "--max-new-tokens", "4", *SMOL_SHARED]

    first = ask_json(capsys, *common)
    assert [a["cache_source"] for a in first["answers"]] == ["computed", "memory"]
    assert first["model"] == "smollm2-135m-instruct" and first["mode"] == "shared"
    a1 = first["answers"][0]
    assert a1["document_tokens"] > 150 and a1["cache_tokens"] > 0 and a1["output_tokens"] >= 1
    assert a1["answer"] and a1["time_to_first_token"] >= a1["setup_seconds"] > 0
    assert first["cache"]["computations"] == 1 and first["cache"]["disk_entries"] == 1

    second = ask_json(capsys, *common)  # a new "process": new cache object over the same directory
    assert [a["cache_source"] for a in second["answers"]] == ["disk", "memory"]
    assert [a["answer"] for a in second["answers"]] == [a["answer"] for a in first["answers"]]
    assert second["cache"]["computations"] == 0 and second["cache"]["hits_disk"] == 1

    code, out, err = run_cli(capsys, "ask", *common, "--no-progress")
    assert code == 0, err
    assert "Q1: Who has taken Netherfield Park?\nA1: " in out and "Q2: What is Mrs. Bennet's wish?" in out
    assert "--- summary ---" in out and "cache tokens" in out
    assert "Q1: loaded from disk cache in" in out and "Q2: cache hit in memory" in out

    sampled = ["--temperature", "0.8", "--top-p", "0.9", "--top-k", "20", "--seed", "7", "--stop", "\n\n"]
    run = ask_json(capsys, *common[:3], "--cache-dir", str(store), "--max-new-tokens", "3", *SMOL_SHARED, *sampled)
    assert run["answers"][0]["cache_source"] == "disk" and 1 <= run["answers"][0]["output_tokens"] <= 3

    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(store))
    assert code == 0 and "chapter1.txt" in out and "1 document(s)" in out
    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(store), "--json")
    (entry,) = json.loads(out)
    assert entry["label"] == "chapter1.txt" and entry["document_tokens"] == a1["document_tokens"]
    code, out, _ = run_cli(capsys, "cache", "info", "--cache-dir", str(store))
    assert code == 0 and "entries: 1" in out
    code, out, _ = run_cli(capsys, "cache", "clear", "--cache-dir", str(store))
    assert code == 0 and out.startswith("removed 1 cached document(s)")
    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(store))
    assert code == 0 and out.startswith("no cached documents") and not list(store.glob("*.safetensors"))


@pytest.mark.real_model
@pytest.mark.parametrize("kind", ["md", "pdf", "html"])
def test_ask_reads_markdown_pdf_and_html(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str, kind: str
) -> None:
    body = passage[:500]
    if kind == "md":
        path = tmp_path / "chapter.md"
        path.write_text(f"# Chapter 1\n\n{body}\n", encoding="utf-8")
    elif kind == "pdf":
        path = make_pdf(tmp_path / "chapter.pdf", [body.replace("\u2019", "'")])
    else:
        path = tmp_path / "chapter.html"
        path.write_text(f"<html><head><title>Ch. 1</title><script>x()</script></head><body><p>{body}</p></body></html>")
    result = ask_json(
        capsys, str(path), "-q", "Who is Mr. Bennet?", "--no-disk-cache", "--max-new-tokens", "3", *SMOL_SHARED
    )
    (answer,) = result["answers"]
    assert answer["cache_source"] == "computed" and answer["output_tokens"] >= 1
    assert 80 < answer["document_tokens"] < 250
    assert result["cache_directory"] is None and result["cache"]["disk_entries"] == 0


@pytest.mark.real_model
def test_demo_asks_bundled_questions_the_excerpt_answers_and_checks_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    novel = PACKAGE_DATA / "prideprejudice.txt"
    argv = ("--demo", "--max-chars", "6000", "--no-disk-cache", "--max-new-tokens", "2", *SMOL_SHARED)
    result = ask_json(capsys, str(novel), *argv)
    answers = result["answers"]
    asked = question_set().within(result["characters"])
    assert 5000 <= result["characters"] <= 6000 and len(asked) > DEMO_QUESTIONS
    assert [a["question"] for a in answers] == [q.question for q in asked.spread(DEMO_QUESTIONS)]
    assert [a["cache_source"] for a in answers] == ["computed"] + ["memory"] * (DEMO_QUESTIONS - 1)
    by_text = {q.question: q for q in asked.questions}
    assert all(a["correct"] == by_text[a["question"]].check(a["answer"]) for a in answers)
    assert all(a["expected"] == by_text[a["question"]].expected() for a in answers)

    code, out, err = run_cli(capsys, "ask", str(novel), *argv, "--no-progress")
    assert code == 0, err
    assert out.count(": expected ") == DEMO_QUESTIONS and "answers hold the expected keywords" in out


def test_demo_refuses_a_document_without_bundled_questions(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str
) -> None:
    book = tmp_path / "book.txt"
    book.write_text("Some other story. " * 50, encoding="utf-8")
    code, out, err = run_cli(capsys, "ask", str(book), "--demo", "--no-disk-cache")
    assert code == 2 and out == ""
    assert "--demo asks the bundled questions" in err and "-q QUESTION" in err


@pytest.mark.real_model
def test_calibrate_reports_where_the_table_lives(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "calibrate", "--model", "smollm2-135m-instruct")
    assert code == 0, err
    assert "smollm2-135m-instruct" in out and "max_chunk_len=1024" in out
    path = Path(out.rsplit(": ", 1)[1].strip())
    assert path.is_file() and path.parent == PACKAGE_DATA / "calibration"


def test_the_cli_offers_every_engine_mode() -> None:
    from homer_integrations.cli import MODES
    from homer_integrations.homer.config import MODES as ENGINE_MODES

    assert MODES == ENGINE_MODES  # kept as a literal so the CLI starts without pydantic


@pytest.mark.parametrize(("command", "option"), [("ask", "--store"), ("ask", "--cache-dir"), ("compress", "--store")])
def test_an_empty_store_or_cache_directory_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, option: str
) -> None:
    """``--store ""`` silently used the default cache (issue 82, item 14)."""
    book = tmp_path / "b.txt"
    book.write_text("Some text.", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        main([command, str(book), option, " ", *(["-q", "Why?"] if command == "ask" else [])])
    assert exited.value.code == 2
    assert f"{option}: must not be empty" in capsys.readouterr().err.replace("argument ", "")


def test_no_path_steers_the_terminal_in_summaries(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str, tiny_cli: list[str]
) -> None:
    """A file name, and a cache directory, holding ESC/OSC/CR (issue 82, item 11)."""
    hostile = "\x1b]0;owned\x07\x1b[31mred\r"
    book = tmp_path / f"{hostile}.txt"
    book.write_text(passage, encoding="utf-8")
    code, out, err = run_cli(capsys, "ask", str(book), "-q", "Who?", *tiny_cli, "--max-new-tokens", "1")
    assert code == 0, err
    summary = out.split("--- summary ---")[1]
    assert "\x1b" not in summary and "\r" not in summary and r"\x1b]0;owned" in summary
    empty = tmp_path / f"{hostile}-cache"
    for action in ("ls", "clear"):
        code, out, err = run_cli(capsys, "cache", action, "--cache-dir", str(empty))
        assert code == 0 and "\x1b" not in out + err and "\r" not in out + err, (action, out, err)


def test_sources_are_listed_after_each_answer_and_kept_in_the_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, passage: str, tiny_cli: list[str]
) -> None:
    book = tmp_path / "chapter1.txt"
    book.write_text(passage, encoding="utf-8")
    asked = [str(book), "-q", "Who has taken Netherfield Park?", *tiny_cli, "--max-new-tokens", "2"]
    (answer,) = ask_json(capsys, *asked)["answers"]
    assert 1 <= len(answer["sources"]) <= 5
    assert all(0 <= s["start"] < s["end"] <= len(passage) and 0 < s["score"] <= 1 for s in answer["sources"])

    code, out, err = run_cli(capsys, "ask", *asked, "--sources")
    assert code == 0, err
    cited = [line.strip() for line in out.splitlines() if line.strip().startswith("[")]
    assert len(cited) == len(answer["sources"])
    first = answer["sources"][0]
    assert cited[0].startswith(f"[1] chars {first['start']:,}-{first['end']:,} (")
    assert " ".join(passage[first["start"] : first["end"]].split())[:40] in cited[0]
    code, out, _ = run_cli(capsys, "ask", *asked)
    assert "chars " not in out, "listed without --sources"
