"""``homer-qa`` under hostile options, environment, stores and output redirection (issue 63).

Every problem is one line on stderr and a non-zero exit, never a traceback: a manifest label full of
terminal escapes, an S3 store without credentials, an unknown protocol, a port out of range, a
closed or full stdout, a question that is not valid text. Commands run in this process (``main``)
unless the point is the process itself: ``--help`` into a closed and a full stdout runs the real
console entry point (it imports no torch, so it is cheap).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from homer_integrations.cache.entry import FORMAT_VERSION, MANIFEST_FORMAT
from homer_integrations.cli import loading, main, remote
from tests.conftest import needs_dev_full


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "find_server", lambda *a, **k: None)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: every case here must be refused before one loads."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_parts", refuse)


def one_line(err: str, kind: str = "error") -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"homer-qa: {kind}: ") and "Traceback" not in err, err
    return lines[0]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def document(tmp_path: Path) -> Path:
    path = tmp_path / "d.txt"
    path.write_text("The meeting is on Tuesday in room 42. " * 130)  # about 5,000 characters
    return path


# ----------------------------------------------------------------------------- labels (defect 7)
def test_cache_ls_never_prints_a_terminal_escape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": FORMAT_VERSION,
        "key": "\x1b[2J" + "a" * 60,
        "label": "\x1b]0;owned\x07\x1b[31mred\u202eevil\udcff.txt\r\n",
        "nbytes": 1,
        "tokens": 1,
        "document_tokens": 1,
        "created": time.time(),
    }
    (directory / f"{'a' * 64}.json").write_text(json.dumps(manifest))
    code, out, err = run(capsys, "cache", "ls", "--cache-dir", str(directory))
    assert code == 0 and err == ""
    assert not any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c in "\u202e" for c in out), repr(out)
    assert r"\x1b]0;owned\x07\x1b[31mred\u202eevil\udcff.txt\r\n" in out
    assert r"\x1b[2Jaaaa" in out
    code, out, _ = run(capsys, "cache", "ls", "--json", "--cache-dir", str(directory))
    assert code == 0 and json.loads(out)[0]["label"] == manifest["label"], "JSON keeps the label exactly (escaped)"


# ----------------------------------------------------------------------------- stores (defects 8, 10)
@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """An environment with no AWS credentials anywhere (and no network to look for them on)."""
    import s3fs

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    missing = str(tmp_path / "no-such-file")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", missing)
    monkeypatch.setenv("AWS_CONFIG_FILE", missing)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made under another test's credentials
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.parametrize("command", [["cache", "ls"], ["cache", "info"], ["cache", "clear"], ["ask"], ["compress"]])
def test_an_s3_store_without_credentials_is_one_line(
    capsys: pytest.CaptureFixture[str], no_credentials: None, no_model: None, document: Path, command: list[str]
) -> None:
    with_file = {"ask": ["ask", str(document), "-q", "When?"], "compress": ["compress", str(document)]}
    argv = with_file.get(command[0], command)
    code, out, err = run(capsys, *argv, "--store", "s3://homer-bucket/docs")
    line = one_line(err)
    assert code == 1 and out == ""
    assert "--store s3://homer-bucket/docs" in line and "credentials" in line


def test_an_unknown_protocol_is_reported_against_store(capsys: pytest.CaptureFixture[str], no_model: None) -> None:
    code, _, err = run(capsys, "cache", "ls", "--store", "banana://x")
    line = one_line(err)
    assert code == 2 and line.startswith("homer-qa: error: --store banana://x: ") and "banana" in line
    assert "--max-bytes" not in line
    code, _, err = run(capsys, "cache", "ls", "--store", "memory://x", "--max-bytes", "1MB")
    assert code == 2 and one_line(err).startswith("homer-qa: error: --max-bytes: ")


# ----------------------------------------------------------------------------- serve (defect 11)
@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_a_port_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str], no_model: None, port: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", port])
    assert exited.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert "--port" in line and "65535" in line


# ----------------------------------------------------------------------------- output redirection (defect 12)
CONSOLE = [sys.executable, "-c", "import sys; from homer_integrations.cli import main; sys.exit(main())"]


def test_cache_ls_into_a_reader_that_stopped_is_silent_as_ask_is(tmp_path: Path) -> None:
    """``cache ls | head -c 0`` printed "Broken pipe" (issue 82, cosmetic)."""
    env = {**os.environ, "HOMER_INTEGRATIONS_CACHE": str(tmp_path)}
    listing = subprocess.Popen(
        [*CONSOLE, "cache", "ls", "--cache-dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    listing.stdout.close()  # the reader is gone before anything is written
    err = listing.stderr.read().decode()
    assert listing.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize(
    ("redirect", "says"),
    [(">&-", "stdout is closed"), pytest.param("> /dev/full", "No space left", marks=needs_dev_full)],
)
def test_help_into_a_closed_or_full_stdout_is_one_line(redirect: str, says: str) -> None:
    command = " ".join(f"'{part}'" for part in CONSOLE)
    done = subprocess.run(["sh", "-c", f"{command} --help {redirect}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert says in one_line(done.stderr)


@needs_dev_full
@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_cache_ls_into_a_closed_or_full_stdout_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stdout: str
) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    saved = sys.stdout
    with open("/dev/full", "w") as full:
        sys.stdout = None if stdout == "closed" else full
        try:
            code = main(["cache", "ls", "--cache-dir", str(directory)])
        finally:
            sys.stdout = saved
    err = capsys.readouterr().err
    assert code == 1
    assert ("stdout is closed" if stdout == "closed" else "No space left") in one_line(err)


# ----------------------------------------------------------------------------- questions (defect 15, CLI side)
def test_a_question_that_is_not_valid_text_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], no_model: None, document: Path
) -> None:
    question = os.fsdecode(b"Who is \xff?")  # what Python makes of invalid UTF-8 in argv
    code, out, err = run(capsys, "ask", str(document), "-q", question, "--no-disk-cache")
    assert code == 2 and out == ""
    assert "not valid UTF-8" in one_line(err)


@pytest.mark.parametrize("config", ['{"model_type": "llama", "hidden_size": -1}', '{"model_type": "llama", "num'])
def test_a_model_directory_with_an_invalid_config_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Path, config: str
) -> None:
    """A config.json whose values contradict each other printed a 40-line traceback (issue 82, item 7)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config, encoding="utf-8")
    code, _, err = run(capsys, "ask", str(document), "-q", "When?", "--model", str(model), "--no-disk-cache")
    assert code == 1 and "cannot load model" in one_line(err)
