"""``homer-qa serve`` and the ``ask`` client that hands its command line to it.

The server is the real ``CommandServer`` on 127.0.0.1 (a thread of the test process, over a tiny
random-weight model, or the real ``homer-qa serve`` console script over the embedded model); the
clients are real ``homer-qa`` processes, so what they import and print is what a user gets."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from homer_integrations import paths
from homer_integrations.cli import loading, remote, run_here, serve
from homer_integrations.cli.serve import CommandServer, announced
from tests.test_cli import run_cli

CLIENT = """
import sys
from homer_integrations.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(f"imported: {heavy}", file=sys.stderr)
sys.exit(code)
"""
"""A ``homer-qa`` process that also says whether it imported torch or transformers."""

SESSION_CACHE = paths.cache_root()
"""The suite's package cache (converted models, calibrations), read before a test moves the root."""

TINY = ["--model", "tiny", "--max-chunk-len", "128", "--warmup-layers", "3", "--no-disk-cache"]


def client(root: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOMER_INTEGRATIONS_CACHE": str(root)}
    return subprocess.run(
        [sys.executable, "-c", CLIENT, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("HOMER_INTEGRATIONS_CACHE", str(root))
    return root


@pytest.fixture
def server(root: Path, monkeypatch: pytest.MonkeyPatch, tokenizer) -> Iterator[CommandServer]:
    """A running server, announced in ``root/server.json``, whose commands load a tiny model."""
    from tests.conftest import tiny_model

    parts = (tiny_model(), tokenizer)
    monkeypatch.setattr(loading, "load_parts", lambda name, dtype, device, quantize=None: parts)
    server = CommandServer(("127.0.0.1", 0), serve._run_command)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    with server, announced(server):
        thread.start()
        yield server
        server.shutdown()
    thread.join(timeout=10)


@pytest.fixture
def book(tmp_path: Path, novel: str) -> Path:
    start = novel.index("It is a truth universally acknowledged")
    path = tmp_path / "chapter1.txt"
    path.write_text(novel[start : start + 1100], encoding="utf-8")
    return path


def test_ask_is_answered_by_the_server_as_a_local_run_answers_it_without_importing_torch(
    capsys: pytest.CaptureFixture[str], server: CommandServer, book: Path, root: Path
) -> None:
    questions = ["-q", "Who has taken Netherfield Park?", "-q", "What is Mrs. Bennet's wish?"]
    argv = ["ask", book.name, *questions, *TINY, "--max-new-tokens", "3", "--json", "--no-progress"]

    served = client(root, book.parent, *argv)  # a relative FILE: the server runs in the client's directory
    assert served.returncode == 0, served.stderr
    assert server.handled == 1
    assert "imported: []" in served.stderr, "the client only relays: no torch, no transformers"

    code, out, err = run_cli(capsys, *argv[:1], str(book), *argv[2:], "--no-server")
    assert code == 0, err
    assert server.handled == 1, "--no-server answers in this process"
    remote_answers = json.loads(served.stdout)["answers"]
    local_answers = json.loads(out)["answers"]
    assert [a["answer"] for a in remote_answers] == [a["answer"] for a in local_answers]
    assert [a["cache_source"] for a in remote_answers] == ["computed", "memory"]

    text = client(root, book.parent, *argv[:-2], "--no-progress")
    assert text.returncode == 0 and "Q1: Who has taken Netherfield Park?\nA1: " in text.stdout
    assert "--- summary ---" in text.stdout and server.handled == 2


def test_problems_in_a_served_command_come_back_as_one_line_and_its_exit_code(
    server: CommandServer, tmp_path: Path, root: Path
) -> None:
    missing = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
    assert missing.returncode == 1 and server.handled == 1
    assert missing.stderr.startswith("homer-qa: error: missing.txt: no such file")
    assert "Traceback" not in missing.stderr

    (tmp_path / "blank.md").write_text("\n \n")
    blank = client(root, tmp_path, "ask", "blank.md", "-q", "Why?")
    assert blank.returncode == 1 and "whitespace only" in blank.stderr and server.handled == 2

    usage = client(root, tmp_path, "ask", "blank.md")  # found by the client's own parser: never sent
    assert usage.returncode == 2 and "give at least one question" in usage.stderr and server.handled == 3


def test_a_wrong_token_is_refused(server: CommandServer, tmp_path: Path, root: Path) -> None:
    state = root / remote.STATE_FILE
    state.write_text(json.dumps({"url": server.url, "token": "guessed", "pid": os.getpid()}))
    refused = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
    assert refused.returncode == 1 and server.handled == 0
    assert "refused the request (401): wrong or missing token" in refused.stderr


def test_a_stale_announcement_falls_back_to_answering_here(tmp_path: Path, root: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root.mkdir(parents=True)
    (root / remote.STATE_FILE).write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "token": "t", "pid": 1}))
    result = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
    assert result.returncode == 1
    assert f"no homer-qa server answers at http://127.0.0.1:{port} (pid 1); answering here" in result.stderr
    assert "missing.txt: no such file" in result.stderr  # answered (and refused) by this process


def test_a_second_server_is_refused_while_one_answers(
    capsys: pytest.CaptureFixture[str], server: CommandServer
) -> None:
    code, _, err = run_cli(capsys, "serve")
    assert code == 2 and f"already running at {server.url}" in err


def test_the_announcement_is_private_and_removed_when_the_server_stops(root: Path) -> None:
    server = CommandServer(("127.0.0.1", 0), run_here)
    with server, announced(server) as path:
        assert remote.find_server() == server.address()
        assert path.stat().st_mode & 0o077 == 0, "the token is readable by its owner only"
    assert not path.exists() and remote.find_server() is None


@pytest.mark.real_model
def test_the_console_scripts_serve_and_ask_with_the_embedded_model(book: Path, root: Path, smol_parts) -> None:
    # a fresh root for the server's state, sharing the suite's converted model (converting it again from
    # its GGUF took most of this test's time)
    root.mkdir(parents=True, exist_ok=True)
    (root / "models").symlink_to(SESSION_CACHE / "models", target_is_directory=True)
    env = {**os.environ, "HOMER_INTEGRATIONS_CACHE": str(root)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "homer_integrations.cli", "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        banner = serve.stdout.readline() if serve.stdout else ""
        assert banner.startswith("homer-qa server at http://127.0.0.1:"), serve.stderr.read() if serve.stderr else ""
        argv = ["ask", str(book), "-q", "Who has taken Netherfield Park?", "--max-new-tokens", "3", "--json"]
        first = client(root, book.parent, *argv, "--cache-dir", str(root / "docs"))
        second = client(root, book.parent, *argv, "--cache-dir", str(root / "docs"))
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        assert "imported: []" in second.stderr
        a1, a2 = (json.loads(r.stdout)["answers"][0] for r in (first, second))
        assert (a1["cache_source"], a2["cache_source"]) == ("computed", "disk")
        assert a1["answer"] == a2["answer"] and a1["output_tokens"] >= 1
    finally:
        serve.send_signal(signal.SIGTERM)
        out, _ = serve.communicate(timeout=60)
    assert serve.returncode == 0 and "homer-qa server stopped" in out
    assert not (root / remote.STATE_FILE).exists()


def test_serve_reports_a_busy_port_and_a_missing_model_in_one_line(
    capsys: pytest.CaptureFixture[str], root: Path, tmp_path: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, _, err = run_cli(capsys, "serve", "--port", str(busy.getsockname()[1]))
    assert code == 1 and err.startswith("homer-qa: error: cannot listen on 127.0.0.1:") and "Traceback" not in err
    code, _, err = run_cli(capsys, "serve", "--model", str(tmp_path / "no-such-model"))
    assert code == 1 and "no-such-model" in err and len(err.strip().splitlines()) == 1
    assert not (root / remote.STATE_FILE).exists(), "nothing is announced when the server cannot start"


def test_the_server_runs_only_ask(server: CommandServer, tmp_path: Path) -> None:
    """A nested ``serve`` (or ``cache clear``) sent with the token is refused, never run."""
    events = []
    for argv in (["serve"], ["cache", "clear"]):
        connection = http.client.HTTPConnection(*server.address().host_port, timeout=30)
        body = json.dumps({"argv": argv, "cwd": str(tmp_path)})
        connection.request("POST", "/v1/run", body=body, headers={"Authorization": f"Bearer {server.token}"})
        events.append([json.loads(line) for line in connection.getresponse()])
        connection.close()
    for got, command in zip(events, ("serve", "cache"), strict=True):
        assert got[-1] == {"exit": 2}
        assert f"runs only ask, not {command}" in "".join(e.get("text", "") for e in got)
