"""The thin client side of ``homer-qa serve``: find a running server and let it run an ``ask``.

A server announces itself in ``server.json`` under the package's cache root (its URL, a random
token and its pid; readable by its owner only). ``homer-qa ask`` sends its own command line, the
working directory and its terminal facts there and relays what comes back, so the answer is the
one the same command would print here, without importing torch or loading a model. Only the
standard library is imported: this module is what makes a warm ``ask`` start in a fraction of a
second.

The wire format is one HTTP request (``POST /v1/run``, ``Authorization: Bearer TOKEN``, JSON body
``{"argv": [...], "cwd": str, "tty": {"stdout": bool, "stderr": bool}}``) answered by a stream
of JSON lines: ``{"stream": "stdout" | "stderr", "text": str}`` while the command runs, then
``{"exit": int}``. Every answer of the server carries the header ``X-Homer-QA-Server``.

The client sends its command line and working directory only where the announcement can only have
come from its own user: ``server.json`` must be a regular file (not a link, not a FIFO) owned by
the current user with no group or other permission bits, in a directory that user owns and nobody
else may write, naming a URL on this machine; it is read without following a link or blocking.
Otherwise the command runs here, after one warning line that says why. A program that is not a
homer-qa server at the announced address (a stale ``server.json`` whose port another program now
holds: it resets the connection, answers something else or nothing) gets the same treatment: one
line, then the command runs here.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from homer_integrations.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError, show_warning
from homer_integrations.paths import not_private

STATE_FILE = "server.json"
CONNECT_TIMEOUT = 2.0
"""Seconds to reach the server; once connected, an answer may take as long as a compression."""
RESPONSE_TIMEOUT = 10.0
"""Seconds for the server's first answer: it sends its headers before the command runs, so only a
program that is not a homer-qa server (a stale port taken over) stays silent this long."""
SERVER_HEADER = "X-Homer-QA-Server"
MAX_STATE_BYTES = 1 << 16
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class Untrusted(Exception):
    """Why ``server.json`` is not followed (the message completes "not using it: ...")."""


def state_path() -> Path:
    """Where a running server writes its address: ``<cache root>/server.json``."""
    from homer_integrations.paths import cache_root

    return cache_root() / STATE_FILE


@dataclass(frozen=True)
class ServerAddress:
    """A server's ``url`` (``http://host:port``), its ``token`` and ``pid``."""

    url: str
    token: str
    pid: int

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 80


def find_server(*, quiet: bool = False) -> ServerAddress | None:
    """The server ``server.json`` announces, or None when there is none, or when it cannot be trusted
    or read (then, unless ``quiet``, one warning line says why)."""
    path = state_path()
    try:
        state = json.loads(_read_private(path))
        address = ServerAddress(url=str(state["url"]), token=str(state["token"]), pid=int(state["pid"]))
        host, _ = address.host_port  # a port out of range raises ValueError
        if urlsplit(address.url).scheme != "http" or host not in LOOPBACK:
            raise Untrusted(f"{address.url} is not a server on this machine")
        return address
    except FileNotFoundError:
        return None
    except (Untrusted, OSError, ValueError, KeyError, TypeError) as exc:
        if not quiet:
            why = exc if isinstance(exc, Untrusted | OSError) else "it is not a homer-qa server announcement"
            show_warning(f"not using the homer-qa server announced in {path}: {why}; answering here", Warning)
        return None


def check_private_directory(path: Path) -> None:
    """Make ``path`` (only its last part private, 0700) if missing; ``CliError`` unless it is a
    directory of this user that nobody else can write, where clients trust an announcement."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = _unsafe_directory(os.stat(path))
    except OSError as exc:
        raise CliError(f"cannot announce the server in {path}: {exc}") from None
    if why:
        raise CliError(
            f"clients trust a server announced only in a directory only you can write, and {path} {why} "
            f"(chmod go-w it, or set HOMER_INTEGRATIONS_CACHE to a private directory)",
            EXIT_USAGE,
        )


def _read_private(path: Path) -> bytes:
    """The bytes of ``path`` if it can only have been written by this user (module docstring);
    ``FileNotFoundError`` when absent, ``Untrusted`` with the reason otherwise."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"it is {_kind(st.st_mode)}, not a regular file")
    why = not_private(st, "a server writes it 600")
    if why:
        raise Untrusted(f"it {why}")
    why = _unsafe_directory(os.stat(path.parent))
    if why:
        raise Untrusted(f"its directory {path.parent} {why}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not_private(now, "a server writes it 600"):
            raise Untrusted("it was replaced while it was read")
        data = os.read(fd, MAX_STATE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_STATE_BYTES:
        raise Untrusted(f"it is larger than {MAX_STATE_BYTES:,} bytes")
    return data


def _unsafe_directory(st: os.stat_result) -> str | None:
    """Why a directory of ``st`` is not one only this user can write, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not hasattr(os, "getuid"):
        return None
    if st.st_uid != os.getuid():
        return f"belongs to user {st.st_uid}, not to you (user {os.getuid()})"
    if st.st_mode & 0o022:
        return f"has mode {stat.S_IMODE(st.st_mode):o}: others can write it"
    return None


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def listening(server: ServerAddress) -> bool:
    """Whether something accepts connections at ``server``'s address."""
    import socket

    try:
        socket.create_connection(server.host_port, timeout=CONNECT_TIMEOUT).close()
        return True
    except OSError:
        return False


def forward(server: ServerAddress, argv: list[str]) -> int | None:
    """Run ``homer-qa *argv`` on ``server``, relaying its output here; its exit code.

    None when no homer-qa server answers at the announced address (one that exited without removing
    ``server.json``, and perhaps another program on its port since): the caller then runs the command
    itself, after the one line said here."""
    host, port = server.host_port
    body = json.dumps(
        {
            "argv": argv,
            "cwd": os.getcwd(),
            "tty": {"stdout": sys.stdout.isatty(), "stderr": sys.stderr.isatty()},
        }
    ).encode("utf-8")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"}
    connection = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)
    try:
        try:
            connection.request("POST", "/v1/run", body=body, headers=headers)
            sock = connection.sock
            sock.settimeout(RESPONSE_TIMEOUT)
            response = connection.getresponse()
            sock.settimeout(None)  # compressing a long document can take minutes
        except ConnectionRefusedError:
            show_warning(f"no homer-qa server answers at {server.url} (pid {server.pid}); answering here", Warning)
            return None
        except (OSError, http.client.HTTPException) as exc:
            return _not_a_server(server, f"{type(exc).__name__}: {exc}")
        if response.getheader(SERVER_HEADER) is None:
            return _not_a_server(server, f"it answered HTTP {response.status} without the {SERVER_HEADER} header")
        if response.status != 200:
            detail = response.read(4096).decode("utf-8", "replace").strip()
            raise CliError(f"the homer-qa server at {server.url} refused the request ({response.status}): {detail}")
        return _relay(response, server)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # closing the connection stops the server's command at its next output
    finally:
        connection.close()


def _not_a_server(server: ServerAddress, why: str) -> None:
    show_warning(
        f"what listens at {server.url} (announced by pid {server.pid}) is not a homer-qa server ({why}); "
        f"answering here",
        Warning,
    )


def _relay(response: http.client.HTTPResponse, server: ServerAddress) -> int | None:
    """Write the streamed output to stdout/stderr; the exit code the stream ends with. None (the
    command then runs here) when the stream fails or is not homer-qa's before anything was written."""
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    relayed = False
    lines = iter(response)
    while True:
        try:
            raw = next(lines, None)
        except (OSError, http.client.HTTPException) as exc:
            if not relayed:
                return _not_a_server(server, f"{type(exc).__name__}: {exc}")
            raise CliError(f"the connection to the homer-qa server at {server.url} failed: {exc}") from None
        if raw is None:
            break
        try:
            event = json.loads(raw)
            if "exit" in event:
                return int(event["exit"])
            out, text = streams[event["stream"]], event["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
        except (ValueError, KeyError, TypeError) as exc:
            if not relayed:
                return _not_a_server(server, f"its answer is not homer-qa output: {exc}")
            raise CliError(f"the homer-qa server at {server.url} sent a malformed answer: {exc}") from None
        out.write(text)
        out.flush()
        relayed = True
    if not relayed:
        return _not_a_server(server, "it closed the connection without an answer")
    raise CliError(f"the homer-qa server at {server.url} closed the connection before the command ended", EXIT_ERROR)
