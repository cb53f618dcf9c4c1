"""Where a query-aware question's time goes: a cProfile of one question answered from a cached leaf tier.

The GPU's per-question first token (RULER 32k, H100, fp32) is 0.44 s against a 0.72 s leaf tier, 0.38
of a query-aware compression from scratch where the two-tier issue asks at most 0.30; the CPU's
tiny-width model puts most of it in the re-read of the kept tokens. This profiles the real model
(or ``--tiny``: ``question_overhead.tiny_qwen``) on the bundled novel: two warm-up questions (the
first builds the tier), then one profiled question; on a GPU every timed step ends with a
synchronize, so the profile's time is the question's.

    .venv/bin/python research/question_profile.py --tiny --tokens 8192 --ratio 4     # about 1 minute
    python3 research/question_profile.py --device cuda                                # scripts/device

Writes benchmarks/results/question_profile_<device>.txt (the first token's seconds, then the 30
functions with the most cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # question_overhead, ruler
from question_overhead import RESULTS, ask_query_aware, tiny_qwen

QUESTIONS = ("Who is Elizabeth?", "Who is Jane?", "Where is Netherfield?")


def profile_question(tokens: int, ratio: int, device: str, tiny: bool, dtype: str) -> str:
    """The report: settings, the profiled question's first-token seconds and its cumulative profile."""
    import torch
    from ruler import MODEL, chunk_length

    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.engine.loading import load_model
    from homer_integrations.paths import bundled_excerpt

    model, tok = tiny_qwen(device) if tiny else load_model(MODEL, dtype=getattr(torch, dtype), device=device)
    budget = tokens // ratio
    settings = HomerConfig(max_chunk_len=chunk_length(tokens, budget), final_cache_len=budget, mode="query_aware")
    engine = HomerModel(model, tok, settings, model_name="qwen2-shape-tiny" if tiny else MODEL, progress=False)
    document = bundled_excerpt(tok, tokens)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def ask(question: str) -> float:
        ttft = ask_query_aware(engine, document, question).time_to_first_token
        sync()
        return ttft

    tier_start = time.perf_counter()
    ask(QUESTIONS[0])  # builds the tier
    tier_seconds = time.perf_counter() - tier_start
    warm = ask(QUESTIONS[1])
    profiler = cProfile.Profile()
    profiler.enable()
    ttft = ask(QUESTIONS[2])
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
    name = "Qwen2.5-0.5B's 24 layers at tiny widths, random weights" if tiny else f"{MODEL}, {dtype}"
    head = (
        f"{name}; {device}; {tokens} tokens at {ratio}x (max_chunk_len {settings.max_chunk_len}); "
        f"tier and first question {tier_seconds:.2f} s; warm question first token {warm:.3f} s; "
        f"profiled question first token {ttft:.3f} s (under the profiler)\n"
    )
    return head + out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--ratio", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tiny", action="store_true", help="the tiny-width model instead of the shipped one")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    report = profile_question(args.tokens, args.ratio, args.device, args.tiny, args.dtype)
    suffix = "_tiny" if args.tiny else ""
    path = RESULTS / f"question_profile_{args.device.split(':')[0]}{suffix}.txt"
    path.write_text(report)
    print(report[:4000])


if __name__ == "__main__":
    main()
