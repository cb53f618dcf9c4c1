"""What the cookbooks share: their options, the saved transcript, and the excerpt cut at a line end.

Each cookbook still sets ``OMP_WAIT_POLICY`` itself, first thing, before anything imports torch.

The cookbooks run SmolLM2-135M answering from the document's shared root by default (``--model`` and
``--mode`` pick others): the saved transcripts were made that way, and it keeps them minutes long on a
CPU. The package's own defaults, Qwen2.5-Coder-1.5B and the per-question ``query_aware`` path, answer
better and run far slower on a CPU.
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
MODEL = "smollm2-135m-instruct"
"""``--model``'s default: the model of the saved transcripts."""
MODE = "shared"
"""``--mode``'s default: one compressed cache per document serves every question, as in the transcripts."""
MODES = ("shared", "query_aware", "full")


def cookbook_main(
    run: Callable[[argparse.Namespace], None],
    output: Path,
    doc: str,
    max_new_tokens: int,
    options: tuple[Option, ...] = (EXCERPT,),
) -> None:
    """Parse the cookbook options (``options`` + model, mode and answer length), run, and save the
    printed transcript to ``output``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, kind, default, text in (
        *options,
        ("--model", str, MODEL, f"local path, hub id or embedded name (default: {MODEL}, as the transcripts)"),
        ("--max-new-tokens", int, max_new_tokens, "longest answer in tokens"),
    ):
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument(
        "--mode", choices=MODES, default=MODE, help=f"HOMER mode of every answer (default: {MODE}, as the transcripts)"
    )
    transcript = Tee()
    with contextlib.redirect_stdout(transcript):
        run(parser.parse_args())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(transcript.getvalue(), encoding="utf-8")


def opening(tokenizer, tokens: int) -> str:
    """About the first ``tokens`` tokens of Pride and Prejudice (from chapter 1), cut at a line end."""
    text = bundled_excerpt(tokenizer, tokens)
    return text[: text.rfind("\n")].strip()
