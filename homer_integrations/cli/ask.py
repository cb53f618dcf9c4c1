"""``homer-qa ask FILE -q QUESTION ...``: answer questions about one whole document."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from homer_integrations.cli import loading, options
from homer_integrations.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    MODES,
    SETTING_OPTIONS,
    CliError,
    human_bytes,
    printable,
    seconds,
)

if TYPE_CHECKING:
    from homer_integrations.cache import DocumentCache
    from homer_integrations.documents import ParsedDocument
    from homer_integrations.engine.model import AnswerInfo, HomerModel
    from homer_integrations.homer.decoding.generation import GenerationOptions
    from homer_integrations.question_sets import KeywordQuestion

_SURROGATE = re.compile("[\ud800-\udfff]")

DEMO_QUESTIONS = 4
"""How many questions ``--demo`` asks: spread through the part of the bundled question set
(``homer_integrations.question_sets``) whose answers the excerpt holds, each checked against its
expected keywords on screen."""


def add_parser(commands: Any) -> None:
    ask = commands.add_parser("ask", help="answer questions about a document (txt, md, rst, pdf, html)")
    ask.set_defaults(run=run)
    ask.add_argument("file", type=Path, metavar="FILE")
    ask.add_argument("-q", "--question", dest="questions", action="append", default=[], metavar="QUESTION")
    ask.add_argument(
        "--demo",
        action="store_true",
        help="without -q: ask questions of the bundled set about the bundled novel and check the answers",
    )
    ask.add_argument("--max-chars", type=options.positive_int, metavar="N", help="use only the first N characters")
    options.max_file_option(ask)
    options.max_document_tokens_option(ask)
    options.model_options(ask)
    options.cache_options(ask, allow_no_disk=True)
    ask.add_argument(
        "--mode",
        choices=MODES,
        help="how each question is answered: auto (default): full for a document that fits the model's window, "
        "else query_aware; query_aware: the question is compressed with the document (paper), replayed from a "
        "cached leaf tier (past the window: BM25 passages re-read); shared: one compressed cache for every question "
        "(faster, loses facts as documents grow); full: the document uncompressed (it must fit the model's window)",
    )
    options.homer_options(ask)
    gen = ask.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=options.positive_int, default=256, metavar="N")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P")
    gen.add_argument("--top-k", type=options.non_negative_int, default=0, metavar="K")
    gen.add_argument("--seed", type=int, metavar="S")
    gen.add_argument("--stop", action="append", default=[], metavar="STR", help="stop string (repeatable)")
    ask.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ask.add_argument(
        "--sources",
        action="store_true",
        help="after each answer, the passages of the document it was read from (character offsets and text)",
    )
    ask.add_argument("--no-progress", action="store_true", help="no progress bar while compressing")
    ask.add_argument(
        "--no-server",
        action="store_true",
        help="answer in this process even while a 'homer-qa serve' runs (by default it answers)",
    )


def run(args: argparse.Namespace) -> int:
    _check_questions(args)
    parsed = read(args.file, args.max_file_mb)  # before torch loads: bad input fails fast
    generation = _generation(args)
    text = _excerpt(parsed.text, args.max_chars)
    questions = args.questions or _demo_questions(text)
    config = options.config(args)
    cache = loading.open_cache(args)
    started = time.perf_counter()
    progress = False if args.no_progress else None  # None: a bar on stderr when it is a terminal
    engine = loading.engine(args, config, cache, progress)
    load_seconds = time.perf_counter() - started
    _check_sizes(engine, text, questions, args)

    out = sys.stdout
    results = [
        _answer(engine, cache, parsed.name, text, i, question, generation, args, out)
        for i, question in enumerate(questions)
    ]
    if not args.json:
        _print_checks(results, out)
    summary = {
        "file": str(args.file),
        "model": engine.model_name,
        "mode": engine.mode_for(args.mode, document=text),
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


def _check_questions(args: argparse.Namespace) -> None:
    if any(not q.strip() for q in args.questions):
        raise CliError("a question is empty", EXIT_USAGE)
    for option, texts in (("a question", args.questions), ("a --stop string", args.stop)):
        if any(_SURROGATE.search(text) for text in texts):  # how Python decodes bytes that are not UTF-8 in argv
            raise CliError(f"{option} is not valid UTF-8 text (check the terminal's encoding)", EXIT_USAGE)
    if not args.questions and not args.demo:
        raise CliError("give at least one question with -q QUESTION (or --demo)", EXIT_USAGE)


def _check_sizes(
    engine: HomerModel, text: str, questions: list[str | KeywordQuestion], args: argparse.Namespace
) -> None:
    """Every question, then the document, against the engine's limits (``HomerModel.check_question``,
    ``check_document``) before the first question is answered: a question or document too long for it is
    one line naming the option that raises the limit, before anything is compressed."""
    try:
        for asked in questions:
            engine.check_question(asked if isinstance(asked, str) else asked.question)
    except ValueError as exc:
        raise CliError(_worded(exc), EXIT_USAGE) from None
    try:
        engine.check_document(text)
    except ValueError as exc:
        raise CliError(f"{args.file}: {_worded(exc)}") from None


def _worded(exc: ValueError) -> str:
    """``exc``'s message; an ``InputTooLongError``'s with the command-line option that raises its limit."""
    from homer_integrations.engine.prompting import InputTooLongError

    return exc.worded(SETTING_OPTIONS[exc.setting]) if isinstance(exc, InputTooLongError) else str(exc)


def _demo_questions(text: str) -> list[KeywordQuestion]:
    """``DEMO_QUESTIONS`` of the bundled set whose answers ``text`` holds; ``text`` must be the bundled novel."""
    from homer_integrations.question_sets import question_set

    qset = question_set()
    novel = qset.document.read_text(encoding="utf-8")
    if not novel.startswith(text[:2000]):
        raise CliError(
            f"--demo asks the bundled questions about {qset.document.name} ({qset.document}); "
            f"for another document give -q QUESTION",
            EXIT_USAGE,
        )
    asked = qset.within(len(text))
    if not asked.questions:
        raise CliError("--demo: the excerpt is too short to hold any bundled question's answer", EXIT_USAGE)
    return list(asked.spread(DEMO_QUESTIONS))


def _generation(args: argparse.Namespace) -> GenerationOptions:
    from homer_integrations.homer.decoding.generation import GenerationOptions

    try:
        return GenerationOptions(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(args.stop),
        )
    except ValueError as exc:
        raise CliError(f"invalid generation options: {' '.join(str(exc).split())}", EXIT_USAGE) from None


def _excerpt(text: str, max_chars: int | None) -> str:
    """``text``, or its first ``max_chars`` characters cut at a space."""
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars + 1)
    return text[: cut if cut > max_chars // 2 else max_chars]


def read(path: Path, max_file_mb: int) -> ParsedDocument:
    """The whole document at ``path``; a file over ``max_file_mb`` MiB is refused before it is read."""
    from homer_integrations.documents import DocumentError, FileTooLargeError, read_document

    try:
        return read_document(path, max_bytes=max_file_mb * 1024 * 1024)
    except FileTooLargeError as exc:
        raise CliError(str(FileTooLargeError(exc.path, exc.size, exc.limit, "use --max-file-mb N"))) from None
    except DocumentError as exc:
        raise CliError(str(exc)) from None


def _answer(
    engine: HomerModel,
    cache: DocumentCache,
    label: str,
    text: str,
    i: int,
    asked: str | KeywordQuestion,
    generation: GenerationOptions,
    args: argparse.Namespace,
    out: TextIO,
) -> dict[str, Any]:
    """Answer question ``i`` (compressing first if needed), streaming it to ``out`` unless ``--json``.

    A bundled ``KeywordQuestion`` (``--demo``) is also checked against its expected keywords."""
    show = not args.json
    question = asked if isinstance(asked, str) else asked.question
    if show:
        out.write(f"\nQ{i + 1}: {question}\n")
        out.flush()
    pieces: list[str] = []
    with cache.labelled(label):
        try:
            stream = engine.run(text, question, mode=args.mode, **generation.model_dump())
            if show:
                out.write(f"A{i + 1}: ")
                out.flush()
            shown = False  # leading whitespace is dropped so "A1:" is followed by text
            for piece in stream:
                pieces.append(piece)
                visible = piece if shown else piece.lstrip()
                if show and visible:
                    out.write(visible)
                    out.flush()
                shown = shown or bool(visible)
        except ValueError as exc:
            raise CliError(f"{args.file}: {_worded(exc)}") from None
    record = answer_record(question, "".join(pieces), stream.info)
    if record["mode"] == "query_aware":
        record["reads_tier"] = engine.reads_tier(record["document_tokens"])
    if not isinstance(asked, str):
        record |= {"expected": asked.expected(), "correct": asked.check(record["answer"])}
    if show:
        out.write("\n")
        if args.sources:
            _print_sources(record["sources"], text, out)
        if "correct" in record:
            out.write(f"   {'right' if record['correct'] else 'wrong'}: expected {record['expected']}\n")
    return record


def _print_checks(results: list[dict[str, Any]], out: TextIO) -> None:
    checked = [r["correct"] for r in results if "correct" in r]
    if checked:
        out.write(f"\n{sum(checked)} of {len(checked)} answers hold the expected keywords\n")


def answer_record(question: str, answer: str, info: AnswerInfo) -> dict[str, Any]:
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
        "sources": [s.as_dict() for s in info.sources],
    }


SOURCE_EXCERPT_CHARS = 100
"""Characters of a cited passage that ``--sources`` shows."""


def _print_sources(sources: list[dict[str, Any]], text: str, out: TextIO) -> None:
    """The cited spans of ``text``, one line each: offsets, share of the answer's attention, an excerpt."""
    if not sources:
        out.write("   sources: none recorded for this answer\n")
    for n, s in enumerate(sources, 1):
        excerpt = " ".join(text[s["start"] : s["end"]].split())
        if len(excerpt) > SOURCE_EXCERPT_CHARS:
            excerpt = excerpt[: SOURCE_EXCERPT_CHARS - 1].rstrip() + "…"
        out.write(f"   [{n}] chars {s['start']:,}-{s['end']:,} ({s['score']:.0%}): {excerpt}\n")


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    answers = summary["answers"]
    first = answers[0]
    ratio = first["document_tokens"] / max(1, first["cache_tokens"])
    out.write("\n--- summary ---\n")
    out.write(
        f"document: {printable(summary['file'])} ({printable(summary['model'])}, {summary['mode']} mode): "
        f"{first['document_tokens']:,} tokens -> {first['cache_tokens']:,} cache tokens "
        f"({ratio:.1f}x, {human_bytes(first['cache_bytes'])})\n"
    )
    for i, a in enumerate(answers, 1):
        out.write(
            f"Q{i}: {_setup(a)}; {a['mode']} mode; first token {seconds(a['time_to_first_token'])}, "
            f"total {seconds(a['total_seconds'])}, {a['output_tokens']} tokens\n"
        )
    where = printable(summary["cache_directory"] or "memory only (--no-disk-cache)")
    out.write(f"model load {seconds(summary['model_load_seconds'])}; cache: {where}\n")


def _setup(a: dict[str, Any]) -> str:
    """How an answer's cache was had, in words."""
    setup = seconds(a["setup_seconds"])
    if a["mode"] == "query_aware" and not a.get("reads_tier", True):
        return f"past the model's window: the passages BM25 ranks best re-read, no leaf tier; setup {setup}"
    if a["mode"] == "query_aware":  # the cache source is the leaf tier's; the question is replayed every time
        where = {"computed": "built", "disk": "loaded from disk cache", "memory": "found in memory"}
        built = f" in {seconds(a['document_seconds'])}" if a["cache_source"] == "computed" else ""
        return f"leaf tier {where.get(a['cache_source'], 'ready')}{built}, question replayed; setup {setup}"
    verb = "prefilled" if a["mode"] == "full" else "compressed"
    if a["cache_source"] == "computed":
        return f"{verb} in {setup}"
    if a["cache_source"] == "disk":
        return f"loaded from disk cache in {setup} (was {verb} in {seconds(a['compression_seconds'])})"
    return "cache hit in memory"
