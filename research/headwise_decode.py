"""What a head-wise root costs a question: reading a question and decoding from a ragged cache vs a dense one.

Both caches hold the same K/V bytes: the dense root ``budget`` tokens in every head, the head-wise root
``L * Hkv * budget`` (layer, head, token) triples spread over the heads log-normally, clipped to the
candidates (2x the budget), about as a RULER sample spread them (59 to 3,643 tokens at a mean of 971).
The K/V values are random: attention's cost does not depend on them. The same question tokens are
read, then ``--tokens`` tokens decoded greedily as ``homer.decoding.generation.decode`` does, the two caches
alternating ``--repeats`` times in one process; reported as medians and the head-wise/dense ratio.

    .venv/bin/python research/headwise_decode.py                     # Qwen2.5-Coder-0.5B, budgets 1024, 2048
    .venv/bin/python research/headwise_decode.py --device cuda

Writes benchmarks/results/headwise_decode[_cuda].json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks
MODEL = "qwen2.5-coder-0.5b-instruct"


def spread(layers: int, heads: int, budget: int, generator: torch.Generator) -> torch.Tensor:
    """Per (layer, head) counts [L, Hkv] in [16, 2 x budget] (a head keeps at most the candidates)
    summing to ``L * Hkv * budget``, log-normally spread."""
    target, cap = layers * heads * budget, 2 * budget
    counts = torch.randn(layers, heads, generator=generator).mul(1.2).exp()
    for _ in range(50):  # rescale, clip, repeat: converges to the target sum within the bounds
        counts = (counts * target / counts.sum()).clamp(16, cap)
    counts = counts.floor().long()
    counts.view(-1)[counts.view(-1).argmin()] += target - int(counts.sum())
    return counts


@torch.inference_mode()
def time_answer(model, cache, question: torch.Tensor, start: int, tokens: int) -> dict[str, float]:
    """Read ``question`` [q] after ``cache`` at positions ``start..``, then ``tokens`` greedy steps (no
    early stop: random caches end an answer anywhere), as ``homer.decoding.generation.decode`` calls the model."""
    device = model.device
    began = time.perf_counter()
    positions = torch.arange(start, start + question.numel(), device=device)[None]
    logits = model(input_ids=question.to(device)[None], position_ids=positions, cache=cache, logits_to_keep=1).logits
    token, first = int(logits[0, -1].argmax()), time.perf_counter() - began
    position = start + question.numel()
    for _ in range(tokens):
        ids, at = torch.tensor([[token]], device=device), torch.tensor([[position]], device=device)
        token, position = int(model(input_ids=ids, position_ids=at, cache=cache).logits[0, -1].argmax()), position + 1
    total = time.perf_counter() - began
    return {"first_token_s": first, "ms_per_token": 1000 * (total - first) / tokens}


def one_budget(model, budget: int, args: argparse.Namespace) -> dict:
    from homer_integrations.homer.kv.dynamic import cache_from_tensors
    from homer_integrations.homer.kv.headwise import headwise_cache, register_headwise_attention

    register_headwise_attention(model)  # both caches run through it: dense ones reach SDPA unchanged
    config = model.config
    layers, heads = config.num_hidden_layers, config.num_key_value_heads
    dim = config.hidden_size // config.num_attention_heads
    g = torch.Generator().manual_seed(0)
    dtype, device = model.dtype, model.device
    dense_k = [torch.randn(1, heads, budget, dim, generator=g).to(device, dtype) for _ in range(layers)]
    dense_v = [torch.randn(1, heads, budget, dim, generator=g).to(device, dtype) for _ in range(layers)]
    lengths = spread(layers, heads, budget, g)
    flat_k = [torch.randn(int(n.sum()), dim, generator=g).to(device, dtype) for n in lengths]
    flat_v = [torch.randn(int(n.sum()), dim, generator=g).to(device, dtype) for n in lengths]
    question = torch.randint(100, 20000, (args.question_tokens,), generator=g)
    runs: dict[str, list[dict[str, float]]] = {"dense": [], "headwise": []}
    for repeat in range(args.repeats + 1):  # the first round warms up and is dropped
        for name in runs:
            cache = cache_from_tensors(dense_k, dense_v) if name == "dense" else headwise_cache(flat_k, flat_v, lengths)
            result = time_answer(model, cache, question, budget, args.tokens)
            if repeat:
                runs[name].append(result)
    out: dict = {"budget": budget, "head_lengths_min": int(lengths.min()), "head_lengths_max": int(lengths.max())}
    for name, rows in runs.items():
        for field in ("first_token_s", "ms_per_token"):
            out[f"{name}_{field}"] = round(statistics.median(r[field] for r in rows), 4)
    for field in ("first_token_s", "ms_per_token"):
        out[f"ratio_{field}"] = round(out[f"headwise_{field}"] / out[f"dense_{field}"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--question-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from homer_integrations.engine.loading import load_model

    torch.set_num_threads(args.threads)
    model, _ = load_model(MODEL, dtype="float32" if args.device == "cpu" else "bfloat16", device=args.device)
    points = [one_budget(model, budget, args) for budget in args.budgets]
    result = {
        "model": MODEL,
        "device": args.device,
        "threads": args.threads,
        "repeats": args.repeats,
        "tokens": args.tokens,
        "question_tokens": args.question_tokens,
        "machine": platform.processor() or platform.machine(),
        "points": points,
    }
    suffix = "" if args.device == "cpu" else f"_{args.device.split(':')[0]}"
    path = RESULTS / f"headwise_decode{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(points, indent=1))


if __name__ == "__main__":
    main()
