"""``homer-qa ask`` start-up on a cached document: a fresh process vs a running ``homer-qa serve``.

The document (the bundled novel's first ``--chars`` characters) is compressed once into a
temporary cache directory; then each repeat times, as a user sees it, the wall clock from
starting ``homer-qa ask -q QUESTION`` to the answer's first character on stdout, and to exit:

- ``imports``: a bare ``python -c "import torch, transformers.modeling_utils"`` (what a fresh
  process must import before it can build a model);
- ``fresh process``: ``homer-qa ask --no-server`` (imports, model load, cache load, first token);
  the model-load seconds it reports are kept apart;
- ``through serve``: ``homer-qa ask`` while ``homer-qa serve`` runs (started once, its start-up
  timed apart as the one-time cost).

Runs alternate between the two kinds of ``ask``. The issue's target: under 5 s to the first token.
Every ``ask`` passes ``--mode shared``: the question reads the document's one compressed root from the
cache directory (the package's default, ``query_aware``, would replay a selection per question).

    .venv/bin/python benchmarks/cli_start.py            # SmolLM2-135M (the committed result's), 3 repeats

Writes benchmarks/results/cli_start.json and cli_start.md. Refuses to run while another
``homer-qa serve`` is announced (it would answer the timed asks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).parent.parent
NOVEL = ROOT / "homer_integrations" / "data" / "prideprejudice.txt"
HOMER_QA = [sys.executable, "-m", "homer_integrations.cli"]
QUESTION = "Who is Mr. Darcy?"
MODEL = "smollm2-135m-instruct"
"""The model of the committed result (the package's default was SmolLM2 then)."""
MODE = "shared"


def timed_ask(argv: list[str]) -> dict[str, float]:
    """Wall seconds to the answer's first character and to exit, and the model load the summary reports."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    first = None
    seen = ""
    assert proc.stdout is not None
    while chunk := proc.stdout.read(1):
        seen += chunk
        if first is None and re.search(r"A1: \S$", seen):
            first = time.perf_counter() - started
    _, err = proc.communicate()
    total = time.perf_counter() - started
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err.strip()}")
    load = re.search(r"model load ([\d.]+) (ms|s)", seen)
    load_s = float(load.group(1)) / (1000 if load.group(2) == "ms" else 1) if load else float("nan")
    return {"first_char_s": first, "total_s": total, "model_load_s": load_s}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help=f"embedded name, path or hub id (default: {MODEL})")
    parser.add_argument("--chars", type=int, default=40000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args()

    from homer_integrations.cli import remote

    if (running := remote.find_server()) is not None and remote.listening(running):
        sys.exit(f"a homer-qa server is announced in {remote.state_path()}: stop it first")
    model = args.model
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "novel.txt"
        doc.write_text(NOVEL.read_text(encoding="utf-8")[: args.chars], encoding="utf-8")
        ask = [*HOMER_QA, "ask", str(doc), "-q", QUESTION, "--model", model, "--cache-dir", f"{tmp}/docs"]
        ask += ["--mode", MODE, "--max-new-tokens", str(args.max_new_tokens), "--no-progress"]
        print("compressing once ...", flush=True)
        compress_s = timed([*ask, "--no-server"])
        imports = [timed([sys.executable, "-c", "import torch, transformers.modeling_utils"])]

        started = time.perf_counter()
        serve = subprocess.Popen([*HOMER_QA, "serve", "--model", model], stdout=subprocess.PIPE, text=True)
        assert serve.stdout is not None
        banner = serve.stdout.readline()
        serve_start_s = time.perf_counter() - started
        if not banner.startswith("homer-qa server at"):
            sys.exit(f"homer-qa serve did not start: {banner!r}")
        fresh: list[dict[str, float]] = []
        served: list[dict[str, float]] = []
        try:
            for i in range(args.repeats):
                fresh.append(timed_ask([*ask, "--no-server"]))
                served.append(timed_ask(ask))
                imports.append(timed([sys.executable, "-c", "import torch, transformers.modeling_utils"]))
                print(f"repeat {i + 1}: fresh {fresh[-1]}, served {served[-1]}", flush=True)
        finally:
            serve.terminate()
            serve.wait(timeout=60)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    result: dict[str, Any] = {
        "model": model,
        "mode": MODE,
        "document_chars": args.chars,
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "first_compression_s": round(compress_s, 2),
        "serve_start_s": round(serve_start_s, 2),
        "imports_s": round(statistics.median(imports), 3),
        "fresh_process": {
            "first_char_s": med(fresh, "first_char_s"),
            "total_s": med(fresh, "total_s"),
            "model_load_s": med(fresh, "model_load_s"),
            "runs": fresh,
        },
        "through_serve": {
            "first_char_s": med(served, "first_char_s"),
            "total_s": med(served, "total_s"),
            "runs": served,
        },
    }
    result["speedup_first_char"] = round(
        result["fresh_process"]["first_char_s"] / result["through_serve"]["first_char_s"], 2
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_start.json").write_text(json.dumps(result, indent=2) + "\n")
    f, s = result["fresh_process"], result["through_serve"]
    table = [
        f"`homer-qa ask` on a cached document ({model}, {args.chars:,} characters, medians of "
        f"{args.repeats} runs; {os.cpu_count()} CPUs).",
        "",
        "| how | to the answer's first character | to exit | imports alone (a bare python -c) "
        "| model load (reported) |",
        "|---|---|---|---|---|",
        f"| fresh process (`--no-server`) | {f['first_char_s']:.2f} s | {f['total_s']:.2f} s | "
        f"{result['imports_s']:.2f} s | {f['model_load_s']:.2f} s |",
        f"| through `homer-qa serve` | {s['first_char_s']:.2f} s | {s['total_s']:.2f} s | - | - |",
        "",
        f"`homer-qa serve` itself started in {serve_start_s:.1f} s (imports and model load, once).",
    ]
    (RESULTS / "cli_start.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
