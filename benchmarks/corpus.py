"""Corpus compression and serving from a shared store, each measured in a fresh process.

1. Throughput: N documents (default 20 excerpts of the bundled novels, ~2k tokens each) compressed
   by ``compress_corpus`` in process, and on Ray (local mode) with 1 worker of 2 threads and 2
   workers of 1 thread; documents/s, document tokens/s, wall time with and without Ray's start
   and the model loads, and the peak RSS of every worker.
2. First question in a fresh process (model load not counted, reported apart): answering one
   document of ``--first-tokens`` tokens (default 16k, the issue's target length) from the S3
   store (moto's server on 127.0.0.1 through s3fs) vs from a local directory
   holding the same entry bytes vs compressing it (memory-only cache).

The entries are shared roots (``mode="shared"``, as the committed result was measured): one
compression per document that every question reads (the package's default, ``query_aware``, stores
a leaf tier instead and replays a selection per question).

    .venv/bin/python benchmarks/corpus.py                   # 20 documents
    .venv/bin/python benchmarks/corpus.py --documents 6     # a small run on a busy machine

Writes benchmarks/results/corpus.json. On a shared 2-core machine timings are noisy: compare the
ratios measured within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
MODEL = "smollm2-135m-instruct"
MODE = "shared"
QUESTION = "Who is Mr. Bingley?"
NOVELS = ("prideprejudice", "northangerabbey")
TARGET_S3_VS_LOCAL = 2.0
TARGET_COMPRESS_VS_S3 = 20.0  # the issue states it at 16k tokens: --first-tokens
RUNS = (("process", None, None), ("ray", 1, 2), ("ray", 2, 1))
"""(backend, Ray workers, threads per worker)."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_documents(folder: Path, count: int, tokens: int, start: int = 2000) -> list[Path]:
    """``count`` excerpts of about ``tokens`` tokens, alternating between the bundled novels, from
    token ``start`` on (past the title pages)."""
    from homer_integrations.engine.loading import load_model
    from homer_integrations.paths import bundled_text

    _, tokenizer = load_model(MODEL)
    ids = {name: tokenizer(bundled_text(name), add_special_tokens=False)["input_ids"] for name in NOVELS}
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        name = NOVELS[i % len(NOVELS)]
        first = start + (i // len(NOVELS)) * tokens
        path = folder / f"{name}-{i:02d}.txt"
        path.write_text(tokenizer.decode(ids[name][first : first + tokens]), encoding="utf-8")
        paths.append(path)
    return paths


def child(args: list[str]) -> dict[str, Any]:
    """Run this script's ``--child`` mode in a fresh process; its JSON result."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = round(time.perf_counter() - started, 3)
    return result


# ----------------------------------------------------------------------------- children
def compress_child(folder: str, store: str, backend: str, workers: int | None, threads: int | None) -> dict:
    from homer_integrations.corpus import compress_corpus, peak_rss_bytes

    report = compress_corpus(
        [folder],
        store,
        model=MODEL,
        mode=MODE,
        ray_address="local" if backend == "ray" else None,
        workers=workers,
        threads=threads,
        progress=False,
    )
    assert report.ok, [d for d in report.documents if d.status == "failed"]
    done = report.to_dict()
    busy = sum(d.seconds for d in report.documents)
    tokens = sum(d.document_tokens for d in report.documents)
    return {
        "backend": backend,
        "workers": report.workers,
        "threads_per_worker": threads,
        "documents": len(report.documents),
        "document_tokens": tokens,
        "wall_seconds": round(report.seconds, 3),
        "documents_per_second": round(len(report.documents) / report.seconds, 4),
        "tokens_per_second": round(tokens / report.seconds, 1),
        "compress_seconds_per_document": round(busy / len(report.documents), 3),
        # the compressions themselves, spread over the workers (no Ray start, no model loads)
        "tokens_per_second_compressing": round(tokens / (busy / report.workers), 1),
        "peak_rss_mb_by_worker": {k: round(v / 2**20) for k, v in done["peak_rss_bytes_by_worker"].items()},
        "driver_peak_rss_mb": round(peak_rss_bytes() / 2**20),
    }


def ask_child(document: str, store: str | None) -> dict:
    from homer_integrations import HomerModel

    started = time.perf_counter()
    engine = HomerModel.from_pretrained(MODEL, store=store, progress=False)
    load = time.perf_counter() - started
    text = Path(document).read_text(encoding="utf-8")
    stream = engine.run(text, QUESTION, mode=MODE, max_new_tokens=8)
    stream.text()
    info = stream.info
    return {
        "cache_source": info.cache_source,
        "model_load_seconds": round(load, 3),
        "time_to_first_token": round(info.time_to_first_token or 0.0, 3),
        "compress_seconds": round(info.compress_seconds, 3),
        "document_tokens": info.document_tokens,
    }


# ----------------------------------------------------------------------------- the parent
def start_s3() -> tuple[Any, str]:
    """moto's S3 server on 127.0.0.1 (children reach it through the environment) and a bucket URL."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }
    )
    boto3.client("s3").create_bucket(Bucket="homer-bench")
    return server, "s3://homer-bench/documents"


def copy_store(local: Path, url: str) -> int:
    """Put the local store's entry files under ``url`` (the same bytes); how many."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    files = [p for p in local.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors")]
    for path in files:
        fs.put_file(str(path), f"{root}/{path.name}")
    return len(files)


def first_questions(document: Path, stores: dict[str, str | None], repeats: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, store in stores.items():
        runs = [child(["ask", str(document), store or "-"]) for _ in range(repeats)]
        assert all(r["cache_source"] == ("computed" if store is None else "disk") for r in runs), runs
        rows[name] = {
            "runs": runs,
            "time_to_first_token_min": min(r["time_to_first_token"] for r in runs),
            "time_to_first_token_median": statistics.median(r["time_to_first_token"] for r in runs),
        }
        log(f"first question from {name}: {rows[name]['time_to_first_token_min']:.3f} s (min of {repeats})")
    s3, local, compress = (rows[k]["time_to_first_token_min"] for k in ("s3", "local", "compress"))
    rows["s3_vs_local"] = round(s3 / local, 2)
    rows["compress_vs_s3"] = round(compress / s3, 1)
    rows["targets"] = {
        f"s3 within {TARGET_S3_VS_LOCAL}x of local": s3 <= TARGET_S3_VS_LOCAL * local,
        f"s3 {TARGET_COMPRESS_VS_S3}x faster than compressing (the issue asks this at 16k tokens)": compress
        >= TARGET_COMPRESS_VS_S3 * s3,
    }
    return rows


def environment() -> dict[str, Any]:
    import ray
    import torch

    return {
        "model": MODEL,
        "mode": MODE,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per document")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per first-question setting")
    parser.add_argument("--first-tokens", type=int, default=16000, help="tokens of the first-question document")
    parser.add_argument("--out", type=Path, default=RESULTS / "corpus.json")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "compress":
            folder, store, backend, workers, threads = rest
            result = compress_child(folder, store, backend, int(workers) or None, int(threads) or None)
        else:
            document, store = rest
            result = ask_child(document, None if store == "-" else store)
        print(json.dumps(result))
        return 0

    result: dict[str, Any] = {
        "environment": environment(),
        "documents": args.documents,
        "tokens": args.tokens,
        "first_question_tokens": args.first_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="homer-corpus-") as work:
        folder = Path(work) / "corpus"
        documents = write_documents(folder, args.documents, args.tokens)
        log(f"{len(documents)} documents of ~{args.tokens} tokens in {folder}")
        server, s3_url = start_s3()
        try:
            result["throughput"] = []
            for backend, workers, threads in RUNS:
                store = Path(work) / f"store-{backend}-{workers or 0}"
                row = child(["compress", str(folder), str(store), backend, str(workers or 0), str(threads or 0)])
                result["throughput"].append(row)
                log(
                    f"{backend} workers={row['workers']}: {row['documents_per_second']:.3f} doc/s, "
                    f"{row['tokens_per_second']:.0f} tok/s wall, peak RSS {row['peak_rss_mb_by_worker']} MB"
                )
            long_folder, local = Path(work) / "first", Path(work) / "store-first"
            (document,) = write_documents(long_folder, 1, args.first_tokens, start=500)
            stored = child(["compress", str(long_folder), str(local), "process", "0", "0"])
            log(f"first-question document: {stored['document_tokens']} tokens, {stored['wall_seconds']:.1f} s")
            log(f"copied {copy_store(local, s3_url)} entry files to {s3_url}")
            stores = {"s3": s3_url, "local": str(local), "compress": None}
            result["first_question"] = first_questions(document, stores, args.repeats)
        finally:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
