"""Probe: every whole-book question's per-token selection scores, saved, so selections can be compared offline.

    .venv/bin/python research/book_scores.py --book northangerabbey --store benchmarks/.work/store

For each question of ``benchmarks/whole_book.py``'s book (facts inserted), the per-question path's
scores of every document token exactly as its flat selection ranks them (each leaf scored from the
stored tier with the question in the suffix, the question units applied, standardised per leaf) are
written to ``benchmarks/.work/scores/<book>/<id>.pt`` with the document's token character offsets.
``research/book_selection.py`` then asks which selection keeps each question's evidence.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from whole_book import book_with_facts

from homer_integrations import HomerModel
from homer_integrations.engine.prompting import encode
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.scoring.scorers import EveryLayer
from homer_integrations.homer.scoring.units import ScoreMemory


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--book", default="northangerabbey")
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--store", default="benchmarks/.work/store")
    p.add_argument("--out", default="benchmarks/.work/scores")
    p.add_argument("--split", default="all", choices=("tuning", "heldout", "all"))
    p.add_argument("--scorer", default="last", choices=("last", "every"), help="every: all leaf layers, averaged")
    args = p.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out) / (args.book if args.scorer == "last" else f"{args.book}-{args.scorer}")
    out.mkdir(parents=True, exist_ok=True)
    engine = HomerModel.from_pretrained(args.model, store=args.store)
    text, items = book_with_facts(args.book)
    tiers = engine.tiers
    if args.scorer == "every":
        scoring = tiers.question_scoring
        tiers.question_scoring = replace(scoring, scorer=EveryLayer(scoring.scorer))
    items = [i for i in items if args.split in ("all", i.split)]
    enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    layout = engine.prompting.layout(items[0].question, "query_aware")
    _, document_ids, _ = tiers.prompting.encode_span(layout.prefix, text, "")
    assert document_ids.tolist() == enc["input_ids"], "document tokens differ from a plain tokenization"
    torch.save({"offsets": torch.tensor(enc["offset_mapping"]), "text": text}, out / "_document.pt")
    for item in items:
        path = out / f"{item.id}.pt"
        if path.exists():
            continue
        started = time.perf_counter()
        layout = engine.prompting.layout(item.question, "query_aware")
        tier, _ = tiers.leaf_tier(layout.prefix, text)
        suffix_ids = encode(engine.tokenizer, layout.suffix, formatted=True)
        compressor = tiers.builder().compressor(True, query_aware=True)
        plan, schedule = compressor.leaves.replay_plan(tier, suffix_ids)
        leaf = compressor.leaves.scored_leaves(tier, suffix_ids, plan, schedule.layers_at(0))
        scoring = compressor.nodes.scoring.without(ScoreMemory)
        scores = torch.full((tier.document_tokens,), float("nan"))
        unstandardised = scores.clone()
        for index in range(plan.num_leaves):
            chunk, raw = leaf(index, 0)
            ranked = scoring.rank(raw, chunk, compressor.nodes.words(chunk))
            doc = chunk.origin >= 0
            scores[chunk.origin[doc]] = standardise(ranked, chunk.reducible)[doc].float()
            unstandardised[chunk.origin[doc]] = ranked[doc].float()
        assert not scores.isnan().any()
        torch.save({"scores": scores.half(), "raw": unstandardised, "question": item.question}, path)
        print(f"{item.id} {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
