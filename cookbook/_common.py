"""What the cookbooks share: their options, the saved transcript, and the excerpt cut at a line end.

Each cookbook still sets ``OMP_WAIT_POLICY`` itself, first thing, before anything imports torch.

The cookbooks run the package's defaults (``--model`` and ``--mode`` pick others): Qwen2.5-Coder-1.5B, and
``auto``, which keeps an excerpt that fits the model's window whole, so after its one prefill every question
is read in about a second. The whole-book cookbook (``structured_extraction``) keeps SmolLM2-135M and the
shared root, minutes on a CPU where the 1.5B needs about half an hour for one root of the novel.
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
MODEL = "qwen2.5-coder-1.5b-instruct"
"""``--model``'s default: the package's (``homer_integrations.engine.loading.DEFAULT_MODEL``; not imported: torch)."""
MODE = "auto"
"""``--mode``'s default: the package's (a document that fits the window kept whole, a longer one per question)."""
MODES = ("auto", "shared", "query_aware", "full")


def cookbook_main(
    run: Callable[[argparse.Namespace], None],
    output: Path,
    doc: str,
    max_new_tokens: int,
    options: tuple[Option, ...] = (EXCERPT,),
    model: str = MODEL,
    mode: str = MODE,
) -> None:
    """Parse the cookbook options (``options`` + model, mode and answer length; ``model`` and ``mode``: their
    defaults), run, and save the printed transcript to ``output``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, kind, default, text in (
        *options,
        ("--model", str, model, f"local path, hub id or embedded name (default: {model}, as the transcript)"),
        ("--max-new-tokens", int, max_new_tokens, "longest answer in tokens"),
    ):
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument(
        "--mode", choices=MODES, default=mode, help=f"HOMER mode of every answer (default: {mode}, as the transcript)"
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
