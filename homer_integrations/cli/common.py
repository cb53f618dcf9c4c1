"""What every ``homer-qa`` command shares: exit codes, the one-line error, logging and number formats.

Text that did not come from the user's own command line (a manifest's label or key, a message
quoting a file or a server) is shown through ``printable``: control characters, bidirectional
overrides and unpaired surrogates are spelled as escapes, so nothing stored can drive the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
MODES = ("auto", "shared", "query_aware", "full")
"""``--mode`` choices: ``homer_integrations.homer.config.Mode`` (not imported here: it loads pydantic)."""

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
"""``--model``'s default: ``homer_integrations.engine.loading.DEFAULT_MODEL`` (not imported here: it loads torch)."""
DEFAULT_MAX_FILE_MB = 16
"""``--max-file-mb``: the default limit of ``homer_integrations.documents`` (16 MiB)."""
DEFAULT_MAX_DOCUMENT_TOKENS = 2_000_000
"""``--max-document-tokens``: the engine's default (``prompting.DEFAULT_MAX_DOCUMENT_TOKENS``; not imported
here: it loads torch)."""
SETTING_OPTIONS = {"max_chunk_len": "--max-chunk-len N", "max_document_tokens": "--max-document-tokens N"}
"""The option that raises each engine setting an ``InputTooLongError`` names."""

logger = logging.getLogger("homer_integrations.cli")

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 and C1 controls, DEL, bidirectional marks and overrides, line separators, lone surrogates."""


class CliError(Exception):
    """A problem to report as one line on stderr with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def configure_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose >= 2 else logging.INFO if verbose == 1 else logging.WARNING
    root = logging.getLogger("homer_integrations")
    root.setLevel(level)
    for handler in [h for h in root.handlers if getattr(h, "_homer_cli", False)]:
        root.removeHandler(handler)  # main() may run many times in one process; stderr may have changed
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler._homer_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    if verbose < 2:
        with contextlib.suppress(ImportError):
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()  # the "Loading weights" bar; ours stays


def printable(text: str) -> str:
    """``text`` with every character that could steer a terminal spelled as its escape (``\\x1b``)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def one_line(message: str) -> str:
    """``message`` on one printable line: whitespace runs become one space, then ``printable``."""
    return printable(" ".join(message.split()))


def error(message: str) -> None:
    print(f"homer-qa: error: {one_line(message)}", file=sys.stderr)


def show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    print(f"homer-qa: warning: {one_line(str(message))}", file=sys.stderr)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"
