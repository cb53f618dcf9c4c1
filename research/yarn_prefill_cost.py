"""Probe: what a plain prefill of a whole novel with RoPE scaling (YaRN) costs on this machine.

    .venv/bin/python research/yarn_prefill_cost.py [--book northangerabbey] [--tokens 12288] [--chunk 2048]

Issue 65 asks for plain prefill with RoPE scaling as a whole-book baseline "where it fits in memory and
time". Qwen2.5-Coder-1.5B (bfloat16) with YaRN at factor 4 (32k -> 128k positions, the scaling Qwen's
model cards give for long inputs) prefills the first ``tokens`` tokens of a bundled novel ``chunk`` tokens
at a time into one ``DynamicCache``, as a long-context server would. Each chunk's time grows with the
context before it (attention); a least-squares line through (context, seconds) extrapolates the prefill
of the whole book. The book's K/V would take 28 KiB a token in bfloat16 (3 GB for 106k tokens): memory
is not what stops it. Results: ``benchmarks/results/yarn_prefill_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import DynamicCache
from yarn_prefill_qa import yarn_model

from homer_integrations.engine.loading import QWEN25_CODER_15B, load_embedded

DATA = Path(__file__).resolve().parents[1] / "homer_integrations" / "data"
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "yarn_prefill_cost.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="northangerabbey")
    parser.add_argument("--tokens", type=int, default=12288)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _, tokenizer = load_embedded(QWEN25_CODER_15B, torch.bfloat16)  # converts once if needed
    model = yarn_model()
    config = model.config
    ids = tokenizer((DATA / f"{args.book}.txt").read_text(encoding="utf-8"), return_tensors="pt").input_ids
    book_tokens = ids.shape[1]
    cache, chunks = DynamicCache(), []
    with torch.inference_mode():
        for start in range(0, min(args.tokens, book_tokens), args.chunk):
            began = time.perf_counter()
            model(ids[:, start : start + args.chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
            chunks.append({"context": start, "tokens": min(args.chunk, book_tokens - start)})
            chunks[-1]["seconds"] = round(time.perf_counter() - began, 2)
            print(chunks[-1], flush=True)
    x = torch.tensor([c["context"] for c in chunks], dtype=torch.float64)
    y = torch.tensor([c["seconds"] for c in chunks], dtype=torch.float64)
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    base = float(y.mean() - slope * x.mean())
    whole = sum(base + slope * s for s in range(0, book_tokens, args.chunk))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    result = {
        "model": QWEN25_CODER_15B.name,
        "dtype": "bfloat16",
        "rope": config.rope_parameters,
        "book": args.book,
        "book_tokens": book_tokens,
        "chunk": args.chunk,
        "threads": args.threads,
        "chunks": chunks,
        "seconds_per_chunk_at_no_context": round(base, 2),
        "seconds_per_chunk_per_1k_context": round(slope * 1000, 3),
        "whole_book_prefill_seconds_extrapolated": round(whole),
        "kv_bytes_per_token": 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2,
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"whole book ({book_tokens:,} tokens): about {whole / 3600:.1f} h of prefill; {RESULTS}")


if __name__ == "__main__":
    main()
