"""Probe: does the model's own guess at the answer's wording help BM25 keep a whole-book answer?

    .venv/bin/python research/query_expansion.py [--split tuning] [--budget 1990]

The whole-book questions are asked in words that differ from the book's. Before BM25 ranks the
per-question path's passages, the model (Qwen2.5-Coder-1.5B, bfloat16, greedy, no book in sight)
writes what the answer's passage might say (``hyde``: one sentence, as in HyDE) or the words it might
use (``keywords``), and BM25 ranks by the question followed by that text. A question's answer counts as
kept when every token of the 24 characters at its evidence offset is among the ``budget`` tokens kept
(``book_selection.py``'s measure), against the question alone. The expansions are kept in a JSON file
beside the results, so a rerun scores without the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from book_selection import evidence_offsets, token_span
from whole_book import book_with_facts

from homer_integrations.homer.document.prompt import unit_ids
from homer_integrations.homer.reading.passages import PassageSelection

PROMPTS = {
    "hyde": "Write one sentence from a novel that answers this question. Guess names and details if you must; "
    "do not say you do not know.\n\nQuestion: {question}",
    "keywords": "List eight words, names or short phrases that the passage of a novel answering this question "
    "would likely contain (synonyms of the question's words, likely names). Only the list, comma-separated."
    "\n\nQuestion: {question}",
}
EXPANSIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "query_expansions.json"


def expand(engine, prompts: dict[str, str], questions: dict[str, str], known: dict) -> dict:
    """Each (prompt name, question id) -> the model's greedy text, at most 40 new tokens."""
    tokenizer, model = engine.tokenizer, engine.model
    for name, prompt in prompts.items():
        for qid, question in questions.items():
            if f"{name}/{qid}" in known:
                continue
            messages = [{"role": "user", "content": prompt.format(question=question)}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
            started = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=40, do_sample=False)
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
            known[f"{name}/{qid}"] = text
            print(f"{name} {qid} {time.perf_counter() - started:.1f}s: {text[:90]!r}", file=sys.stderr)
            EXPANSIONS.write_text(json.dumps(known, indent=1, sort_keys=True), encoding="utf-8")
    return known


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=1990)
    p.add_argument("--split", default="tuning", choices=("tuning", "heldout", "all"))
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = p.parse_args()
    from homer_integrations import HomerModel

    torch.set_num_threads(2)
    engine = HomerModel.from_pretrained(args.model, dtype="bfloat16")
    tokenizer = engine.tokenizer
    known = json.loads(EXPANSIONS.read_text(encoding="utf-8")) if EXPANSIONS.is_file() else {}
    kept: dict[tuple, list[bool]] = defaultdict(list)
    selection = PassageSelection()
    for book in ("northangerabbey", "prideprejudice"):
        text, items = book_with_facts(book)
        items = [i for i in items if args.split in ("all", i.split)]
        known = expand(engine, PROMPTS, {i.id: i.question for i in items}, known)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = torch.tensor(enc["input_ids"]), torch.tensor(enc["offset_mapping"])
        at = evidence_offsets(book, text)
        passages = selection.passages(tokenizer, ids, unit_ids(tokenizer, text, "statement"))
        for item in items:
            answer = token_span(offsets, at[item.id], at[item.id] + 24)
            kind = "fact" if item.kind.startswith("fact") else "story"
            queries = {"question": item.question} | {
                name: f"{item.question} {known[f'{name}/{item.id}']}" for name in PROMPTS
            }
            for name, query in queries.items():
                taken = torch.zeros(ids.numel(), dtype=torch.bool)
                taken[selection.select(query, None, passages, args.budget)] = True
                kept[(item.split, kind, name)].append(bool(taken[answer].all()))
    for key, hits in sorted(kept.items()):
        print(f"{' / '.join(key):40s} answer kept {sum(hits):3d}/{len(hits)}")


if __name__ == "__main__":
    main()
