"""What the cookbooks share: their options, the saved transcript, and the excerpt cut at a line end.

Each cookbook still sets ``OMP_WAIT_POLICY`` itself, first thing, before anything imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from homer_integrations.paths import bundled_excerpt


class Tee(io.StringIO):
    """Prints and keeps a copy of everything written."""

    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        sys.__stdout__.flush()
        return super().write(text)


Option = tuple[str, type, Any, str]
"""flag, type, default, help"""

EXCERPT: Option = ("--tokens", int, 3000, "excerpt length in model tokens")


def cookbook_main(
    run: Callable[[argparse.Namespace], None],
    output: Path,
    doc: str,
    max_new_tokens: int,
    options: tuple[Option, ...] = (EXCERPT,),
) -> None:
    """Parse the cookbook options (``options`` + model and answer length), run, and save the
    printed transcript to ``output``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, kind, default, text in (
        *options,
        ("--model", str, None, "local path, hub id or embedded name (default: the embedded model)"),
        ("--max-new-tokens", int, max_new_tokens, "longest answer in tokens"),
    ):
        parser.add_argument(flag, type=kind, default=default, help=text)
    transcript = Tee()
    with contextlib.redirect_stdout(transcript):
        run(parser.parse_args())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(transcript.getvalue(), encoding="utf-8")


def opening(tokenizer, tokens: int) -> str:
    """About the first ``tokens`` tokens of Pride and Prejudice (from chapter 1), cut at a line end."""
    text = bundled_excerpt(tokenizer, tokens)
    return text[: text.rfind("\n")].strip()
