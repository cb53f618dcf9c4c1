"""Host-side cost of one query-aware question: every leaf scored in one batched pass vs leaf by leaf.

On a GPU the per-question path is bound by kernel launches and Python, not arithmetic (H100, RULER
32k at 16x: 0.69 s a question against 0.72 s for the whole leaf tier). That floor is measurable on a
CPU with a model of Qwen2.5-Coder-0.5B's depth (24 layers) but tiny widths (hidden 64, 2 query heads
and 1 KV head of 8): every module call and tensor op is the same, the arithmetic small (what remains
is mostly the re-read's attention maps, the same in both variants).
Random weights, SmolLM2's tokenizer, the bundled novel; the engine's own settings as RULER runs them
(``ruler.chunk_length``). Both variants answer the same questions alternately in one process; the
first question, which builds the tier, is not timed.

    .venv/bin/python benchmarks/question_overhead.py              # about 2 minutes

Writes benchmarks/results/question_overhead.json and .md (``--device cuda``: question_overhead_cuda.*).
The real model's GPU timings come from ``ruler.py`` on the device machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
RESULTS = Path(__file__).parent / "results"
POINTS = ((8192, 4), (16384, 8), (32768, 16))
QUESTIONS = ("Who is Mr. Darcy?", "Where is Netherfield?", "How many sisters are there?", "Who is Lydia?")


def tiny_qwen(device: str = "cpu") -> tuple[Any, Any]:
    """Qwen2.5-0.5B's depth (24 layers) at tiny widths, random weights, and SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from homer_integrations.engine.loading import SMOLLM2, load_embedded

    saved = os.environ.get("HOMER_TEST_TOKENIZER")  # the device machine's copy (scripts/device/setup.sh)
    tok = AutoTokenizer.from_pretrained(saved) if saved else load_embedded(SMOLLM2)[1]
    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=2)
    config = Qwen2Config(vocab_size=len(tok), num_key_value_heads=1, head_dim=8, max_position_embeddings=65536, **shape)
    return Qwen2ForCausalLM(config).eval().to(device), tok


def ask_query_aware(engine: Any, document: str, question: str) -> Any:
    """One query-aware question of ``document`` (the tier built or reused), one new token; its AnswerInfo."""
    from homer_integrations.homer.decoding.generation import GenerationOptions

    lay = engine.prompting.layout(question, mode="query_aware")
    stream = engine.answerer.answer_span(
        lay.prefix, document, lay.suffix, lay.continuation, GenerationOptions(max_new_tokens=1),
        question=question, mode="query_aware",
    )  # fmt: skip
    stream.text()
    return stream.info


def one_point(tokens: int, ratio: int, repeats: int, device: str = "cpu") -> dict:
    from ruler import chunk_length

    import homer_integrations.homer.tree.flat as flat
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.engine.answering import AnswerInfo
    from homer_integrations.paths import bundled_excerpt

    model, tok = tiny_qwen(device)
    budget = tokens // ratio
    settings = HomerConfig(max_chunk_len=chunk_length(tokens, budget), final_cache_len=budget, mode="query_aware")
    engine = HomerModel(model, tok, settings, model_name="qwen2-shape-tiny", progress=False)
    document = bundled_excerpt(tok, tokens)

    def ask(question: str) -> AnswerInfo:
        return ask_query_aware(engine, document, question)

    leaves = ask("Who is Elizabeth?").compression.leaves  # builds the tier
    batchable = flat.batchable
    seconds: dict[str, list[float]] = {"batched": [], "leaf_by_leaf": []}
    try:
        for i in range(repeats):
            for variant in ("batched", "leaf_by_leaf") if i % 2 == 0 else ("leaf_by_leaf", "batched"):
                flat.batchable = batchable if variant == "batched" else lambda *_: False
                seconds[variant].append(ask(QUESTIONS[i % len(QUESTIONS)]).time_to_first_token)
    finally:
        flat.batchable = batchable
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "tokens": tokens,
        "ratio": ratio,
        "leaves": leaves,
        "max_chunk_len": settings.max_chunk_len,
        "questions": repeats,
        "seconds": seconds,
        "median_batched": medians["batched"],
        "median_leaf_by_leaf": medians["leaf_by_leaf"],
        "batched_over_leaf_by_leaf": medians["batched"] / medians["leaf_by_leaf"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="questions per variant and point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cuda: the launch-bound case itself")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    started = time.time()
    rows = [one_point(tokens, ratio, args.repeats, args.device) for tokens, ratio in POINTS]
    for r in rows:
        print(f"{r['tokens']} x{r['ratio']}: {r['median_batched']:.3f} s vs {r['median_leaf_by_leaf']:.3f} s")
    result = {
        "device": args.device,
        "threads": args.threads,
        "wall_seconds": round(time.time() - started, 1),
        "points": rows,
    }
    name = "question_overhead" if args.device == "cpu" else f"question_overhead_{args.device}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "Host-side time to first token of a query-aware question (Qwen2.5-0.5B's 24 layers at tiny widths, "
        f"random weights; {args.device}, {args.threads} thread; median of {args.repeats} questions per variant, "
        "alternated).",
        "",
        "| tokens | ratio | leaves | batched s | leaf by leaf s | batched / leaf by leaf |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']:,} | {r['ratio']}x | {r['leaves']} | {r['median_batched']:.3f} | "
            f"{r['median_leaf_by_leaf']:.3f} | {r['batched_over_leaf_by_leaf']:.2f} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
