"""Process memory while a leaf tier is built: a memory-only cache vs a cache directory (built in place).

With a cache directory the tier is built inside its future entry file (``cache/staged.py``): its
pages are the file's, in the OS page cache, written back and dropped under memory pressure. With a
memory-only cache it is process memory. Each variant runs in a fresh process that loads the model,
then builds the tier of ``--tokens`` tokens of the bundled novel (``DocumentTiers.leaf_tier``) while a
thread samples ``/proc/self/status`` every 20 ms; reported are the peaks of anonymous memory
(``RssAnon``: what the process itself holds) and of file pages (``RssFile``) above the loaded
model, beside the tier's size.

    .venv/bin/python benchmarks/tier_memory.py --tokens 16000      # SmolLM2

Writes benchmarks/results/tier_memory.json and tier_memory.md (Linux only: reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MB = 1024 * 1024


def status() -> dict[str, int]:
    """RssAnon and RssFile of this process, in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def one(variant: str, tokens: int, model_name: str, threads: int) -> dict:
    import torch

    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.cache import DocumentCache
    from homer_integrations.engine.loading import load_model
    from homer_integrations.paths import bundled_excerpt

    torch.set_num_threads(threads)
    model, tok = load_model(model_name)
    with tempfile.TemporaryDirectory() as tmp:
        cache = DocumentCache(tmp if variant == "directory" else None, memory_budget_bytes=1 << 40)
        engine = HomerModel(
            model, tok, HomerConfig(mode="query_aware"), model_name=model_name, progress=False, document_cache=cache
        )
        document = bundled_excerpt(tok, tokens)
        prefix = engine.prompting.layout("", "query_aware").prefix
        before = status()
        peaks = dict(before)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                for name, value in status().items():
                    peaks[name] = max(peaks[name], value)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        tier, _ = engine.tiers.leaf_tier(prefix, document)
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        for name, value in status().items():
            peaks[name] = max(peaks[name], value)
        return {
            "variant": variant,
            "tokens": tier.document_tokens,
            "tier_mb": round(tier.nbytes / MB, 1),
            "mapped": tier.mapped,
            "anon_peak_above_model_mb": round((peaks["RssAnon"] - before["RssAnon"]) / MB, 1),
            "file_peak_above_model_mb": round((peaks["RssFile"] - before["RssFile"]) / MB, 1),
            "seconds": round(seconds, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16000)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.tokens, args.model, args.threads)))
        return
    rows = []
    for variant in ("memory", "directory"):
        cmd = [
            sys.executable,
            __file__,
            "--one",
            variant,
            "--tokens",
            str(args.tokens),
            "--model",
            args.model,
            "--threads",
            str(args.threads),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    result = {"model": args.model, "threads": args.threads, "rows": rows}
    (RESULTS / "tier_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"Leaf tier build, {args.model}, one run per variant in a fresh process (peaks above the loaded model).",
        "",
        "| cache | tokens | tier MB | process memory peak (RssAnon) MB | file pages peak (RssFile) MB | build s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['tokens']:,} | {r['tier_mb']} | {r['anon_peak_above_model_mb']} | "
            f"{r['file_peak_above_model_mb']} | {r['seconds']} |"
        )
    (RESULTS / "tier_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
