"""Probe: which layers' attention cites a lookup's evidence, and does a question-less baseline remove the
document's first and last paragraphs that every answer otherwise cites (attention sink, recency)?

    .venv/bin/python research/sources_bias.py [--chars 80000] [--questions 8] [--split tuning]

The first ``--chars`` of Northanger Abbey kept whole (``full``; stored by benchmarks/sources.py), the
held-out lookups whose evidence lies past its first 5,000 characters; per question the attention each kept
token received is summed per layer while the question and a 24-token answer are fed. Printed: for several
layer ranges, with and without subtracting a baseline (the same cache read after a question-less
continuation, each normalised to a share), whether the evidence offset lies in the cited spans, and
whether the document's first or last 1,500 characters are cited.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from sources import covered, questions

from homer_integrations import HomerModel
from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode
from homer_integrations.homer.decoding.sources import cite
from homer_integrations.homer.document.prompt import encode
from homer_integrations.paths import bundled_text


def attention(engine: HomerModel, doc, continuation: str, new_tokens: int) -> torch.Tensor:
    """[L, K]: attention each kept token received per layer while ``continuation`` and the answer were fed."""
    ids = encode(engine.tokenizer, continuation, formatted=True)
    cache = doc.to_cache(tail=ids.numel() + new_tokens + 1, attended=torch.zeros(doc.num_tokens))
    per_layer = torch.zeros(len(cache.layers), doc.num_tokens)
    for i, layer in enumerate(cache.layers):
        layer.attended = per_layer[i]
    options = GenerationOptions(max_new_tokens=new_tokens)
    for _ in decode(engine.model, engine.tokenizer, cache, ids, doc.last_position + 1, options, DecodeState()):
        pass
    return per_layer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chars", type=int, default=80_000)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--split", default="tuning", choices=("tuning", "heldout"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine = HomerModel.from_pretrained("qwen2.5-coder-1.5b-instruct", dtype="auto", store=True)
    text = bundled_text("northangerabbey")[: args.chars]
    asked = [q for q in questions("northangerabbey", "book", args.split, args.chars) if q.offset > 5000]
    asked = asked[:: max(1, len(asked) // args.questions)][: args.questions]
    layout = engine.layout("", "full")
    doc = engine.compress_span(layout.prefix, text, layout.suffix, mode="full").document
    offsets = engine.token_offsets(text)
    base = attention(engine, doc, engine.layout("", "full").continuation, 1)  # what a question-less read attends to
    layers = base.shape[0]
    ranges = {"all": (0, layers), "upper half": (layers // 2, layers), "lower half": (0, layers // 2)}
    tally = {(name, b): [0, 0, 0] for name in ranges for b in (False, True)}
    for q in asked:
        per_layer = attention(engine, doc, engine.layout(q.question, "full").continuation, 24)
        for name, (lo, hi) in ranges.items():
            for with_base in (False, True):
                mass = per_layer[lo:hi].sum(0)
                if with_base:
                    mass = (mass / mass.sum() - base[lo:hi].sum(0) / base[lo:hi].sum()).clamp(min=0)
                spans = [s.as_dict() for s in cite(mass, doc.origin, offsets, text)]
                t = tally[(name, with_base)]
                t[0] += covered(q.offset, spans)
                t[1] += any(s["start"] < 1500 for s in spans)
                t[2] += any(s["end"] > len(text) - 1500 for s in spans)
        print(f"{q.id} done", file=sys.stderr, flush=True)
    print(f"{len(asked)} {args.split} questions, evidence past the first 5,000 characters of {len(text):,}")
    print("layers | baseline subtracted | evidence cited | first 1,500 chars cited | last 1,500 chars cited")
    for (name, with_base), (hit, first, last) in tally.items():
        print(f"{name} | {'yes' if with_base else 'no'} | {hit} | {first} | {last}")


if __name__ == "__main__":
    main()
