"""The main job, scored: questions about a novel excerpt, plain prefill vs HOMER, per embedded model.

    .venv/bin/python benchmarks/novel_qa.py run --models smollm2-135m-instruct --tokens 8000 16000
    .venv/bin/python benchmarks/novel_qa.py report            # JSON + markdown table + plot

The questions are the bundled set (``homer_integrations/data/questions/prideprejudice.json``):
keyword answers about the opening chapters of Pride and Prejudice. An excerpt of ``--tokens``
tokens (the model's own tokenizer) asks the questions whose answer it contains, so every answer
is in the document. Methods, each one engine per model with default settings (what a user gets):

- ``full``: the excerpt prefilled uncompressed and kept (``mode="full"``); each question after it.
  Only where the excerpt fits the model's window.
- ``shared``: one HOMER compression (``mode="shared"``, the default); each question after it.
- ``query_aware``: HOMER's per-question path: the leaf tier built once (paid by the first question),
  then each question selects with itself in the suffix, replayed from the tier, and the selection is
  re-read by a plain prefill (``replay="recompute"``, the default since 2026-11-26).
- ``query_aware_stmt_max``: the same ranking a statement by its best token alone (ablation
  ``question_statement_max``; its rows were recorded as ``query_aware`` and renamed).
- ``query_aware_stmt_mean``: the same with the question recipe of 2026-11-25 (ablation
  ``question_statement_mean``: a statement's mean attention instead of its best; its rows were
  recorded as ``query_aware`` and renamed).
- ``query_aware_tree``: the recipe of 2026-11-25 replaying the paper's merge tree instead
  (``replay="tree"``, the default before; its rows were recorded as ``query_aware`` and renamed).

Rows (one per model, length, method and question) are appended to ``results/novel_qa_rows.jsonl``
and skipped on a re-run, so the grid fills over several runs. Recorded per row: the answer,
whether it holds the keywords, time to first token and in total; per (model, length, method) the
seconds to prepare the document (prefill or compression), paid by its first question.
None of these questions chose any setting of the package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ablations import ABLATIONS

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.question_sets import QuestionSet, question_set

RESULTS = Path(__file__).parent / "results"
ROWS = RESULTS / "novel_qa_rows.jsonl"
METHODS = ("full", "shared", "query_aware", "query_aware_stmt_mean", "query_aware_stmt_max", "query_aware_tree")
PINNED = {"query_aware_stmt_mean": "recompute", "query_aware_tree": "tree"}
"""Methods that answer with the question recipe of 2026-11-25, and the replay each was measured with."""
MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


def excerpt(engine: HomerModel, text: str, tokens: int) -> str:
    """The first ``tokens`` tokens of ``text`` (cut at a token boundary, by the engine's tokenizer)."""
    head = text[: tokens * 8]
    enc = engine.tokenizer(head, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= tokens:
        return head
    return head[: offsets[tokens - 1][1]]


def done_rows() -> set[tuple[str, int, str, str]]:
    if not ROWS.is_file():
        return set()
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    return {(r["model"], r["tokens"], r["method"], r["id"]) for r in rows}


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    qset = question_set()
    text = qset.document.read_text(encoding="utf-8")
    done = done_rows()
    RESULTS.mkdir(exist_ok=True)
    for name in args.models:
        engine = HomerModel.from_pretrained(name, progress=False)
        old_recipe = ABLATIONS["question_statement_mean"](engine.tiers.question_scoring)
        best_only = ABLATIONS["question_statement_max"](engine.tiers.question_scoring)
        pinned = {
            method: HomerModel(
                engine.model,
                engine.tokenizer,
                HomerConfig(replay=replay),
                model_name=name,
                progress=False,
                scoring=old_recipe,
            )
            for method, replay in PINNED.items()
        }
        pinned["query_aware_stmt_max"] = HomerModel(
            engine.model, engine.tokenizer, HomerConfig(), model_name=name, progress=False, scoring=best_only
        )
        for tokens in args.tokens:
            doc = excerpt(engine, text, tokens)
            asked = qset.within(len(doc))
            for method in args.methods:
                if method == "full" and tokens + 64 + args.max_new_tokens > engine.context_window:
                    print(f"{name} {tokens}: full skipped, over the {engine.context_window}-token window")
                    continue
                todo = [q for q in asked.questions if (name, tokens, method, q.id) not in done]
                if todo:
                    runner = pinned.get(method, engine)
                    answer_all(runner, name, tokens, method, doc, asked, todo, args.max_new_tokens)


def answer_all(
    engine: HomerModel, name: str, tokens: int, method: str, doc: str, asked: QuestionSet, todo: list, max_new: int
) -> None:
    print(f"{name} {tokens} tokens ({len(doc)} chars), {method}: {len(todo)} of {len(asked)} questions", flush=True)
    for q in todo:
        t0 = time.perf_counter()
        mode = "query_aware" if method.startswith("query_aware") else method
        stream = engine.run(doc, q.question, mode=mode, max_new_tokens=max_new)
        answer = stream.text()
        info = stream.info
        row = {
            "model": name,
            "tokens": tokens,
            "chars": len(doc),
            "method": method,
            "id": q.id,
            "question": q.question,
            "expected": q.expected(),
            "answer": answer,
            "correct": q.check(answer),
            "ttft": info.time_to_first_token,
            "seconds": time.perf_counter() - t0,
            "document_seconds": info.document_seconds,
            "cache_source": info.cache_source,
            "cache_tokens": info.cache_tokens,
            "document_tokens": info.document_tokens,
            "asked": len(asked),
        }
        mark = "ok " if row["correct"] else "NO "
        print(f"  {mark}{q.id} {row['seconds']:.1f}s  {answer.strip()[:90]!r}", flush=True)
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")


def report(_: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["tokens"], r["method"])].append(r)
    summary = []
    for (model, tokens, method), rs in sorted(groups.items()):
        later = [r for r in rs if r["document_seconds"] == 0] or rs
        summary.append(
            {
                "model": model,
                "tokens": tokens,
                "method": method,
                "questions": len(rs),
                "correct": sum(r["correct"] for r in rs),
                "accuracy": round(sum(r["correct"] for r in rs) / len(rs), 3),
                "document_seconds": round(max(r["document_seconds"] for r in rs), 1),
                "cache_tokens": max(r["cache_tokens"] for r in rs),
                "median_ttft": round(sorted(r["ttft"] or 0 for r in later)[len(later) // 2], 2),
                "median_answer_seconds": round(sorted(r["seconds"] for r in later)[len(later) // 2], 2),
            }
        )
    (RESULTS / "novel_qa.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "| model | tokens | method | right / asked | accuracy | prepare s | cache tokens | first token s | answer s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['model']} | {s['tokens']} | {s['method']} | {s['correct']}/{s['questions']} | {s['accuracy']:.2f} "
            f"| {s['document_seconds']:.0f} | {s['cache_tokens']} | {s['median_ttft']:.2f} "
            f"| {s['median_answer_seconds']:.1f} |"
        )
    (RESULTS / "novel_qa.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(summary)


def plot(summary: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(
        {(s["model"], s["tokens"]) for s in summary}, key=lambda m: (MODELS.index(m[0]) if m[0] in MODELS else 9, m[1])
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    names = {
        "full": "plain prefill (full)",
        "shared": "HOMER shared root",
        "query_aware": "HOMER per question (recompute)",
        "query_aware_stmt_mean": "HOMER per question (recompute, statement mean)",
        "query_aware_stmt_max": "HOMER per question (recompute, statement best)",
        "query_aware_tree": "HOMER per question (tree)",
    }
    width = 0.8 / len(METHODS)
    for j, method in enumerate(METHODS):
        acc = {(s["model"], s["tokens"]): s["accuracy"] for s in summary if s["method"] == method}
        xs = [i + (j - (len(METHODS) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [acc.get(m, 0) for m in labels], width, label=names[method])
    ax.set_xticks(range(len(labels)), [f"{m.split('-instruct')[0]}\n{t // 1000}k" for m, t in labels], fontsize=8)
    ax.set_ylabel("questions answered right")
    ax.set_ylim(0, 1)
    ax.axhline(0.6, color="grey", lw=0.8, ls="--")
    ax.legend()
    ax.set_title("Bundled Pride and Prejudice questions (keyword check)")
    fig.tight_layout()
    fig.savefig(RESULTS / "novel_qa.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", nargs="+", default=list(MODELS))
    r.add_argument("--tokens", type=int, nargs="+", default=[8000, 16000])
    r.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    r.add_argument("--max-new-tokens", type=int, default=48)
    r.add_argument("--threads", type=int, default=2)
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    args = parser.parse_args()
    args.func(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
