"""``homer-qa compress``: compress a corpus into a shared store, in process or over Ray workers.

    homer-qa compress contracts/ --store s3://bucket/homer
    homer-qa compress docs/*.md --store /shared/homer --ray auto --workers 8

What the store holds already is skipped without loading a model; the summary counts compressed,
already stored and failed documents, and the exit code is 1 when any failed (rerun to finish them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from homer_integrations.cli import loading, options
from homer_integrations.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, MODES, CliError, error, seconds


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "compress", help="compress many documents into a shared store (in process, or over Ray workers)"
    )
    parser.set_defaults(run=run)
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files, and directories searched")
    parser.add_argument(
        "--store",
        type=options.non_empty,
        metavar="URL",
        help="a directory or an fsspec URL (s3://bucket/prefix, ...) every worker and later reader can reach "
        "(default: the document cache directory 'ask' uses)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="spread the documents over Ray workers: 'local' starts Ray on this machine, "
        "'auto' joins this machine's cluster, ray://HOST:10001 a remote one",
    )
    parser.add_argument(
        "--workers", type=options.positive_int, metavar="N", help="Ray workers (default: one per GPU, else per 4 CPUs)"
    )
    parser.add_argument("--threads", type=options.positive_int, metavar="N", help="CPU threads per Ray worker on CPU")
    parser.add_argument(
        "--retries", type=options.non_negative_int, default=2, metavar="N", help="restarts of a dead worker (default 2)"
    )
    options.model_options(parser, quantize=False)  # corpus workers load float models only
    parser.add_argument(
        "--mode",
        choices=MODES,
        help="the entry stored: auto (default): each document's whole prefill where it fits the model's window, "
        "else its leaf tier; query_aware: the leaf tier its questions replay from; shared or full: the root",
    )
    options.homer_options(parser)
    options.max_file_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from homer_integrations.corpus import compress_corpus
    from homer_integrations.engine.loading import ModelNotAvailableError
    from homer_integrations.paths import cache_root

    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise CliError(f"no such file or directory: {', '.join(missing)}")
    loading.check_device(args.device)
    store = args.store or str(cache_root() / "documents")
    _check_store(store)
    try:
        report = compress_corpus(
            args.paths,
            store,
            model=args.model,
            config=options.config(args),
            mode=args.mode,
            dtype=args.dtype,
            device=args.device,
            ray_address=args.ray,
            workers=args.workers,
            threads=args.threads,
            retries=args.retries,
            progress=not args.no_progress,
            max_bytes=args.max_file_mb * 1024 * 1024,
        )
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    except (ImportError, OSError, ValueError) as exc:  # no ray, an unreachable store or cluster, a bad URL
        raise CliError(f"cannot compress into {store}: {exc}") from None
    if args.json:
        json.dump({"store": store, **report.to_dict()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_report(report, store)
    return EXIT_OK if report.ok else EXIT_ERROR


def _check_store(store: str) -> None:
    """A store that cannot be used at all (no credentials, an unknown protocol) as one line, before any
    document is read or any model loads."""
    from homer_integrations.cache.store import open_store

    try:
        open_store(store).check()
    except ValueError as exc:
        raise CliError(f"--store {store}: {exc}", EXIT_USAGE) from None
    except (ImportError, OSError) as exc:
        raise CliError(f"--store {store}: {exc}") from None


def _print_report(report: Any, store: str) -> None:
    for doc in report.documents:
        if doc.status == "failed":
            error(f"{doc.path}: {doc.error}")
    where = f"{report.workers} Ray worker(s)" if report.backend == "ray" else "this process"
    print(
        f"{len(report.documents)} documents into {store}: {report.count('compressed')} compressed, "
        f"{report.count('stored') + report.count('skipped')} already stored, {report.count('failed')} failed "
        f"({seconds(report.seconds)}, {where})"
    )
    if report.count("unneeded"):
        print(
            f"{report.count('unneeded')} past the model's window need no entry: their questions read the "
            "passages BM25 ranks best from the text"
        )
