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
``{"exit": int}``.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from homer_integrations.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, CliError, show_warning

STATE_FILE = "server.json"
CONNECT_TIMEOUT = 2.0
"""Seconds to reach the server; once connected, an answer may take as long as a compression."""


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


def find_server() -> ServerAddress | None:
    """The server ``server.json`` announces, or None when there is none (or it is unreadable)."""
    try:
        state = json.loads(state_path().read_text(encoding="utf-8"))
        return ServerAddress(url=str(state["url"]), token=str(state["token"]), pid=int(state["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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

    None when nothing answers at the announced address (a server that exited without removing
    ``server.json``): the caller then runs the command itself."""
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
        except ConnectionRefusedError:
            show_warning(f"no homer-qa server answers at {server.url} (pid {server.pid}); answering here", Warning)
            return None
        connection.sock.settimeout(None)  # compressing a long document can take minutes
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read().decode("utf-8", "replace").strip()
            raise CliError(f"the homer-qa server at {server.url} refused the request ({response.status}): {detail}")
        return _relay(response, server)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # closing the connection stops the server's command at its next output
    finally:
        connection.close()


def _relay(response: http.client.HTTPResponse, server: ServerAddress) -> int:
    """Write the streamed output to stdout/stderr; the exit code the stream ends with."""
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    for raw in response:
        event: dict[str, Any] = json.loads(raw)
        if "exit" in event:
            return int(event["exit"])
        out = streams[event["stream"]]
        out.write(event["text"])
        out.flush()
    raise CliError(f"the homer-qa server at {server.url} closed the connection before the command ended", EXIT_ERROR)
