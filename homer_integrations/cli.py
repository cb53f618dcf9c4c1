"""``homer-qa``: ask questions about a whole long document from the command line.

    homer-qa ask book.txt -q "Who is Mr. Darcy?" -q "How does the story end?"
    homer-qa ask homer_integrations/data/prideprejudice.txt --demo
    homer-qa cache ls | info | clear
    homer-qa calibrate --model smollm2-135m-instruct
    homer-qa compress docs/ --store s3://bucket/homer [--ray ADDRESS] [--workers N]

The document is compressed once (a progress bar shows tokens per second) and kept in the disk
cache, so a second run answers from disk. Problems with the input are one line on stderr and a
non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # the heavy imports (torch, transformers) wait until a command needs them
    from homer_integrations.document_cache import DocumentCache
    from homer_integrations.documents import ParsedDocument
    from homer_integrations.engine import AnswerInfo, HomerModel
    from homer_integrations.homer.config import HomerConfig

# torch loads later (inside commands); idle OpenMP threads then yield the CPU instead of spinning,
# which on a busy machine made CPU inference several times slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
MODES = ("shared", "query_aware", "full")
"""``--mode`` choices: ``homer_integrations.homer.config.Mode`` (not imported here: it loads pydantic)."""

DEFAULT_MAX_FILE_MB = 16
"""``--max-file-mb``: the default limit of ``homer_integrations.documents`` (16 MiB)."""

DEMO_QUESTIONS = (
    "Who is Mr. Bingley?",
    "What does Mr. Darcy say about Elizabeth at the ball?",
    "Which of the Bennet sisters does Mr. Bingley admire most?",
)
"""What ``--demo`` asks when no ``-q`` is given: written for the opening chapters of the bundled
Pride and Prejudice (the Makefile's demo reads its first 60,000 characters, about 15k tokens)."""

logger = logging.getLogger("homer_integrations.cli")


class CliError(Exception):
    """A problem to report as one line on stderr with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ----------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="homer-qa",
        description="Answer questions about whole long documents with a local model: HOMER compresses each "
        "document once into a short KV cache, every later question reuses it.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress (-v INFO, -vv DEBUG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ask = commands.add_parser("ask", help="answer questions about a document (txt, md, rst, pdf, html)")
    ask.add_argument("file", type=Path, metavar="FILE")
    ask.add_argument("-q", "--question", dest="questions", action="append", default=[], metavar="QUESTION")
    ask.add_argument("--demo", action="store_true", help="without -q: ask three questions about the bundled novel")
    ask.add_argument("--max-chars", type=_positive_int, metavar="N", help="use only the first N characters")
    ask.add_argument(
        "--max-file-mb",
        type=_positive_int,
        default=DEFAULT_MAX_FILE_MB,
        metavar="N",
        help=f"refuse files over N MiB before reading them (default {DEFAULT_MAX_FILE_MB})",
    )
    _model_options(ask)
    _cache_options(ask, allow_no_disk=True)
    ask.add_argument(
        "--mode",
        choices=MODES,
        help="how each question is answered: shared: one compressed cache for every question (default); "
        "query_aware: the question is compressed with the document (paper), replayed from a cached leaf tier; "
        "full: the document uncompressed (it must fit the model's window)",
    )
    ask.add_argument("--max-chunk-len", type=_positive_int, metavar="N", help="HOMER chunk length (tokens)")
    ask.add_argument("--warmup-layers", type=_non_negative_int, metavar="N", help="HOMER warm-up layers")
    gen = ask.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=256, metavar="N")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P")
    gen.add_argument("--top-k", type=_non_negative_int, default=0, metavar="K")
    gen.add_argument("--seed", type=int, metavar="S")
    gen.add_argument("--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)")
    ask.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ask.add_argument("--no-progress", action="store_true", help="no progress bar while compressing")

    cache = commands.add_parser("cache", help="list, describe or clear the document cache")
    cache.add_argument("action", choices=("ls", "info", "clear"))
    _cache_options(cache, allow_no_disk=False)
    cache.add_argument("--json", action="store_true")

    calibrate = commands.add_parser("calibrate", help="compute (once) the pruning calibration of a model")
    _model_options(calibrate)
    calibrate.add_argument("--max-chunk-len", type=_positive_int, metavar="N", help="HOMER chunk length (tokens)")

    from homer_integrations.cli_compress import add_compress_parser  # it builds on this module's helpers

    add_compress_parser(commands)
    return parser


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help="embedded model name, local path or hub id (default: the embedded default model)",
    )
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    parser.add_argument("--device", metavar="DEVICE", help="e.g. cpu, cuda, cuda:1 (default: where it loads)")


def _cache_options(parser: argparse.ArgumentParser, *, allow_no_disk: bool) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="document cache directory (default: the platform cache dir, or $HOMER_INTEGRATIONS_CACHE/documents)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="instead of --cache-dir: a shared store any fsspec URL names (s3://bucket/prefix, file://..., "
        "memory://); credentials and endpoint from the environment (AWS_ENDPOINT_URL, ...)",
    )
    parser.add_argument(
        "--max-bytes",
        type=_byte_size,
        metavar="SIZE",
        help="disk budget of the cache directory (e.g. 500MB, 2GiB): least recently used documents are "
        "evicted to stay within it" + ("; 'cache' applies it now" if not allow_no_disk else ""),
    )
    if allow_no_disk:
        parser.add_argument("--no-disk-cache", action="store_true", help="keep the compressed cache in memory only")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3}
_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tb": 1000**4, "tib": 1024**4}


def _byte_size(text: str) -> int:
    """``500MB``, ``2GiB``, ``1.5G`` or a plain number of bytes."""
    number = text.strip().lower().rstrip("bgikmt")
    unit = text.strip().lower()[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500MB, 2GiB)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return int(value)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


# ----------------------------------------------------------------------------- entry point
def main(argv: Sequence[str] | None = None) -> int:
    """Run ``homer-qa`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            if args.command == "ask":
                return _ask(args)
            if args.command == "cache":
                return _cache(args)
            if args.command == "compress":
                from homer_integrations.cli_compress import run_compress

                return run_compress(args)
            return _calibrate(args)
    except CliError as exc:
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `homer-qa ... | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return EXIT_OK


def _configure_logging(verbose: int) -> None:
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


def _error(message: str) -> None:
    print(f"homer-qa: error: {' '.join(message.split())}", file=sys.stderr)


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    print(f"homer-qa: warning: {' '.join(str(message).split())}", file=sys.stderr)


# ----------------------------------------------------------------------------- shared pieces
def _open_cache(args: argparse.Namespace) -> DocumentCache:
    from homer_integrations.document_cache import DocumentCache

    given = [name for name, on in (("--cache-dir", args.cache_dir), ("--store", args.store)) if on is not None]
    if getattr(args, "no_disk_cache", False):
        given.append("--no-disk-cache")
    if len(given) > 1:
        raise CliError(f"{' and '.join(given)} name different caches: give one", EXIT_USAGE)
    if getattr(args, "no_disk_cache", False):
        return DocumentCache()
    where = args.store or (args.cache_dir if args.cache_dir is not None else True)
    try:
        return DocumentCache(where, disk_budget_bytes=args.max_bytes)
    except ValueError as exc:
        raise CliError(f"--max-bytes: {exc}", EXIT_USAGE) from None
    except (ImportError, OSError) as exc:  # an fsspec protocol whose package is missing, a bad URL
        raise CliError(f"--store {args.store}: {exc}") from None


@functools.lru_cache(maxsize=2)
def _load_parts(name: str, dtype: str, device: str | None) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process: ``main`` may be called many times (tests, notebooks)."""
    from homer_integrations.models import load_model

    return load_model(name, dtype=dtype, device=device)


def _engine(
    args: argparse.Namespace, config: HomerConfig, cache: DocumentCache | None, progress: bool | None
) -> HomerModel:
    """A ``HomerModel`` like ``HomerModel.from_pretrained`` builds, over weights loaded once per process."""
    from homer_integrations import HomerModel
    from homer_integrations.homer.architectures import UnsupportedModelError
    from homer_integrations.models import DEFAULT_MODEL, ModelNotAvailableError

    name = args.model or DEFAULT_MODEL
    _check_device(args.device)
    try:
        model, tokenizer = _load_parts(name, args.dtype, args.device)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    except (OSError, ValueError, ImportError) as exc:
        raise CliError(f"cannot load model {name!r}: {exc}") from None
    try:
        return HomerModel(model, tokenizer, config, model_name=name, document_cache=cache, progress=progress)
    except UnsupportedModelError as exc:
        raise CliError(f"model {name!r}: {exc}") from None
    except ValueError as exc:  # settings that do not fit the model
        raise CliError(f"model {name!r}: {exc}") from None


def _check_device(device: str | None) -> None:
    """Refuse a ``--device`` this torch cannot use before any weights load."""
    from homer_integrations.models import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise CliError(f"--device: {exc}", EXIT_USAGE) from None


def _config(args: argparse.Namespace) -> HomerConfig:
    from pydantic import ValidationError

    from homer_integrations.homer.config import HomerConfig

    fields = {  # ``--mode`` is not a setting of the engine: it goes with each question (``_ask``)
        "max_chunk_len": getattr(args, "max_chunk_len", None),
        "warmup_layers": getattr(args, "warmup_layers", None),
    }
    try:
        return HomerConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise CliError(f"invalid HOMER settings: {exc.errors()[0]['msg']}", EXIT_USAGE) from None


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


# ----------------------------------------------------------------------------- ask
def _ask(args: argparse.Namespace) -> int:
    questions = [q for q in args.questions if q.strip()]
    if len(questions) != len(args.questions):
        raise CliError("a question is empty", EXIT_USAGE)
    if not questions:
        if not args.demo:
            raise CliError("give at least one question with -q QUESTION (or --demo)", EXIT_USAGE)
        questions = list(DEMO_QUESTIONS)
    parsed = _read(args.file, args.max_file_mb)  # before torch loads: bad input fails fast
    from homer_integrations.homer.generation import GenerationOptions

    try:
        options = GenerationOptions(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(args.stop),
        )
    except ValueError as exc:
        raise CliError(f"invalid generation options: {' '.join(str(exc).split())}", EXIT_USAGE) from None
    text = parsed.text
    if args.max_chars is not None and len(text) > args.max_chars:
        cut = text.rfind(" ", 0, args.max_chars + 1)
        text = text[: cut if cut > args.max_chars // 2 else args.max_chars]
    config = _config(args)
    cache = _open_cache(args)
    progress = False if args.no_progress else None  # None: a bar on stderr when it is a terminal
    started = time.perf_counter()
    engine = _engine(args, config, cache, progress)
    load_seconds = time.perf_counter() - started

    out = sys.stdout
    results: list[dict[str, Any]] = []
    label = parsed.name
    for i, question in enumerate(questions):
        if not args.json:
            out.write(f"\nQ{i + 1}: {question}\n")
            out.flush()
        with cache.labelled(label):
            try:
                # compresses (with its bar) if needed
                stream = engine.run(text, question, mode=args.mode, **options.model_dump())
                if not args.json:
                    out.write(f"A{i + 1}: ")
                    out.flush()
                pieces: list[str] = []
                shown = False  # leading whitespace is dropped so "A1:" is followed by text
                for piece in stream:
                    pieces.append(piece)
                    visible = piece if shown else piece.lstrip()
                    if not args.json and visible:
                        out.write(visible)
                        out.flush()
                    shown = shown or bool(visible)
            except ValueError as exc:
                raise CliError(f"{args.file}: {exc}") from None
        if not args.json:
            out.write("\n")
        results.append(_answer_record(question, "".join(pieces), stream.info))

    summary = {
        "file": str(args.file),
        "model": engine.model_name,
        "mode": args.mode or engine.config.mode,
        "characters": len(text),
        "model_load_seconds": round(load_seconds, 3),
        "cache_directory": cache.location,
        "answers": results,
        "cache": asdict(cache.stats()),
    }
    if args.json:
        json.dump(summary, out, indent=2)
        out.write("\n")
    else:
        _print_summary(summary, out)
    return EXIT_OK


def _read(path: Path, max_file_mb: int) -> ParsedDocument:
    """The whole document at ``path``; a file over ``max_file_mb`` MiB is refused before it is read."""
    from homer_integrations.documents import DocumentError, FileTooLargeError, read_document

    try:
        return read_document(path, max_bytes=max_file_mb * 1024 * 1024)
    except FileTooLargeError as exc:
        raise CliError(str(FileTooLargeError(exc.path, exc.size, exc.limit, "use --max-file-mb N"))) from None
    except DocumentError as exc:
        raise CliError(str(exc)) from None


def _answer_record(question: str, answer: str, info: AnswerInfo) -> dict[str, Any]:
    """One answer and what it cost: ``mode`` served it; ``setup_seconds`` is compressing or loading its
    cache (query_aware: and replaying the question), ``document_seconds`` the part spent computing the
    cached entry (the shared root, the full prefill or the leaf tier; 0 when it came from the cache)."""
    return {
        "question": question,
        "answer": answer.strip(),
        "mode": info.mode,
        "cache_source": info.cache_source,
        "document_tokens": info.document_tokens,
        "cache_tokens": info.cache_tokens,
        "cache_bytes": info.compression.cache_bytes if info.compression else 0,
        "compression_seconds": info.compression.seconds if info.compression else None,
        "setup_seconds": round(info.compress_seconds, 4),
        "document_seconds": round(info.document_seconds, 4),
        "time_to_first_token": None if info.time_to_first_token is None else round(info.time_to_first_token, 4),
        "total_seconds": round(info.total_seconds, 4),
        "output_tokens": info.output_tokens,
        "finish_reason": info.finish_reason,
    }


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    answers = summary["answers"]
    first = answers[0]
    ratio = first["document_tokens"] / max(1, first["cache_tokens"])
    out.write("\n--- summary ---\n")
    out.write(
        f"document: {summary['file']} ({summary['model']}, {summary['mode']} mode): "
        f"{first['document_tokens']:,} tokens -> {first['cache_tokens']:,} cache tokens "
        f"({ratio:.1f}x, {_human_bytes(first['cache_bytes'])})\n"
    )
    for i, a in enumerate(answers, 1):
        out.write(
            f"Q{i}: {_setup(a)}; {a['mode']} mode; first token {_seconds(a['time_to_first_token'])}, "
            f"total {_seconds(a['total_seconds'])}, {a['output_tokens']} tokens\n"
        )
    where = summary["cache_directory"] or "memory only (--no-disk-cache)"
    out.write(f"model load {_seconds(summary['model_load_seconds'])}; cache: {where}\n")


def _setup(a: dict[str, Any]) -> str:
    """How an answer's cache was had, in words."""
    setup = _seconds(a["setup_seconds"])
    if a["mode"] == "query_aware":  # the cache source is the leaf tier's; the question is replayed every time
        where = {"computed": "built", "disk": "loaded from disk cache", "memory": "found in memory"}
        built = f" in {_seconds(a['document_seconds'])}" if a["cache_source"] == "computed" else ""
        return f"leaf tier {where.get(a['cache_source'], 'ready')}{built}, question replayed; setup {setup}"
    verb = "prefilled" if a["mode"] == "full" else "compressed"
    if a["cache_source"] == "computed":
        return f"{verb} in {setup}"
    if a["cache_source"] == "disk":
        return f"loaded from disk cache in {setup} (was {verb} in {_seconds(a['compression_seconds'])})"
    return "cache hit in memory"


# ----------------------------------------------------------------------------- cache
def _cache(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    out = sys.stdout
    if args.max_bytes is not None and cache.directory is not None:  # --store URLs refuse a budget in _open_cache
        evicted = cache.trim()
        if evicted:
            print(f"homer-qa: evicted {evicted} cached document(s) over --max-bytes", file=sys.stderr)
    if args.action == "clear":
        removed = cache.clear()
        if args.json:
            json.dump({"directory": cache.location, "removed": removed}, out)
            out.write("\n")
        else:
            out.write(f"removed {removed} cached document(s) from {cache.location}\n")
        return EXIT_OK
    if args.action == "info":
        info = cache.info()
        if args.json:
            json.dump(info, out, indent=2)
            out.write("\n")
        else:
            out.write(
                f"directory: {info['store']}\nentries: {info['disk_entries']}\n"
                f"disk: {_human_bytes(info['disk_bytes'])}\nformat version: {info['format_version']}\n"
            )
            if info["disk_budget_bytes"] is not None:
                out.write(f"disk budget: {_human_bytes(info['disk_budget_bytes'])}\n")
        return EXIT_OK
    entries = cache.entries()
    if args.json:
        json.dump([asdict(e) for e in entries], out, indent=2)
        out.write("\n")
        return EXIT_OK
    if not entries:
        out.write(f"no cached documents in {cache.location}\n")
        return EXIT_OK
    rows = [("KEY", "DOCUMENT", "DOC TOKENS", "CACHE TOKENS", "SIZE", "CREATED")]
    for e in entries:
        created = datetime.fromtimestamp(e.created).strftime("%Y-%m-%d %H:%M")
        rows.append(
            (e.key[:12], e.label or "-", f"{e.document_tokens:,}", f"{e.tokens:,}", _human_bytes(e.disk_bytes), created)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n")
    out.write(f"{len(entries)} document(s), {_human_bytes(sum(e.disk_bytes for e in entries))} in {cache.location}\n")
    return EXIT_OK


# ----------------------------------------------------------------------------- calibrate
def _calibrate(args: argparse.Namespace) -> int:
    config = _config(args)
    engine = _engine(args, config, None, progress=None)
    if not engine.scoring.needs_calibration:
        sys.stdout.write("this configuration uses no calibration\n")
        return EXIT_OK
    started = time.perf_counter()
    engine.calibration_bias()
    seconds = time.perf_counter() - started
    where = engine.calibration_path()
    sys.stdout.write(
        f"calibration for {engine.model_name} (max_chunk_len={engine.config.max_chunk_len}) "
        f"ready in {_seconds(seconds)}: {where or 'kept in memory'}\n"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
