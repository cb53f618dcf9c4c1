"""``homer-qa serve``: keep torch, transformers and the model loaded for every later ``homer-qa ask``.

A ``homer-qa ask`` in a fresh process spends seconds importing torch and transformers and loading
weights before it reads a cached document. ``serve`` pays that once: it listens on 127.0.0.1 and
announces itself in ``<cache root>/server.json`` (``remote.state_path``), and from then on every
``homer-qa ask`` started with the same cache root sends its command line here (``remote.forward``)
and prints what comes back, the way ``ollama run`` talks to ``ollama serve``. Commands run one at
a time (one model, one set of CPU cores) with the client's working directory, so the output is
exactly what the same command prints when run alone; weights stay loaded between commands
(``loading.load_parts``), while the document cache is opened per command as a standalone run
opens it, so ``cache clear`` and ``--cache-dir`` mean the same thing either way.

The standard library's HTTP server is enough here: one local client at a time, a JSON body in and
a stream of JSON lines out (wire format in ``remote``), no routing or TLS to speak of.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import logging
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from homer_integrations.cli import loading, options, remote
from homer_integrations.cli.common import EXIT_OK, EXIT_USAGE, CliError, configure_logging, error

logger = logging.getLogger("homer_integrations.server")
MAX_REQUEST_BYTES = 1 << 20
"""A command line is small; anything larger is refused before it is read."""


def add_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="keep the model loaded so that every later 'homer-qa ask' answers without start-up time",
        description="Listen on 127.0.0.1 and answer every 'homer-qa ask' started with the same cache root, "
        "without its start-up time. The model given here is loaded first; an ask naming another model or "
        "dtype loads that one on first use (the two most recent stay loaded). Ctrl-C or SIGTERM stops it.",
    )
    serve.set_defaults(run=run)
    serve.add_argument("--port", type=options.port_number, default=0, help="TCP port (default: any free one)")
    options.model_options(serve)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; the model named by ``--model`` (default: the embedded one) is loaded first."""
    from homer_integrations.engine.loading import DEFAULT_MODEL

    running = remote.find_server(quiet=True)  # an announcement no client trusts is replaced below
    if running is not None and remote.listening(running):
        raise CliError(f"a homer-qa server is already running at {running.url} (pid {running.pid})", EXIT_USAGE)
    remote.check_private_directory(remote.state_path().parent)  # else no client would trust the announcement
    try:
        server = CommandServer(("127.0.0.1", args.port), functools.partial(_run_command, args.run_here), args.verbose)
    except (OSError, OverflowError) as exc:
        raise CliError(f"cannot listen on 127.0.0.1:{args.port}: {exc}") from None
    with server:
        loading.parts(args)  # loaded before the server is announced: the first ask finds it ready
        name = args.model or DEFAULT_MODEL
        with announced(server), _stopped_by_sigterm():
            print(f"homer-qa server at {server.url} (pid {os.getpid()}), model {name}; Ctrl-C stops it", flush=True)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                print("homer-qa server stopped", flush=True)
    return EXIT_OK


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM (``kill``, service managers) stops the server like Ctrl-C, so ``server.json`` is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _run_command(run_here: Callable[..., int], argv: list[str]) -> int:
    """An ``ask`` sent by a client, run by ``run_here`` (``cli.run_here``); anything else, a nested
    ``serve`` say, is refused."""
    return run_here(argv, commands=("ask",))


class CommandServer(ThreadingHTTPServer):
    """Runs ``homer-qa`` command lines sent by ``remote.forward``, one at a time, under a random token.

    ``run_command(argv) -> exit code`` runs with stdout/stderr relayed to the client; ``handled``
    counts the commands run; ``verbose`` is the server's own ``-v`` level."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], run_command: Callable[[list[str]], int], verbose: int = 0) -> None:
        super().__init__(address, _Handler)
        self.run_command = run_command
        self.verbose = verbose
        self.token = secrets.token_urlsafe(32)
        self.lock = threading.Lock()
        self.handled = 0

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def address(self) -> remote.ServerAddress:
        return remote.ServerAddress(url=self.url, token=self.token, pid=os.getpid())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset, closed) is one debug line, not socketserver's traceback on stderr:
        any local user could flood the log with connections reset before the refusal is written."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            logger.debug("client %s hung up: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


@contextlib.contextmanager
def announced(server: CommandServer) -> Iterator[Path]:
    """``server.json`` names ``server`` (owner-readable only, in a directory only its owner can write:
    what clients trust, see ``remote``) while the block runs."""
    path = remote.state_path()
    remote.check_private_directory(path.parent)
    address = server.address()
    state = json.dumps({"url": address.url, "token": address.token, "pid": address.pid})
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)  # a leftover of a server with this pid: made afresh, never followed
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(state)
    os.replace(partial, path)
    try:
        yield path
    finally:
        if remote.find_server(quiet=True) == address:  # a later server may have taken the file over
            path.unlink(missing_ok=True)


class _Handler(BaseHTTPRequestHandler):
    server: CommandServer

    def do_POST(self) -> None:
        if self.path != "/v1/run":
            return self._refuse(HTTPStatus.NOT_FOUND, "only POST /v1/run")
        expected = f"Bearer {self.server.token}"
        if not secrets.compare_digest(self.headers.get("Authorization", ""), expected):
            return self._refuse(HTTPStatus.UNAUTHORIZED, "wrong or missing token (see server.json)")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_REQUEST_BYTES:
            return self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a request body of 1..{MAX_REQUEST_BYTES} bytes")
        try:
            request = json.loads(self.rfile.read(length))
            argv, cwd, tty = list(map(str, request["argv"])), str(request["cwd"]), request.get("tty", {})
        except (ValueError, KeyError, TypeError):
            return self._refuse(HTTPStatus.BAD_REQUEST, 'expected JSON {"argv": [...], "cwd": "..."}')
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header(remote.SERVER_HEADER, "1")
        self.end_headers()
        with self.server.lock:
            code = self._run(argv, cwd, tty)
            self.server.handled += 1
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps({"exit": code}).encode() + b"\n")

    def _run(self, argv: list[str], cwd: str, tty: dict[str, bool]) -> int:
        out = _Relay(self.wfile, "stdout", bool(tty.get("stdout")))
        err = _Relay(self.wfile, "stderr", bool(tty.get("stderr")))
        logger.info("running homer-qa %s (in %s)", " ".join(argv), cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    with _working_directory(cwd):
                        return self.server.run_command(argv)
                except CliError as exc:
                    error(str(exc))
                    return exc.exit_code
                except SystemExit as exc:  # argparse's usage errors
                    return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        finally:
            configure_logging(self.server.verbose)  # the command pointed the CLI's log handler at the relay

    def _refuse(self, status: HTTPStatus, message: str) -> None:
        body = message.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header(remote.SERVER_HEADER, "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class _Relay(io.TextIOBase):
    """A text stream whose writes go to the client as ``{"stream": name, "text": ...}`` lines."""

    def __init__(self, wfile: io.BufferedIOBase, name: str, tty: bool) -> None:
        self._wfile, self._name, self._tty = wfile, name, tty

    def write(self, text: str) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed relay")
        try:
            self._wfile.write(json.dumps({"stream": self._name, "text": text}).encode() + b"\n")
            self._wfile.flush()
        except (ConnectionError, OSError) as exc:  # the client went away (Ctrl-C): stop the command
            raise BrokenPipeError(str(exc)) from None
        return len(text)

    def isatty(self) -> bool:  # progress bars show when the client's terminal would show them
        return self._tty

    def writable(self) -> bool:
        return True


@contextlib.contextmanager
def _working_directory(path: str) -> Iterator[None]:
    """Relative paths in the command mean what they mean in the client's shell (commands run one at a time)."""
    before = os.getcwd()
    try:
        os.chdir(path)
    except OSError as exc:
        raise CliError(f"the server cannot enter the client's working directory {path}: {exc}") from None
    try:
        yield
    finally:
        os.chdir(before)
