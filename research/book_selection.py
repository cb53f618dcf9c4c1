"""Probe: which selection keeps each whole-book question's evidence, from the scores ``book_scores.py`` saved.

    .venv/bin/python research/book_selection.py --book northangerabbey [--budget 1990]

A selection keeps ``budget`` document tokens. A question's evidence counts as kept when every token of
the 24 characters at its evidence offset (the answer's words) is kept, and its context is the share of
the tokens within 300 characters of it that are kept. Reported per split, so the tuning split chooses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from whole_book import CHUNK_CHARS, CHUNK_OVERLAP, FACTS, book_with_facts

from homer_integrations.homer.scoring.lexical import BM25Index
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import question_set


def evidence_offsets(book: str, text: str) -> dict[str, int]:
    """Each question's evidence offset in the book with its facts inserted."""
    original = bundled_text(book)
    out = {}
    for q in question_set(f"{book}_book").questions:
        at = -1
        for width in (80, 40, 20):  # a probe that crosses an inserted fact is not found whole
            at = text.find(original[q.offset : q.offset + width], q.offset)
            if at >= 0:
                break
        assert at >= 0, q.id
        out[q.id] = at
    for f in json.loads(FACTS.read_text(encoding="utf-8")):
        if f["book"] == book:
            out[f["id"]] = text.index(f["sentence"])
    return out


def token_span(offsets: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Indices of tokens overlapping characters [start, stop)."""
    return ((offsets[:, 0] < stop) & (offsets[:, 1] > start)).nonzero()[:, 0]


class Chunks:
    """The retrieval route's 800-character chunks as token spans."""

    def __init__(self, text: str, offsets: torch.Tensor, stemmer: str | None = "english") -> None:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        splitter = RecursiveCharacterTextSplitter(chunk_size=CHUNK_CHARS, chunk_overlap=CHUNK_OVERLAP)
        self.texts = splitter.split_text(text)
        self.index = BM25Index(self.texts, stemmer=stemmer)
        self.spans: list[torch.Tensor] = []
        cursor = 0
        for t in self.texts:
            at = text.find(t, max(0, cursor - CHUNK_OVERLAP - 10))
            assert at >= 0
            cursor = at + len(t)
            self.spans.append(token_span(offsets, at, at + len(t)))
        # each token's chunk (its first), for pooling token scores into chunk scores
        self.owner = torch.full((offsets.shape[0],), -1, dtype=torch.long)
        for i in reversed(range(len(self.spans))):
            self.owner[self.spans[i]] = i

    def bm25_ranks(self, question: str) -> list[int]:
        return [p.index for p in self.index.search(question, len(self.texts))]

    def fill(self, order: list[int], budget: int) -> torch.Tensor:
        kept = torch.zeros(self.owner.numel(), dtype=torch.bool)
        for i in order:
            span = self.spans[i]
            new = int((~kept[span]).sum())
            if int(kept.sum()) + new > budget:
                break
            kept[span] = True
        return kept


def pooled(scores: torch.Tensor, owner: torch.Tensor, n: int, how: str) -> torch.Tensor:
    s = scores.float()
    if how == "max":
        return torch.full((n,), float("-inf")).scatter_reduce(0, owner, s, "amax", include_self=True)
    if how == "mean":
        return torch.zeros(n).scatter_reduce(0, owner, s, "mean", include_self=False)
    if how.startswith("top"):  # mean of the k best tokens
        k = int(how[3:])
        out = torch.full((n,), float("-inf"))
        order = torch.argsort(owner)
        sorted_owner = owner[order]
        bounds = torch.searchsorted(sorted_owner, torch.arange(n + 1))
        for i in range(n):
            v = s[order[bounds[i] : bounds[i + 1]]]
            if v.numel():
                out[i] = v.topk(min(k, v.numel())).values.mean()
        return out
    raise ValueError(how)


def rrf(*rankings: list[int], k: int = 60) -> list[int]:
    score: dict[int, float] = defaultdict(float)
    for r in rankings:
        for place, i in enumerate(r):
            score[i] += 1.0 / (k + place)
    return sorted(score, key=lambda i: -score[i])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--book", default="northangerabbey")
    p.add_argument("--scores", default="benchmarks/.work/scores")
    p.add_argument("--budget", type=int, default=1990)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--passage-tokens", type=int, nargs="*", default=[128, 192])
    p.add_argument("--scorer", default="", help="suffix of the scores folder (every)")
    args = p.parse_args()
    folder = Path(args.scores) / (f"{args.book}-{args.scorer}" if args.scorer else args.book)
    document = Path(args.scores) / args.book / "_document.pt"
    doc = torch.load(document)
    text, offsets = doc["text"], doc["offsets"]
    _, items = book_with_facts(args.book)
    at = evidence_offsets(args.book, text)
    chunks = Chunks(text, offsets)
    owner = chunks.owner.clamp(min=0)
    n = len(chunks.texts)
    B = args.budget
    from transformers import AutoTokenizer

    from homer_integrations.homer.document.prompt import unit_ids
    from homer_integrations.homer.reading.passages import PassageSelection
    from homer_integrations.paths import cache_root

    tokenizer = AutoTokenizer.from_pretrained(next((cache_root() / "models").glob(f"{args.model}-*[!k]")))
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    statements = unit_ids(tokenizer, text, "statement")
    units = {PassageSelection(tokens=t, overlap=o): None for t in args.passage_tokens for o in (0, 24, 48)}
    grouped = {u: u.passages(tokenizer, ids, statements) for u in units}
    results: dict[tuple[str, str], list[tuple[bool, float]]] = defaultdict(list)
    for item in items:
        path = folder / f"{item.id}.pt"
        if not path.exists():
            continue
        saved = torch.load(path)
        scores = saved["scores"].float()
        answer = token_span(offsets, at[item.id], at[item.id] + 24)
        context = token_span(offsets, at[item.id] - 300, at[item.id] + 300)
        bm = chunks.bm25_ranks(item.question)
        sel: dict[str, torch.Tensor] = {}
        tok = torch.zeros(scores.numel(), dtype=torch.bool)
        tok[scores.topk(B).indices] = True
        sel["tokens"] = tok
        sel["bm25"] = chunks.fill(bm, B)
        for how in ("max", "mean", "top16", "top64"):
            attn = pooled(scores, owner, n, how).argsort(descending=True).tolist()
            sel[f"attn_{how}"] = chunks.fill(attn, B)
            sel[f"rrf_{how}"] = chunks.fill(rrf(attn, bm), B)
        if "raw" in saved:
            raw = saved["raw"].float()
            tok = torch.zeros(scores.numel(), dtype=torch.bool)
            tok[raw.topk(B).indices] = True
            sel["tokens_raw"] = tok
            rawp = pooled(raw, owner, n, "top16")
            sel["rerank_raw"] = chunks.fill(sorted(bm[: 3 * 10], key=lambda i: -float(rawp[i])), B)
        attn16 = pooled(scores, owner, n, "top16")
        sel["rerank"] = chunks.fill(sorted(bm[: 3 * 10], key=lambda i: -float(attn16[i])), B)
        for u, ps in grouped.items():
            kept = torch.zeros(scores.numel(), dtype=torch.bool)
            kept[u.select(item.question, scores, ps, B)] = True
            sel[f"passages{u.tokens}/{u.overlap}"] = kept
        half = chunks.fill(bm, B // 2)
        rest = scores.masked_fill(half, float("-inf")).topk(B - int(half.sum())).indices
        u = half.clone()
        u[rest] = True
        sel["bm25half+tokens"] = u
        for name, kept in sel.items():
            results[(item.split, name)].append((bool(kept[answer].all()), float(kept[context].float().mean())))
    for split in ("tuning", "heldout"):
        print(f"--- {split}")
        for (s, name), rs in sorted(results.items()):
            if s == split:
                hit = sum(r[0] for r in rs)
                ctx = sum(r[1] for r in rs) / len(rs)
                print(f"{name:18s} answer kept {hit:3d}/{len(rs)}  context {ctx:.2f}")


if __name__ == "__main__":
    main()
