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
  re-read by a plain prefill (``RecomputeReplay``, the default since 2026-11-26).
- ``query_aware_stmt_max``: the same ranking a statement by its best token alone (ablation
  ``question_statement_max``; its rows were recorded as ``query_aware`` and renamed).
- ``query_aware_stmt_mean``: the same with the question recipe of 2026-11-25 (ablation
  ``question_statement_mean``: a statement's mean attention instead of its best; its rows were
  recorded as ``query_aware`` and renamed).
- ``query_aware_tree``: the recipe of 2026-11-25 replaying the paper's merge tree instead
  (``TreeReplay``, the default before; its rows were recorded as ``query_aware`` and renamed).
- ``query_aware_content``: ``query_aware`` with content-defined leaves (``HomerConfig(split="content")``:
  leaves cut at statement ends the text chooses, so an edited document recomputes only the leaves
  around its edit), for what that split costs in accuracy.

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
from ablations import ABLATIONS, recipe_of

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.question_sets import QuestionSet, question_set

RESULTS = Path(__file__).parent / "results"
ROWS = RESULTS / "novel_qa_rows.jsonl"
METHODS = (
    "full",
    "shared",
    "query_aware",
    "query_aware_stmt_mean",
    "query_aware_stmt_max",
    "query_aware_tree",
    "query_aware_content",
)
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


def done_rows() -> set[tuple[str, str, int, str, str]]:
    """Keys of the recorded rows: model, dtype (rows before dtypes were recorded are float32), tokens,
    method, question."""
    if not ROWS.is_file():
        return set()
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    return {(r["model"], r.get("dtype", "float32"), r["tokens"], r["method"], r["id"]) for r in rows}


def drop_rows(args: argparse.Namespace) -> None:
    """Remove the recorded rows this run would write (its models, lengths and methods; every dtype
    unless ``--dtype`` names one), so they are measured again by today's code (git keeps the old ones)."""
    if not ROWS.is_file():
        return
    dtypes = None if args.dtype == "auto" else {args.dtype}
    kept = [
        line
        for line in ROWS.read_text().splitlines()
        if line.strip()
        and not (
            (r := json.loads(line))["model"] in args.models
            and r["tokens"] in args.tokens
            and r["method"] in args.methods
            and (dtypes is None or r.get("dtype", "float32") in dtypes)
        )
    ]
    ROWS.write_text("".join(line + "\n" for line in kept))


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    qset = question_set()
    text = qset.document.read_text(encoding="utf-8")
    if args.replace:
        drop_rows(args)
    done = done_rows()
    RESULTS.mkdir(exist_ok=True)
    for name in args.models:
        # memory only: every run compresses the excerpt itself, so "prepare s" is measured
        engine = HomerModel.from_pretrained(name, dtype=args.dtype, progress=False, store=False)
        dtype = str(engine.model.dtype).removeprefix("torch.")
        old_recipe = ABLATIONS["question_statement_mean"](engine.tiers.question_scoring)
        best_only = ABLATIONS["question_statement_max"](engine.tiers.question_scoring)
        pinned = {
            method: HomerModel(
                engine.model,
                engine.tokenizer,
                HomerConfig(),
                model_name=name,
                progress=False,
                recipe=recipe_of(old_recipe, replay=replay),
            )
            for method, replay in PINNED.items()
        }
        pinned["query_aware_stmt_max"] = HomerModel(
            engine.model, engine.tokenizer, HomerConfig(), model_name=name, progress=False, recipe=recipe_of(best_only)
        )
        pinned["query_aware_content"] = HomerModel(
            engine.model, engine.tokenizer, HomerConfig(split="content"), model_name=name, progress=False
        )
        for tokens in args.tokens:
            doc = excerpt(engine, text, tokens)
            asked = qset.within(len(doc))
            for method in args.methods:
                if method == "full" and tokens + 64 + args.max_new_tokens > engine.context_window:
                    print(f"{name} {tokens}: full skipped, over the {engine.context_window}-token window")
                    continue
                todo = [q for q in asked.questions if (name, dtype, tokens, method, q.id) not in done]
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
            "dtype": str(engine.model.dtype).removeprefix("torch."),
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
        groups[(r["model"], r.get("dtype", "float32"), r["tokens"], r["method"])].append(r)
    summary = []
    for (model, dtype, tokens, method), rs in sorted(groups.items()):
        later = [r for r in rs if r["document_seconds"] == 0] or rs
        summary.append(
            {
                "model": model,
                "dtype": dtype,
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
        "| model | dtype | tokens | method | right / asked | accuracy | prepare s | cache tokens | first token s "
        "| answer s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['model']} | {s['dtype']} | {s['tokens']} | {s['method']} | {s['correct']}/{s['questions']} "
            f"| {s['accuracy']:.2f} "
            f"| {s['document_seconds']:.0f} | {s['cache_tokens']} | {s['median_ttft']:.2f} "
            f"| {s['median_answer_seconds']:.1f} |"
        )
    lines += ["", *dtype_pairs(rows)]
    (RESULTS / "novel_qa.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(summary)


def dtype_pairs(rows: list[dict]) -> list[str]:
    """bfloat16 against float32 on the same questions (model, length, method), paired: the difference in
    accuracy with a 90% bootstrap interval over the questions."""
    import random

    by: dict[tuple, dict[str, dict[str, bool]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        by[(r["model"], r["tokens"], r["method"])][r.get("dtype", "float32")][r["id"]] = r["correct"]
    lines = [
        "bfloat16 against float32 on the same questions (paired; 90% bootstrap over questions, 2,000 draws):",
        "",
        "| model | tokens | method | pairs | float32 | bfloat16 | difference [90%] |",
        "|---|---|---|---|---|---|---|",
    ]
    for (model, tokens, method), per in sorted(by.items()):
        ids = sorted(set(per.get("float32", {})) & set(per.get("bfloat16", {})))
        if not ids:
            continue
        diffs = [int(per["bfloat16"][i]) - int(per["float32"][i]) for i in ids]
        rng = random.Random(0)
        draws = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(2000))
        fp32, bf16 = (sum(per[d][i] for i in ids) for d in ("float32", "bfloat16"))
        lines.append(
            f"| {model} | {tokens} | {method} | {len(ids)} | {fp32}/{len(ids)} | {bf16}/{len(ids)} "
            f"| {sum(diffs) / len(ids):+.3f} [{draws[100]:+.3f}, {draws[1899]:+.3f}] |"
        )
    return lines


def plot(summary: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(
        {(s["model"], s["dtype"], s["tokens"]) for s in summary},
        key=lambda m: (MODELS.index(m[0]) if m[0] in MODELS else 9, m[2], m[1]),
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    names = {
        "full": "plain prefill (full)",
        "shared": "HOMER shared root",
        "query_aware": "HOMER per question (recompute)",
        "query_aware_stmt_mean": "HOMER per question (recompute, statement mean)",
        "query_aware_stmt_max": "HOMER per question (recompute, statement best)",
        "query_aware_tree": "HOMER per question (tree)",
        "query_aware_content": "HOMER per question (content-defined leaves)",
    }
    width = 0.8 / len(METHODS)
    for j, method in enumerate(METHODS):
        acc = {(s["model"], s["dtype"], s["tokens"]): s["accuracy"] for s in summary if s["method"] == method}
        xs = [i + (j - (len(METHODS) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [acc.get(m, 0) for m in labels], width, label=names[method])
    ticks = [f"{m.split('-instruct')[0]}\n{t // 1000}k {'bf16' if d == 'bfloat16' else ''}" for m, d, t in labels]
    ax.set_xticks(range(len(labels)), ticks, fontsize=7)
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
    r.add_argument("--dtype", default="auto", help="auto: bfloat16 where this CPU computes it faster")
    r.add_argument("--replace", action="store_true", help="measure again what this run covers (drops those rows)")
    r.add_argument("--threads", type=int, default=2)
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    args = parser.parse_args()
    args.func(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
