"""Decoding over a long kept cache: transformers' ``DynamicCache`` against the package's ``KeptLayer``.

    .venv/bin/python benchmarks/kept_decode.py                      # the demo model, 2k-32k cached tokens
    .venv/bin/python benchmarks/kept_decode.py --tokens 2048 8192 --steps 8

For each cache length K the same K/V (random, in the model's dtype: the cost of a step does not depend on
the values) back both caches. A question of ``--question`` tokens is fed (its time is the first token's
after a kept document), then ``--steps`` single-token steps are timed, alternating the two caches
``--repeats`` times. The bandwidth limit of a step is the bytes it must read (every weight once, the
cache's K/V once) over the rate this machine reads a matrix in a matrix-vector product (1 GiB, the
model's dtype). Writes
``benchmarks/results/kept_decode.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from homer_integrations.engine.loading import DEFAULT_MODEL, load_model
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.kv.headwise import register_headwise_attention
from homer_integrations.homer.kv.kept import kept_cache

RESULTS = Path(__file__).parent / "results"


def read_bandwidth(dtype: torch.dtype, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second this process reads a matrix in a matrix-vector product (what a decoding step does
    with every weight): the best of ``repeats`` products of a ``gib`` GiB [n, 1536] matrix of ``dtype``."""
    width = 1536
    rows = int(gib * (1 << 30)) // (width * torch.finfo(dtype).bits // 8)
    matrix, vector = torch.randn(rows, width).to(dtype), torch.randn(width, 1).to(dtype)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        matrix @ vector
        best = min(best, time.perf_counter() - started)
    return matrix.numel() * matrix.element_size() / best


def timed(model, cache, start: int, question: int, steps: int) -> tuple[float, list[float]]:
    """Seconds to read ``question`` tokens after ``cache`` (at ``start``), and each of ``steps`` steps after."""
    ids = torch.arange(1000, 1000 + question)[None]
    with torch.inference_mode():
        began = time.perf_counter()
        model(input_ids=ids, position_ids=torch.arange(start, start + question)[None], cache=cache, logits_to_keep=1)
        first = time.perf_counter() - began
        times = []
        for i in range(steps):
            position = torch.tensor([[start + question + i]])
            began = time.perf_counter()
            model(input_ids=torch.tensor([[2000 + i]]), position_ids=position, cache=cache)
            times.append(time.perf_counter() - began)
    return first, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 16384, 32768])
    p.add_argument("--question", type=int, default=40)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "kept_decode.json")
    args = p.parse_args()
    model, _ = load_model(args.model, dtype="auto")
    register_headwise_attention(model)
    c, dtype = model.config, model.dtype
    kv_heads, head_dim = c.num_key_value_heads, c.hidden_size // c.num_attention_heads
    weights = sum({t.data_ptr(): t.numel() * t.element_size() for t in model.parameters()}.values())
    bandwidth = read_bandwidth(dtype)
    rows = []
    for tokens in args.tokens:
        g = torch.Generator().manual_seed(tokens)
        shape = (1, kv_heads, tokens, head_dim)
        keys = [torch.randn(shape, generator=g).to(dtype) for _ in range(c.num_hidden_layers)]
        values = [torch.randn(shape, generator=g).to(dtype) for _ in range(c.num_hidden_layers)]
        kv_bytes = 2 * sum(k.numel() * k.element_size() for k in keys)
        limit = (weights + kv_bytes) / bandwidth
        measured: dict[str, dict[str, list[float]]] = {
            "dynamic": {"first": [], "step": []},
            "kept": {"first": [], "step": []},
        }
        for _ in range(args.repeats):
            for name in measured:
                cache = (
                    cache_from_tensors(keys, values)
                    if name == "dynamic"
                    else kept_cache(keys, values, args.question + args.steps)
                )
                first, steps = timed(model, cache, tokens, args.question, args.steps)
                measured[name]["first"].append(first)
                measured[name]["step"].extend(steps[1:])  # the first step warms the tail's pages
        row = {"tokens": tokens, "kv_bytes": kv_bytes, "limit_s": limit}
        for name, m in measured.items():
            row[name] = {
                "question_s": statistics.median(m["first"]),
                "step_s": statistics.median(m["step"]),
                "steps": len(m["step"]),
                "x_limit": statistics.median(m["step"]) / limit,
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del keys, values
    report = {
        "model": args.model,
        "dtype": str(dtype),
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "weights_bytes": weights,
        "read_bandwidth_gbs": bandwidth / 1e9,
        "question_tokens": args.question,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Decoding over a kept cache ({args.model}, {dtype}, {report['threads']} threads)",
        "",
        f"Read bandwidth {report['read_bandwidth_gbs']:.1f} GB/s; weights {weights / 1e9:.2f} GB. Medians of "
        f"{rows[0]['kept']['steps']} steps and {args.repeats} questions of {args.question} tokens per cache.",
        f"`python benchmarks/kept_decode.py --tokens {' '.join(map(str, args.tokens))}`",
        "",
        "| cached tokens | K/V | bandwidth limit | step, DynamicCache | step, kept | kept / limit "
        "| question, DynamicCache | question, kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, k = r["dynamic"], r["kept"]
        lines.append(
            f"| {r['tokens']:,} | {r['kv_bytes'] / 1e9:.2f} GB | {r['limit_s']:.3f} s | {d['step_s']:.3f} s | "
            f"{k['step_s']:.3f} s | {k['x_limit']:.2f}x | {d['question_s']:.2f} s | {k['question_s']:.2f} s |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
