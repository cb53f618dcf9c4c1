"""Probe: does stemming BM25's words keep each whole-book question's answer more often?

    .venv/bin/python research/bm25_stemming.py [--budget 1990]

For every question about both bundled novels whole (the invented facts inserted), the per-question
path's passages (``PassageSelection``'s defaults) and the retrieval route's 800-character chunks are
ranked by BM25 with words stemmed (PyStemmer's English Snowball) and as written, and filled up to
``budget`` tokens of Qwen2.5-Coder-1.5B's tokenizer. A question's answer counts as kept when every token
of the 24 characters at its evidence offset is kept (``book_selection.py``'s measure). Reported per
split and kind, so the tuning split chooses. No model runs: a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from book_selection import Chunks, evidence_offsets, token_span
from whole_book import book_with_facts

from homer_integrations.homer.document.prompt import unit_ids
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.paths import cache_root


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=1990)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(next((cache_root() / "models").glob(f"{args.model}-*[!k]")))
    kept: dict[tuple, list[bool]] = defaultdict(list)
    for book in ("northangerabbey", "prideprejudice"):
        text, items = book_with_facts(book)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = torch.tensor(enc["input_ids"]), torch.tensor(enc["offset_mapping"])
        at = evidence_offsets(book, text)
        statements = unit_ids(tokenizer, text, "statement")
        for stemmer in ("english", None):
            selection = PassageSelection(stemmer=stemmer)
            passages = selection.passages(tokenizer, ids, statements)
            chunks = Chunks(text, offsets, stemmer)
            for item in items:
                answer = token_span(offsets, at[item.id], at[item.id] + 24)
                by_passages = torch.zeros(ids.numel(), dtype=torch.bool)
                by_passages[selection.select(item.question, None, passages, args.budget)] = True
                by_chunks = chunks.fill(chunks.bm25_ranks(item.question), args.budget)
                kind = "fact" if item.kind.startswith("fact") else "story"
                for method, k in (("passages", by_passages), ("route chunks", by_chunks)):
                    kept[(item.split, kind, method, stemmer or "as written")].append(bool(k[answer].all()))
    for key, hits in sorted(kept.items()):
        print(f"{' / '.join(key):48s} answer kept {sum(hits):3d}/{len(hits)}")


if __name__ == "__main__":
    main()
