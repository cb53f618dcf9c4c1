"""``homer-qa``: ask questions about a whole long document from the command line.

    homer-qa ask book.txt -q "Who is Mr. Darcy?" -q "How does the story end?"
    homer-qa ask homer_integrations/data/prideprejudice.txt --demo
    homer-qa cache ls | info | clear
    homer-qa calibrate --model smollm2-135m-instruct
    homer-qa compress docs/ --store s3://bucket/homer [--ray ADDRESS] [--workers N]
    homer-qa serve [--model NAME]     # later asks skip the imports and the model load

The document is compressed once (a progress bar shows tokens per second) and kept in the disk
cache, so a second run answers from disk. Problems with the input are one line on stderr and a
non-zero exit code, never a traceback. One module per command (``ask``, ``cache``, ``calibrate``,
``compress``, ``serve``), each with ``add_parser`` and ``run``; what they share is in ``common``,
``options`` and ``loading``. Nothing heavy (torch, transformers) is imported until a command needs
it, and while a ``homer-qa serve`` runs, ``ask`` hands its command line to it (``remote``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Sequence

from homer_integrations.cli import ask, cache, calibrate, compress, remote, serve
from homer_integrations.cli.ask import DEMO_QUESTIONS
from homer_integrations.cli.common import (
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


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="homer-qa",
        description="Answer questions about whole long documents with a local model: HOMER compresses each "
        "document once into a short KV cache, every later question reuses it.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress (-v INFO, -vv DEBUG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (ask, cache, calibrate, compress, serve):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``homer-qa`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    An ``ask`` goes to a running ``homer-qa serve`` when there is one (unless ``--no-server``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
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
