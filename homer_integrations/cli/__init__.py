"""``homer-qa``: ask questions about a whole long document from the command line.

    homer-qa ask book.txt -q "Who is Mr. Darcy?" -q "How does the story end?"
    homer-qa ask homer_integrations/data/prideprejudice.txt --demo
    homer-qa cache ls | info | clear | rm NAME_OR_KEY
    homer-qa calibrate --model smollm2-135m-instruct
    homer-qa compress docs/ --store s3://bucket/homer [--ray ADDRESS] [--workers N]
    homer-qa serve [--model NAME]     # later asks skip the imports and the model load

The document is compressed once (a progress bar shows tokens per second) and kept in the disk
cache, so a second run answers from disk. Problems with the input are one line on stderr and a
non-zero exit code, never a traceback: usage errors included, and output that cannot be written
(stdout closed, or a full disk behind it: ``Output``). One module per command (``ask``, ``cache``, ``calibrate``,
``compress``, ``serve``), each with ``add_parser`` and ``run``; what they share is in ``common``,
``options`` and ``loading``. Nothing heavy (torch, transformers) is imported until a command needs
it, and while a ``homer-qa serve`` runs, ``ask`` hands its command line to it (``remote``).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
import warnings
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from homer_integrations.cli import ask, cache, calibrate, compress, remote, serve
from homer_integrations.cli.ask import DEMO_QUESTIONS
from homer_integrations.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    MODES,
    CliError,
    configure_logging,
    error,
    show_warning,
)

# torch loads later (inside commands); idle OpenMP threads then yield the CPU instead of spinning,
# which on a busy machine made CPU inference several times slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["DEMO_QUESTIONS", "MODES", "CliError", "build_parser", "main", "run_here"]


class _Parser(ArgumentParser):
    """Usage errors as one line (``homer-qa: error: ...``), exit code 2, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"homer-qa: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> ArgumentParser:
    parser = _Parser(
        prog="homer-qa",
        description="Answer questions about whole long documents with a local model: HOMER compresses each "
        "document once into a short KV cache, every later question reuses it.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress (-v INFO, -vv DEBUG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (ask, cache, calibrate, compress, serve):
        command.add_parser(commands)
    parser.set_defaults(run_here=run_here)  # what ``serve`` runs for its clients (it cannot import it back)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``homer-qa`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    An ``ask`` goes to a running ``homer-qa serve`` when there is one (unless ``--no-server``).
    Output that cannot be written (``Output``) ends the command with one error line and code 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _open_standard_descriptors()
    real = sys.stdout
    out = sys.stdout = Output(real)
    try:
        try:
            code = _guarded(lambda: _main(argv))
        except SystemExit:  # argparse: --help, usage errors
            if not out.finish():
                raise SystemExit(EXIT_ERROR) from None
            raise
    finally:
        sys.stdout = real
    return code if out.finish() else EXIT_ERROR


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "ask" and not args.no_server and (server := remote.find_server()) is not None:
        code = _guarded(lambda: remote.forward(server, argv))
        if code is not None:
            return code
    return _run(args)


def run_here(argv: Sequence[str], commands: Sequence[str] | None = None) -> int:
    """Run ``homer-qa *argv`` in this process, never through a server (what ``serve`` runs);
    ``commands``: the only commands allowed (others are a usage error)."""
    args = build_parser().parse_args(list(argv))
    if commands is not None and args.command not in commands:
        error(f"this runs only {', '.join(commands)}, not {args.command}")
        return EXIT_USAGE
    return _run(args)


def _run(args: Namespace) -> int:
    """The parsed command, run in this process."""
    configure_logging(args.verbose)
    return _guarded(lambda: args.run(args))  # type: ignore[return-value] - every command returns its code


def _guarded(command: Callable[[], int | None]) -> int | None:
    """``command()``, with problems reported as one line and an exit code, never a traceback."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            return command()
    except CliError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `homer-qa ... | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return EXIT_OK


class OutputError(CliError):
    """stdout cannot be written: closed (``>&-``) or failing (``> /dev/full``)."""


class Output:
    """``sys.stdout`` while ``main`` runs: the real stream, where a failed write or flush (other than a
    closed pipe, which ends the command quietly) raises ``OutputError`` with the reason, once. (Not an
    ``io`` class: those close themselves, and so the real stream, when collected.)

    After a failure the stream's descriptor is pointed at ``/dev/null``, so nothing written later (nor
    the interpreter's last flush) fails again. ``None`` (stdout closed when the process started)
    fails every write with "stdout is closed"."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.failed = False
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")  # a file name that is not UTF-8 still prints

    def write(self, text: str) -> int:
        return self._checked(lambda: self._stream.write(text))

    def flush(self) -> None:
        if self._stream is not None and not getattr(self._stream, "closed", False):
            self._checked(self._stream.flush)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self._stream is None:
            raise io.UnsupportedOperation("stdout is closed")
        return self._stream.fileno()

    @property
    def closed(self) -> bool:
        return self._stream is None or bool(getattr(self._stream, "closed", False))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def finish(self) -> bool:
        """Flush what is left; False (the error reported) when that fails or a write failed before."""
        try:
            self.flush()
        except OutputError as exc:
            error(str(exc))
        return not self.failed

    def _checked(self, call: Callable[[], Any]) -> Any:
        if self.failed:
            return 0
        try:
            if self._stream is None:
                raise OSError(errno.EBADF, "stdout is closed")
            return call()
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = True
            self._silence()
            raise OutputError(f"cannot write the output: {exc.strerror or exc}") from None

    def _silence(self) -> None:
        with contextlib.suppress(AttributeError, OSError, ValueError, io.UnsupportedOperation):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)


def _open_standard_descriptors() -> None:
    """A closed descriptor 1 or 2 (``>&-``) becomes ``/dev/null``, so no file the command opens takes its
    number (and receives what a library prints); Python's ``sys.stdout`` stays None, which ``Output``
    reports, and a closed stderr loses its messages."""
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
