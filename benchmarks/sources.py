"""Sources: do the spans an answer cites hold the evidence it was read from?

    .venv/bin/python benchmarks/sources.py run --book northangerabbey --chars 40000 --split heldout
    .venv/bin/python benchmarks/sources.py run --book northangerabbey --split heldout      # the whole book
    .venv/bin/python benchmarks/sources.py run --book northangerabbey --set whole --split heldout
    .venv/bin/python benchmarks/sources.py report          # JSON + markdown table + plot

Every answer of the package's default carries ``AnswerInfo.sources``: at most five spans of the document,
the units its question and answer attended to most (``homer.decoding.sources``). Here the default answers a
bundled question set (``--set book``: lookups, one evidence offset each; ``--set whole``: whole-document
questions, several evidence offsets) over the first ``--chars`` characters of a novel (within the window:
the document kept whole, ``full``) or the whole novel (past it: the BM25 passages re-read), and each row
records whether each evidence offset lies in a cited span. The target (issue 81): for right answers, at
least 0.9 of the evidence offsets in the cited spans, with at most five spans cited. Rows are appended to
``results/sources_rows.jsonl`` and skipped on a re-run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from homer_integrations import HomerModel
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import question_set, whole_question_set

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROWS = RESULTS / "sources_rows.jsonl"
METHOD = "upper_half_baseline_echo"
"""How the package cites (``homer.decoding.sources``): the upper half of the layers, less a question-less
read's attention; within the window the ``full`` answer reads its passages echoed after the prefill
(``homer.reading.echo``), and what they draw counts for the rows they copy. Rows ``upper_half_baseline``
were cited before the echo; rows without a method by every layer's attention, with no baseline
(``all_layers``, the first version)."""
EVIDENCE_SLACK = 200
"""Characters after an evidence offset where the evidence still lies (a lookup's offset starts its sentence)."""


def evidence(question: Any) -> list[int]:
    """The evidence offsets of a lookup (one) or a whole-document question (every part's)."""
    return sorted(question.offsets) if hasattr(question, "parts") else [question.offset]


def covered(offset: int, sources: list[dict], slack: int = EVIDENCE_SLACK) -> bool:
    """Whether the evidence at ``offset`` (to ``offset + slack``) overlaps a cited span."""
    return any(s["start"] < offset + slack and offset < s["end"] for s in sources)


def questions(book: str, kind: str, split: str, chars: int | None) -> list[Any]:
    if kind == "book":
        found = question_set(f"{book}_book")
        found = found.within(chars) if chars else found
        chosen = found.questions
    else:
        chosen = whole_question_set(book).questions
        if chars:
            chosen = tuple(q for q in chosen if max(q.offsets) + EVIDENCE_SLACK <= chars)
    return [q for q in chosen if split == "all" or q.split == split]


def done_keys(path: Path = ROWS) -> set[tuple]:
    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {(r["model"], r["book"], r["set"], r["chars"], r.get("method", "all_layers"), r["id"]) for r in rows}


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, store=True)
    text = bundled_text(args.book)
    text = text[: args.chars] if args.chars else text
    asked = questions(args.book, args.set, args.split, args.chars)[: args.limit or None]
    done = done_keys()
    chars = args.chars or 0
    print(f"{args.book}: {len(text):,} characters; {len(asked)} questions", file=sys.stderr)
    for q in asked:
        if (args.model, args.book, args.set, chars, METHOD, q.id) in done:
            continue
        started = time.perf_counter()
        stream = engine.run(text, q.question, max_new_tokens=args.max_new_tokens)
        answer = stream.text()
        sources = [s.as_dict() for s in stream.info.sources]
        offsets = evidence(q)
        row = {
            "model": args.model,
            "book": args.book,
            "set": args.set,
            "chars": chars,
            "method": METHOD,
            "id": q.id,
            "kind": q.kind,
            "split": q.split,
            "mode": stream.info.mode,
            "question": q.question,
            "answer": answer.strip(),
            "correct": bool(q.check(answer)),
            "sources": sources,
            "evidence": offsets,
            "covered": [covered(o, sources) for o in offsets],
            "seconds": round(time.perf_counter() - started, 2),
        }
        RESULTS.mkdir(exist_ok=True)
        with ROWS.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{q.id}: {'right' if row['correct'] else 'wrong'}, {sum(row['covered'])}/{len(offsets)} "
            f"evidence cited in {len(sources)} spans ({row['seconds']} s)",
            file=sys.stderr,
        )


def summarize(rows: list[dict]) -> list[dict]:
    """Per (book, set, length, split): answers, right ones, and for the right ones the share of evidence
    offsets in the cited spans, the mean spans cited and the most."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        method = r.get("method", "all_layers")
        groups[(r["book"], r["set"], r["chars"] or "whole book", r["mode"], method, r["split"])].append(r)
    out = []
    for (book, kind, chars, mode, method, split), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        right = [r for r in rs if r["correct"]]
        offsets = [c for r in right for c in r["covered"]]
        out.append(
            {
                "book": book,
                "set": kind,
                "chars": chars,
                "mode": mode,
                "method": method,
                "split": split,
                "answers": len(rs),
                "right": len(right),
                "evidence_cited": round(sum(offsets) / len(offsets), 3) if offsets else None,
                "evidence_offsets": len(offsets),
                "all_answers_evidence_cited": round(
                    sum(c for r in rs for c in r["covered"]) / max(1, sum(len(r["covered"]) for r in rs)), 3
                ),
                "mean_spans": round(sum(len(r["sources"]) for r in rs) / len(rs), 2),
                "most_spans": max(len(r["sources"]) for r in rs),
            }
        )
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| book | questions | document | mode | cited by | split | right | evidence in cited spans (right answers) "
        "| (all answers) | spans cited, mean / most |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        chars = s["chars"] if isinstance(s["chars"], str) else f"first {s['chars']:,} chars"
        cited = "-" if s["evidence_cited"] is None else f"{s['evidence_cited']:.2f} ({s['evidence_offsets']} offsets)"
        lines.append(
            f"| {s['book']} | {s['set']} | {chars} | {s['mode']} | {s['method']} | {s['split']} "
            f"| {s['right']}/{s['answers']} "
            f"| {cited} | {s['all_answers_evidence_cited']:.2f} | {s['mean_spans']} / {s['most_spans']} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['book'][:10]} {s['set']} {s['chars']}\n{s['method']} {s['split']}" for s in summary]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(summary)), 3.5))
    ax.bar(range(len(summary)), [s["evidence_cited"] or 0 for s in summary], color="tab:blue")
    ax.axhline(0.9, color="gray", linestyle="--", linewidth=1, label="target 0.9")
    ax.set_xticks(range(len(summary)), labels, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("evidence in cited spans\n(right answers)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(_: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines() if line.strip()]
    summary = summarize(rows)
    (RESULTS / "sources.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "sources.md").write_text(markdown(summary), encoding="utf-8")
    plot(summary, RESULTS / "sources.png")
    print(markdown(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--book", default="northangerabbey")
    r.add_argument("--set", choices=("book", "whole"), default="book")
    r.add_argument("--chars", type=int, default=0, help="the first N characters (0: the whole book)")
    r.add_argument("--split", default="heldout", choices=("tuning", "heldout", "all"))
    r.add_argument("--limit", type=int, default=0)
    r.add_argument("--max-new-tokens", type=int, default=48)
    r.add_argument("--threads", type=int, default=2)
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
