"""Decoding speed from a compressed cache: our loop (``homer/generation.decode``) vs ``model.generate()``.

Both decode greedily from copies of the same compressed document cache, after the same question
tokens, the same number of new tokens (``generate`` is held to the count our loop produced with
``min_new_tokens``). Tokens per second count the tokens after the first (the question's prefill is
timed apart as time to first token). Runs alternate between the two, ``--repeats`` times each.

    .venv/bin/python benchmarks/decode_speed.py                       # SmolLM2, 4k-token document
    .venv/bin/python benchmarks/decode_speed.py --model qwen2.5-coder-0.5b-instruct

Writes benchmarks/results/decode_speed_<model>.json. The issue's target: ours >= 1.0x generate().
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"
QUESTION = "Tell the story of this passage in detail, scene by scene."


class Clock:
    """A logits processor that only notes when ``generate()`` asks for each next token's scores."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def ours(engine: Any, doc: Any, question: torch.Tensor, tokens: int) -> dict[str, float]:
    from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode

    state = DecodeState()
    options = GenerationOptions(max_new_tokens=tokens)
    started = time.perf_counter()
    for _ in decode(engine.model, engine.tokenizer, doc.to_cache(), question, doc.last_position + 1, options, state):
        pass
    total = time.perf_counter() - started
    first = state.first_token_seconds or 0.0
    n = len(state.token_ids)
    return {"tokens": n, "first_token_s": first, "tokens_per_s": (n - 1) / (total - first)}


def generate(engine: Any, doc: Any, question: torch.Tensor, tokens: int) -> dict[str, float]:
    from transformers import LogitsProcessorList

    cache = doc.to_cache()
    cached = cache.get_seq_length()
    input_ids = torch.cat([torch.zeros(cached, dtype=torch.long), question])[None]
    clock = Clock()
    started = time.perf_counter()
    out = engine.model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        cache=cache,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        do_sample=False,
        logits_processor=LogitsProcessorList([clock]),
        pad_token_id=engine.tokenizer.eos_token_id,
    )
    total = time.perf_counter() - started
    n = out.shape[1] - input_ids.shape[1]
    first = clock.times[0] - started
    return {"tokens": n, "first_token_s": first, "tokens_per_s": (n - 1) / (total - first)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=4000, help="document tokens (an excerpt of a bundled novel)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)

    from homer_integrations import HomerModel
    from homer_integrations.homer.document.prompt import encode
    from homer_integrations.paths import bundled_text

    engine = HomerModel.from_pretrained(args.model, progress=False, store=False)
    ids = engine.tokenizer(bundled_text("prideprejudice"), add_special_tokens=False)["input_ids"]
    text = engine.tokenizer.decode(ids[2000 : 2000 + args.tokens])
    doc = engine.compress(text)
    # what follows the cached document (the shared root, compressed without a question) when a user asks:
    # the question in the chat template, the assistant's turn
    question = encode(engine.tokenizer, engine.prompting.layout(QUESTION, "shared").continuation, formatted=True)

    runs: dict[str, list[dict[str, float]]] = {"ours": [], "generate": []}
    for _ in range(args.repeats):
        runs["ours"].append(ours(engine, doc, question, args.new_tokens))
        n = runs["ours"][-1]["tokens"]
        runs["generate"].append(generate(engine, doc, question, n))
        print(f"ours {runs['ours'][-1]}  generate {runs['generate'][-1]}", file=sys.stderr, flush=True)
    median = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    result = {
        "model": args.model,
        "document_tokens": doc.stats.document_tokens,
        "cache_tokens": doc.stats.cache_tokens,
        "question": QUESTION,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "runs": runs,
        "tokens_per_s_median": {k: round(v, 2) for k, v in median.items()},
        "ours_vs_generate": round(median["ours"] / median["generate"], 3),
    }
    out = RESULTS / f"decode_speed_{args.model}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("tokens_per_s_median", "ours_vs_generate")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
