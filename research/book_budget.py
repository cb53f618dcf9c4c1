"""Probe: how much of each whole-book question's evidence BM25 keeps as the budget grows, by the route's
800-character chunks and by the package's passages (``PassageSelection``), without a model.

    .venv/bin/python research/book_budget.py --book northangerabbey --budgets 1024 2048 4096 8192 16384

As ``book_selection.py`` counts it: the answer is kept when every token of the 24 characters at its
evidence offset is kept; the context is the kept share of the tokens within 300 characters. Per split.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from book_selection import Chunks, evidence_offsets, token_span
from whole_book import book_with_facts

from homer_integrations.homer.document.prompt import unit_ids
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.paths import cache_root


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--book", default="northangerabbey")
    p.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--out", default="", help="write the rows as JSON here (results/book_budget.json holds both books)")
    args = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(next((cache_root() / "models").glob(f"{args.model}-*[!k]")))
    text, items = book_with_facts(args.book)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = torch.tensor(encoded["input_ids"]), torch.tensor(encoded["offset_mapping"])
    at = evidence_offsets(args.book, text)
    chunks = Chunks(text, offsets)
    selection = PassageSelection()
    passages = selection.passages(tokenizer, ids, unit_ids(tokenizer, text, "statement"))
    results: dict[tuple[str, str, int], list[tuple[bool, float]]] = defaultdict(list)
    for item in items:
        answer = token_span(offsets, at[item.id], at[item.id] + 24)
        context = token_span(offsets, at[item.id] - 300, at[item.id] + 300)
        order = chunks.bm25_ranks(item.question)
        for budget in args.budgets:
            kept = {"bm25 chunks": chunks.fill(order, budget), "passages": torch.zeros(ids.numel(), dtype=torch.bool)}
            kept["passages"][selection.select(item.question, None, passages, budget)] = True
            for name, mask in kept.items():
                results[(item.split, name, budget)].append(
                    (bool(mask[answer].all()), float(mask[context].float().mean()))
                )
    rows = []
    for (split, name, budget), rs in sorted(results.items()):
        hit = sum(r[0] for r in rs)
        rows.append(
            {
                "book": args.book,
                "split": split,
                "method": name,
                "budget": budget,
                "kept": hit,
                "asked": len(rs),
                "context": round(sum(r[1] for r in rs) / len(rs), 3),
            }
        )
        print(f"{split:8s} {name:12s} {budget:6d}: answer kept {hit:3d}/{len(rs)}  context {rows[-1]['context']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
