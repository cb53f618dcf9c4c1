"""``homer-qa serve`` and the ``ask`` client that hands its command line to it.

The server is the real ``CommandServer`` on 127.0.0.1 (a thread of the test process, over a tiny
random-weight model, or the real ``homer-qa serve`` console script over the embedded model); the
clients are real ``homer-qa`` processes, so what they import and print is what a user gets."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from homer_integrations import paths
from homer_integrations.cli import loading, remote, run_here, serve
from homer_integrations.cli.serve import CommandServer, announced
from tests.conftest import needs_dev_full
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


def announce(root: Path, url: str, *, token: str = "t", pid: int = 1, mode: int = 0o600, dir_mode: int = 0o700) -> Path:
    """``root/server.json`` naming ``url``, as a server writes it unless ``mode``/``dir_mode`` say otherwise."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(dir_mode)
    path = root / remote.STATE_FILE
    path.write_text(json.dumps({"url": url, "token": token, "pid": pid}))
    path.chmod(mode)
    return path


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
    server = CommandServer(("127.0.0.1", 0), functools.partial(serve._run_command, run_here))
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
    announce(root, server.url, token="guessed")
    refused = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
    assert refused.returncode == 1 and server.handled == 0
    assert "refused the request (401): wrong or missing token" in refused.stderr


def test_a_stale_announcement_falls_back_to_answering_here(tmp_path: Path, root: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    announce(root, f"http://127.0.0.1:{port}", pid=1)
    result = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
    assert result.returncode == 1
    assert f"no homer-qa server answers at http://127.0.0.1:{port} (pid 1); answering here" in result.stderr
    assert "missing.txt: no such file" in result.stderr  # answered (and refused) by this process


def test_a_second_server_is_refused_while_one_answers(
    capsys: pytest.CaptureFixture[str], server: CommandServer
) -> None:
    code, _, err = run_cli(capsys, "serve")
    assert code == 2 and f"already running at {server.url}" in err


def test_a_client_that_hangs_up_is_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """Each unauthenticated client that reset its connection printed socketserver's 25-line traceback
    (issue 82, item 13); other errors still reach it."""
    server = CommandServer(("127.0.0.1", 0), run_here)
    with server:
        for hung_up in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset by peer")):
            try:
                raise hung_up
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 5))
        assert capsys.readouterr().err == ""
        try:
            raise RuntimeError("a real fault")
        except RuntimeError:
            server.handle_error(None, ("127.0.0.1", 5))
        assert "a real fault" in capsys.readouterr().err


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
        [sys.executable, "-m", "homer_integrations.cli", "serve", "--model", "smollm2-135m-instruct"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        banner = serve.stdout.readline() if serve.stdout else ""
        assert banner.startswith("homer-qa server at http://127.0.0.1:"), serve.stderr.read() if serve.stderr else ""
        argv = ["ask", str(book), "-q", "Who has taken Netherfield Park?", "--max-new-tokens", "3", "--json"]
        argv += ["--model", "smollm2-135m-instruct", "--mode", "shared"]  # not the 1.5B default model
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


# ---------------------------------------------------------------------- forged and stale announcements (issue 63)
class Listener:
    """A program on a port of 127.0.0.1 that records every connection and answers in its own way:
    ``reset`` (RST), ``html`` (an HTTP 404 page), ``text`` (HTTP 200, not JSON), ``garbled`` (HTTP 200
    with the homer-qa header, not JSON), ``silent`` (reads, never answers), ``homer`` (a homer-qa
    server that prints ``lines`` lines and exits 0)."""

    def __init__(self, reply: str, lines: int = 0) -> None:
        self.reply, self.lines = reply, lines
        self.received: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            data = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            self.received.append(data)
            if self.reply == "silent":
                self._open.append(conn)
                continue
            with contextlib.suppress(OSError):
                conn.sendall(self._answer())
            if self.reply == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def _answer(self) -> bytes:
        header = f"{remote.SERVER_HEADER}: 1\r\n"
        if self.reply == "html":
            return b"HTTP/1.0 404 Not Found\r\nContent-Type: text/html\r\n\r\n<html>no</html>"
        if self.reply in ("text", "garbled"):
            return f"HTTP/1.0 200 OK\r\n{header if self.reply == 'garbled' else ''}\r\nnot json at all\n".encode()
        if self.reply == "homer":
            lines = [json.dumps({"stream": "stdout", "text": f"line {i}\n"}) for i in range(self.lines)]
            body = "\n".join([*lines, json.dumps({"exit": 0})]) + "\n"
            return f"HTTP/1.0 200 OK\r\n{header}\r\n{body}".encode()
        return b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() a close alone would leave blocked
        self.sock.close()
        for conn in self._open:
            conn.close()
        self._thread.join(timeout=5)


def _length(request: bytes) -> int:
    for line in request.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[Listener]:
    program = Listener(*getattr(request, "param", ("reset",)))
    yield program
    program.close()


def answered_here(code: int, stderr: str, says: str) -> None:
    """One warning line that says ``says``, then the command run here (and refused: no such file)."""
    lines = [line for line in stderr.splitlines() if not line.startswith("imported: ")]
    assert len(lines) == 2 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("homer-qa: warning: ") and says in lines[0] and lines[0].endswith("answering here")
    assert lines[1] == "homer-qa: error: missing.txt: no such file" and code == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("mode 666", "has mode 666"),
        ("mode 644", "has mode 644"),
        ("directory 777", "has mode 777: others can write it"),
        ("directory 775", "has mode 775: others can write it"),
        ("link", "a symbolic link, not a regular file"),
        ("fifo", "a FIFO, not a regular file"),
        ("remote host", "is not a server on this machine"),
        pytest.param(
            "owner",
            "belongs to user 65534",
            marks=pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown"),
        ),
    ],
)
def test_an_announcement_another_user_could_have_written_is_not_followed(
    root: Path, tmp_path: Path, listener: Listener, change: str, says: str
) -> None:
    """Nothing is sent to the listener it names: not the question, not the working directory."""
    url = listener.url.replace("127.0.0.1", "192.0.2.1") if change == "remote host" else listener.url
    path = announce(root, url, token="forged")
    if change.startswith("mode"):
        path.chmod(int(change.split()[1], 8))
    elif change.startswith("directory"):
        root.chmod(int(change.split()[1], 8))
    elif change == "owner":
        os.chown(path, 65534, 65534)
    elif change in ("link", "fifo"):
        trusted = tmp_path / "elsewhere.json"
        path.rename(trusted)
        path.symlink_to(trusted) if change == "link" else os.mkfifo(path, 0o600)
    if change in ("mode 666", "fifo"):  # a real client process
        result = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
        answered_here(result.returncode, result.stderr, says)
    else:
        answered_here(*run_cli_capturing(["ask", "missing.txt", "-q", "Why?"], tmp_path)[::2], says)
    assert listener.received == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("listener", "says"),
    [
        (("reset",), "is not a homer-qa server (ConnectionResetError"),
        (("html",), "without the X-Homer-QA-Server header"),
        (("text",), "without the X-Homer-QA-Server header"),
        (("garbled",), "its answer is not homer-qa output"),
        (("silent",), "is not a homer-qa server (TimeoutError"),
    ],
    indirect=["listener"],
)
def test_a_stale_announcement_whose_port_another_program_holds_falls_back(
    root: Path, tmp_path: Path, listener: Listener, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "RESPONSE_TIMEOUT", 0.5)  # the silent one: given up on in half a second
    announce(root, listener.url)
    if listener.reply == "reset":  # a real client process
        result = client(root, tmp_path, "ask", "missing.txt", "-q", "Why?")
        answered_here(result.returncode, result.stderr, says)
    else:  # in this process (the silent one: given up on after the shorter timeout)
        answered_here(*run_cli_capturing(["ask", "missing.txt", "-q", "Why?"], tmp_path)[::2], says)
    assert len(listener.received) == 1


def run_cli_capturing(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """``main(argv)`` in this process, in ``cwd``, with stdout and stderr captured."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from homer_integrations.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(before)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("redirect", "says"),
    [(">&-", "stdout is closed"), pytest.param("> /dev/full", "No space left", marks=needs_dev_full)],
)
@pytest.mark.parametrize("listener", [("homer", 2000)], indirect=True)
def test_a_served_answer_into_a_closed_or_full_stdout_is_one_line(
    root: Path, tmp_path: Path, listener: Listener, redirect: str, says: str
) -> None:
    announce(root, listener.url)
    env = {**os.environ, "HOMER_INTEGRATIONS_CACHE": str(root)}
    done = subprocess.run(
        ["sh", "-c", f'"$@" {redirect}', "sh", sys.executable, "-c", CLIENT, "ask", "d.txt", "-q", "Why?"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    lines = [line for line in done.stderr.splitlines() if not line.startswith("imported: ")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("homer-qa: error: cannot write the output: ") and says in lines[0]
    assert len(listener.received) == 1


def test_serve_refuses_to_announce_where_others_can_write(
    capsys: pytest.CaptureFixture[str], root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_parts", refuse)
    root.mkdir(parents=True)
    root.chmod(0o777)
    code, _, err = run_cli(capsys, "serve")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "chmod go-w" in err
    assert not (root / remote.STATE_FILE).exists()
