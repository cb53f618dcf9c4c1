"""What LlamaIndex adds: five queries through ``HomerQueryEngine`` vs the same work on ``HomerModel``.

Both sides use the same loaded model, each with its own fresh document cache, on the same
excerpt of the bundled Pride and Prejudice, greedy decoding and the same questions:

- direct: one ``HomerModel.compress`` then five ``HomerModel.run`` on the compressed document;
- llama_index: five ``HomerQueryEngine.query`` (the first compresses, the rest reuse the cache).

Target (issue 5): llama_index total <= 1.5 x direct total. The sides run ``--rounds`` times,
alternating, and the ratio uses each side's fastest round (the machine is shared and noisy).

    .venv/bin/python benchmarks/llama_index_overhead.py            # 16k-token document
    .venv/bin/python benchmarks/llama_index_overhead.py --tokens 2000   # quick

Writes benchmarks/results/llama_index_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads yield the CPU

import torch
from llama_index.core.schema import Document

from homer_integrations import HomerModel
from homer_integrations.llama_index import HomerLLM, HomerQueryEngine
from homer_integrations.paths import bundled_text

RESULTS = Path(__file__).parent / "results" / "llama_index_overhead.json"
QUESTIONS = [
    "Who has taken Netherfield Park?",
    "What does Mrs. Bennet want for her daughters?",
    "Who is Mr. Darcy?",
    "What happens at the ball?",
    "Which sister is the most beautiful?",
]
TARGET_RATIO = 1.5


def fresh_engine(base: HomerModel) -> HomerModel:
    """A new engine (new, empty document cache) over the already loaded model."""
    return HomerModel(base.model, base.tokenizer, base.config, model_name=base.model_name, progress=False)


def run_direct(base: HomerModel, text: str, max_new_tokens: int) -> dict[str, Any]:
    engine = fresh_engine(base)
    started = time.perf_counter()
    doc = engine.compress(text)
    compress_seconds = time.perf_counter() - started
    answers, seconds = [], []
    for question in QUESTIONS:
        t = time.perf_counter()
        answers.append(engine.run(doc, question, max_new_tokens=max_new_tokens).text())
        seconds.append(time.perf_counter() - t)
    return {
        "total_seconds": time.perf_counter() - started,
        "compress_seconds": compress_seconds,
        "answer_seconds": seconds,
        "compressions": engine.document_cache.stats().computations,
        "answers": answers,
    }


def run_llama_index(base: HomerModel, text: str, max_new_tokens: int) -> dict[str, Any]:
    engine = fresh_engine(base)
    query_engine = HomerQueryEngine(
        [Document(text=text, id_="doc")], HomerLLM(engine=engine, num_output=max_new_tokens)
    )
    started = time.perf_counter()
    answers, seconds, sources = [], [], []
    for question in QUESTIONS:
        t = time.perf_counter()
        response = query_engine.query(question)
        seconds.append(time.perf_counter() - t)
        answers.append(str(response))
        sources.append(response.source_nodes[0].node.metadata["homer"]["cache_source"])
    return {
        "total_seconds": time.perf_counter() - started,
        "query_seconds": seconds,
        "cache_sources": sources,
        "compressions": engine.document_cache.stats().computations,
        "answers": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16_000, help="document length in model tokens")
    parser.add_argument("--model", default=None, help="local path, hub id or embedded name (default: embedded)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per side; the fastest counts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    base = HomerModel.from_pretrained(args.model, progress=False)
    novel = bundled_text("prideprejudice")
    start = novel.index("It is a truth universally acknowledged")
    text = base.tokenizer.decode(base.token_ids(novel[start:])[: args.tokens])
    base.generate(base.chat_prompt([{"role": "user", "content": "Hello"}]), max_new_tokens=2).text()  # warm-up

    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        direct = run_direct(base, text, args.max_new_tokens)
        llama = run_llama_index(base, text, args.max_new_tokens)
        rounds.append({"direct": direct, "llama_index": llama})
        print(
            f"round {i + 1}: direct {direct['total_seconds']:.1f}s (compress {direct['compress_seconds']:.1f}s), "
            f"llama_index {llama['total_seconds']:.1f}s; "
            f"compressions {direct['compressions']} / {llama['compressions']}",
            flush=True,
        )
    best_direct = min(r["direct"]["total_seconds"] for r in rounds)
    best_llama = min(r["llama_index"]["total_seconds"] for r in rounds)
    ratio = best_llama / best_direct
    result = {
        "benchmark": "llama_index_overhead",
        "model": base.model_name,
        "document_tokens": base.count_tokens(text),
        "max_chunk_len": base.config.max_chunk_len,
        "questions": len(QUESTIONS),
        "max_new_tokens": args.max_new_tokens,
        "rounds": rounds,
        "direct_seconds": best_direct,
        "llama_index_seconds": best_llama,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "same_answers": all(r["direct"]["answers"] == r["llama_index"]["answers"] for r in rounds),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "device": str(base.model.device),
            "dtype": str(base.model.dtype),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        f"{result['document_tokens']} tokens, {len(QUESTIONS)} questions: direct {best_direct:.1f}s, "
        f"llama_index {best_llama:.1f}s, ratio {ratio:.2f} (target <= {TARGET_RATIO}); "
        f"same answers: {result['same_answers']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
