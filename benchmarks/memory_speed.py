"""Peak memory and wall time: plain prefill vs HOMER compression, each run in a fresh process.

    .venv/bin/python benchmarks/memory_speed.py                    # 4k..64k on SmolLM2
    .venv/bin/python benchmarks/memory_speed.py --tokens 4000 8000 # a subset

For every (method, length) a new Python process loads the model, reads the RSS after loading,
then prefills the whole document once (plain; K/V cache kept, last-position logits only) or
compresses it with HOMER, and reports its peak RSS (ru_maxrss), the working memory above the
loaded model, the engine's peak live K/V bytes, and the wall time. Results:
benchmarks/results/memory_speed.json and memory_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(method: str, tokens: int, model_name: str, threads: int) -> dict:
    import torch
    from transformers import DynamicCache

    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.homer.prompt import encode
    from homer_integrations.models import load_model
    from homer_integrations.paths import bundled_text

    torch.set_num_threads(threads)
    model, tok = load_model(model_name)
    engine = HomerModel(model, tok, HomerConfig(), model_name=model_name, progress=False)
    engine.tiers.calibration.bias()  # loaded from the package, not part of the measurement
    text = bundled_text("prideprejudice")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    reps = -(-tokens // len(ids))
    ids = (ids * reps)[:tokens]
    document = tok.decode(ids)
    layout = engine.prompting.layout("")
    base_rss = rss_now()
    start = time.perf_counter()
    row = {"method": method, "tokens": tokens, "model": model_name, "threads": threads}
    with torch.inference_mode():
        if method == "plain":
            full = torch.cat(
                [encode(tok, layout.prefix, first=True), encode(tok, document), encode(tok, layout.suffix)]
            )
            out = model(full[None], cache=DynamicCache(), use_cache=True, logits_to_keep=1)
            row["kv_bytes"] = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in out.cache.layers)
            row["prompt_tokens"] = full.numel()
        else:
            doc, *_ = engine.tiers.compress(layout.prefix, document, layout.suffix)
            row["kv_bytes"] = doc.stats.peak_kv_bytes
            row["cache_tokens"] = doc.num_tokens
            row["prompt_tokens"] = doc.stats.prompt_tokens
    row["seconds"] = time.perf_counter() - start
    row["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row["working_bytes"] = row["peak_rss"] - base_rss
    row["rss_after_load"] = base_rss
    return row


def cell(row: dict | None, key: str, scale: float = 1.0, digits: int = 0) -> str:
    """One table cell: ``row[key] * scale`` with ``digits`` decimals, or "-" where not measured."""
    return "-" if row is None else f"{row[key] * scale:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", nargs="*", type=int, default=[4000, 8000, 16000, 32000, 64000])
    ap.add_argument("--methods", nargs="*", default=["plain", "homer"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.model, args.threads)))
        return
    RESULTS.mkdir(exist_ok=True)
    # Runs add to (and replace rows of) earlier results, so long points can be measured separately.
    out_json = RESULTS / "memory_speed.json"
    old = json.loads(out_json.read_text()) if out_json.is_file() else []
    remeasured = {(args.model, m, t) for m in args.methods for t in args.tokens}
    rows = [r for r in old if (r["model"], r["method"], r["tokens"]) not in remeasured]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    for tokens in args.tokens:
        for method in args.methods:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    method,
                    str(tokens),
                    "--model",
                    args.model,
                    "--threads",
                    str(args.threads),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    rows.sort(key=lambda r: (r["model"], r["tokens"], r["method"]))
    out_json.write_text(json.dumps(rows, indent=1) + "\n")
    by = {(r["method"], r["tokens"]): r for r in rows if r["model"] == args.model}
    lines = [
        "| doc tokens | plain s | HOMER s | HOMER/plain time | plain peak RSS MB | HOMER peak RSS MB | "
        "plain working MB | HOMER working MB | plain K/V MB | HOMER peak live K/V MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    mb = 1 / 2**20
    for t in sorted({t for _, t in by}):
        p, h = by.get(("plain", t)), by.get(("homer", t))
        ratio = f"{h['seconds'] / p['seconds']:.2f}" if p and h else "-"
        lines.append(
            f"| {t} | {cell(p, 'seconds', digits=1)} | {cell(h, 'seconds', digits=1)} | {ratio} | "
            f"{cell(p, 'peak_rss', mb)} | {cell(h, 'peak_rss', mb)} | {cell(p, 'working_bytes', mb)} | "
            f"{cell(h, 'working_bytes', mb)} | {cell(p, 'kv_bytes', mb)} | {cell(h, 'kv_bytes', mb, 1)} |"
        )
    (RESULTS / "memory_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
