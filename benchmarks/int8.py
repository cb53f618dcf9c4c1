"""int8 weights on the CPU against float32, in one run: compression time, decoding speed, accuracy.

    .venv/bin/python benchmarks/int8.py                                   # Qwen2.5-Coder-0.5B, 8k tokens
    .venv/bin/python benchmarks/int8.py --model smollm2-135m-instruct

Both engines load the same converted weights; one is quantized (``quantize="int8"``: torch's
dynamic int8 linear layers). Each compresses the same excerpt of the bundled novel (the order
alternates with ``--repeats``), then both answer every bundled question the excerpt holds, one
after the other, from their shared root. Decoding speed is the tokens after the first over the
time after the first token. Writes ``results/int8_<model>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from novel_qa import excerpt

from homer_integrations import HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.question_sets import question_set

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1, help="compressions per variant (alternating)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    engines = {
        q or "fp32": HomerModel.from_pretrained(args.model, quantize=q, progress=False, document_cache=DocumentCache())
        for q in (None, "int8")
    }
    qset = question_set()
    doc = excerpt(engines["fp32"], qset.document.read_text(encoding="utf-8"), args.tokens)
    asked = qset.within(len(doc)).questions
    compress: dict[str, list[float]] = {name: [] for name in engines}
    roots = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            engine.document_cache.clear()
            t0 = time.perf_counter()
            roots[name] = engine.compress(doc)
            compress[name].append(time.perf_counter() - t0)
            print(f"{name}: compressed in {compress[name][-1]:.1f}s", flush=True)

    rows: dict[str, list[dict]] = {name: [] for name in engines}
    for q in asked:
        for name, engine in engines.items():
            stream = engine.run(roots[name], q.question, mode="shared", max_new_tokens=args.max_new_tokens)
            answer = stream.text()
            info = stream.info
            decode_s = info.total_seconds - (info.time_to_first_token or 0)
            rows[name].append(
                {
                    "id": q.id,
                    "answer": answer,
                    "correct": q.check(answer),
                    "ttft": info.time_to_first_token,
                    "tokens": info.output_tokens,
                    "tokens_per_second": (info.output_tokens - 1) / decode_s if info.output_tokens > 1 else None,
                }
            )
            print(f"  {name} {q.id} {'ok' if rows[name][-1]['correct'] else 'NO'} {answer.strip()[:70]!r}", flush=True)

    summary = {}
    for name, rs in rows.items():
        speeds = [r["tokens_per_second"] for r in rs if r["tokens_per_second"]]
        summary[name] = {
            "compress_seconds": round(min(compress[name]), 1),
            "correct": sum(r["correct"] for r in rs),
            "questions": len(rs),
            "median_tokens_per_second": round(statistics.median(speeds), 2),
            "median_ttft": round(statistics.median(r["ttft"] for r in rs), 3),
        }
    ratio = {
        "decode_speedup": round(
            summary["int8"]["median_tokens_per_second"] / summary["fp32"]["median_tokens_per_second"], 2
        ),
        "compress_speedup": round(summary["fp32"]["compress_seconds"] / summary["int8"]["compress_seconds"], 2),
        "same_answer": sum(a["answer"] == b["answer"] for a, b in zip(rows["fp32"], rows["int8"], strict=True)),
    }
    out = {
        "model": args.model,
        "document_tokens": args.tokens,
        "threads": args.threads,
        "summary": summary,
        "int8_vs_fp32": ratio,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"int8_{args.model}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"summary": summary, "int8_vs_fp32": ratio}, indent=1))


if __name__ == "__main__":
    main()
