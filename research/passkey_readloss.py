"""Which setting reads a kept passkey back: ``query_aware`` passkey samples under HomerConfig variants.

    python research/passkey_readloss.py --device cuda --tokens 32000 --seed 1000
    python research/passkey_readloss.py --device cuda --seed 1100 --only default warmup_8 warmup_16

At 32k tokens on Qwen2.5-Coder-0.5B the key survives pruning in every sample and a plain prefill
over the kept tokens finds it, yet the compressed cache misses some (README "On a GPU"). Each
variant answers the same six samples; rows go to benchmarks/results/gpu/passkey_readloss_<tokens>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # passkey_lib
from passkey_lib import engine_for, make_sample, run_sample

from homer_integrations.engine.loading import load_model

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks

MODEL = "qwen2.5-coder-0.5b-instruct"
VARIANTS = {
    "default": {},
    "replay_flat": {"replay": "flat"},
    "paper_answer": {"reask_question": False},
    "cache_4096": {"final_cache_len": 4096},
    "mcl_2048": {"max_chunk_len": 2048},
    "warmup_16": {"warmup_layers": 16},
    "warmup_8": {"warmup_layers": 8},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=1000, help="first sample's seed (six samples at spread depths)")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), help="these variants only")
    args = ap.parse_args()
    model, tok = load_model(MODEL, dtype=getattr(torch, args.dtype), device=args.device)
    n = args.samples
    samples = [make_sample(tok, args.tokens, (i + 0.5) / n, seed=args.seed + i) for i in range(n)]
    out = RESULTS / "gpu" / f"passkey_readloss_{args.tokens}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, overrides in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        engine = engine_for(model, tok, MODEL, "query_aware", None, **overrides)
        start, marks = time.perf_counter(), ""
        for sample in samples:
            row = run_sample(engine, "query_aware", sample, diagnostics=name == "default")
            row |= {"variant": name, "dtype": args.dtype, "device": args.device}
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            marks += "1" if row["correct"] else "0"
        print(name, marks, f"{time.perf_counter() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
