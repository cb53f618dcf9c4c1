"""Passkey retrieval benchmark: plain prefill vs HOMER (query-aware, shared) on the shipped models.

    .venv/bin/python benchmarks/passkey.py run            # all points (hours on 2 CPU cores)
    .venv/bin/python benchmarks/passkey.py run --quick    # a smoke run
    .venv/bin/python benchmarks/passkey.py report         # JSON summary, PNG plot, markdown table

Each sample is appended to benchmarks/results/passkey_samples.jsonl as soon as it finishes and
skipped when the run is repeated, so a long run can be resumed. Samples: a 5-digit key at
evenly spread depths in a haystack cut from Pride and Prejudice at a seeded random offset.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from passkey_lib import engine_for, make_sample, run_sample

from homer_integrations.engine.loading import load_model

RESULTS = Path(__file__).parent / "results"
SAMPLES = RESULTS / "passkey_samples.jsonl"

# (model, lengths, methods): plain prefill is skipped past 32k (64k plain on a 0.5B model takes
# over 20 minutes per sample on 2 cores and is beyond the model's trained window anyway).
PLAN = {
    "smollm2-135m-instruct": ([1000, 2000, 4000, 8000, 16000, 32000], ["plain", "query_aware", "shared"]),
    "qwen2.5-coder-0.5b-instruct": ([8000, 16000, 32000], ["plain", "query_aware", "shared"]),
}
# Ablations run at the length where the default still finds keys, so a drop shows.
# name -> (HomerConfig fields and research switches (ablations.recipe_of), scoring ablation in ablations.py
# or None, [(model, tokens)], method)
PAPER_RECIPE = {"shared_scorer": "last_token", "pool_unit": "token", "score_pooling": 1, "score_memory": False}
"""The paper's last-token recipe, no units (its rows were measured before the reconstruction scorer became
the default, under which these units had changed nothing but the cache key)."""
ABLATIONS = {
    "paper_recipe": (
        PAPER_RECIPE,
        None,
        [("smollm2-135m-instruct", 4000), ("qwen2.5-coder-0.5b-instruct", 8000)],
        "shared",
    ),
    "no_calibration": ({}, "no_calibration", [("smollm2-135m-instruct", 4000)], "shared"),
    "random_pruning": ({}, "random_pruning", [("smollm2-135m-instruct", 4000)], "shared"),
    # explored earlier (README "Design and measurements"), none adopted as a default
    "sentence_units": ({}, "sentence_units", [("smollm2-135m-instruct", t) for t in (8000, 16000)], "shared"),
    "score_all_layers": ({}, "score_all_layers", [("smollm2-135m-instruct", t) for t in (4000, 8000, 16000)], "shared"),
    "chunk_2048": ({"max_chunk_len": 2048}, None, [("smollm2-135m-instruct", 16000)], "shared"),
    # the paper's query-aware answer: it starts from the root's last logits, the question is not asked again
    "paper_answer": (
        {"reask_question": False},
        None,
        [(m, t) for m, (ts, _) in PLAN.items() for t in ts],
        "query_aware",
    ),
}


def done_keys() -> set[tuple]:
    if not SAMPLES.is_file():
        return set()
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    return {(r["model"], r["variant"], r["method"], r["tokens"], r["seed"]) for r in rows}


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    RESULTS.mkdir(exist_ok=True)
    done = done_keys()
    jobs = []
    for model_name, (lengths, methods) in PLAN.items():
        if args.models and model_name not in args.models:
            continue
        for tokens in args.lengths or (lengths[:1] if args.quick else lengths):
            for method in methods:
                if not args.methods or method in args.methods:
                    jobs.append((model_name, args.variant, {}, None, method, tokens))
    if not args.quick and not args.no_ablations:
        for name, (overrides, scoring, points, method) in ABLATIONS.items():
            for model_name, tokens in points:
                if (args.models and model_name not in args.models) or (args.lengths and tokens not in args.lengths):
                    continue
                if args.methods and method not in args.methods:
                    continue
                jobs.append((model_name, name, overrides, scoring, method, tokens))
    loaded: dict[str, tuple] = {}
    n = 2 if args.quick else args.samples
    # Rows from another device or precision are their own variant, beside the CPU fp32 ones.
    where = "" if (args.device, args.dtype) == ("cpu", "float32") else f"@{args.device}-{args.dtype}"
    for model_name, name, overrides, scoring, method, tokens in jobs:
        variant = name + where
        if model_name not in loaded:
            loaded.clear()
            loaded[model_name] = load_model(model_name, dtype=getattr(torch, args.dtype), device=args.device)
        model, tok = loaded[model_name]
        mode = "shared" if method == "plain" else method
        engine = engine_for(model, tok, model_name, mode, scoring, **overrides)
        for i in range(n):
            seed = 1000 + args.seed_offset + i
            if (model_name, variant, method, tokens, seed) in done:
                continue
            sample = make_sample(tok, tokens, (i + 0.5) / n, seed=seed)
            row = run_sample(engine, method, sample, diagnostics=method != "plain")
            row |= {"model": model_name, "variant": variant, "threads": args.threads, "device": args.device}
            with SAMPLES.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"{model_name} {variant} {method} {tokens}: {'ok ' if row['correct'] else 'MISS'} "
                f"{row['answer']!r} ({row['seconds']:.0f}s)",
                flush=True,
            )


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(_: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["variant"], r["method"], r["tokens"])].append(r)
    summary = []
    for (model, variant, method, tokens), rs in sorted(groups.items()):
        entry = {
            "model": model,
            "variant": variant,
            "method": method,
            "tokens": tokens,
            "samples": len(rs),
            "accuracy": sum(r["correct"] for r in rs) / len(rs),
            "mean_seconds": sum(r["seconds"] for r in rs) / len(rs),
        }
        if method != "plain":
            entry["key_survived"] = sum(r["key_survived"] for r in rs) / len(rs)
            entry["retained_plain_accuracy"] = sum(r["retained_plain_correct"] for r in rs) / len(rs)
            entry["cache_tokens"] = max(r["cache_tokens"] for r in rs)
        summary.append(entry)
    (RESULTS / "passkey.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "| model | variant | method | doc tokens | n | accuracy | key survived | plain over kept tokens "
        "| cache tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['variant']} | {e['method']} | {e['tokens']} | {e['samples']} | {e['accuracy']:.2f} | "
            f"{fmt(e.get('key_survived'))} | {fmt(e.get('retained_plain_accuracy'))} | "
            f"{e.get('cache_tokens', '-')} |"
        )
    (RESULTS / "passkey.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(summary)


def plot(summary: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({e["model"] for e in summary})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for method, style in (("plain", "k--o"), ("query_aware", "b-s"), ("shared", "g-^")):
            pts = sorted(
                (e["tokens"], e["accuracy"])
                for e in summary
                if e["model"] == model and e["method"] == method and e["variant"] == "default"
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=method)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"passkey retrieval: {model}")
        ax.set_xlabel("document tokens")
        ax.set_ylabel("accuracy")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "passkey.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--samples", type=int, default=10)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="start at seed 1000+OFFSET: adds a second evenly spread set of depths to a point already measured",
    )
    r.add_argument("--models", nargs="*")
    r.add_argument("--lengths", nargs="*", type=int, help="these lengths instead of the plan's")
    r.add_argument("--device", default="cpu", help="cpu, cuda, ...: rows get the variant suffix @DEVICE-DTYPE")
    r.add_argument("--dtype", default="float32", help="torch dtype name: float32, bfloat16, float16")
    r.add_argument("--methods", nargs="*", choices=["plain", "query_aware", "shared"])
    r.add_argument(
        "--variant",
        default="default",
        help="the label of the package-default rows (a new label runs the plan's points again beside older defaults)",
    )
    r.add_argument("--no-ablations", action="store_true")
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
