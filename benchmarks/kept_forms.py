"""Every way to keep a document within the window, at 4k-32k tokens: what it costs once, what a later
question costs, how right it answers (issue 79, item 1; past the window: ``whole_book.py``).

    .venv/bin/python benchmarks/kept_forms.py run --lengths 4096 8192 16384 32000
    .venv/bin/python benchmarks/kept_forms.py report      # JSON + markdown table + plot

The documents are excerpts of *Northanger Abbey* with the invented facts of ``book_facts.json`` inserted
(``whole_book.book_with_facts``): the book cut into consecutive excerpts of each length (at paragraph
breaks), and of those, spread over the book, as many as hold ``--questions`` held-out questions (story
questions of the whole-book set and inserted facts) whose evidence lies inside, 1,000 characters clear of
either end. Each question is asked of the excerpt that holds its evidence. Methods, the demo model:

- ``full``: the whole prompt prefilled once and kept (``mode="full"``: the default within the window), each
  question read after the K/V of its 512 tokens of BM25 passages copied from the prefill, keys turned by
  RoPE to the positions after it, and a line pointing at them (``homer.reading.echo``);
- ``full_plain``: the same prefill, the question alone after it (``Recipe(echo=None)``; ``full`` before the
  echo: its rows were measured as ``full``);
- ``query_aware``: the per-question path (``mode="query_aware"``): the leaf tier kept, pruning replayed
  with each question and the kept tokens re-read;
- ``shared``: the question-agnostic root (``mode="shared"``, the model's default root size);
- ``root8k`` / ``root16k``: a ``WindowRoot`` of 8,192 / 16,384 tokens (only where the excerpt is longer);
- ``shared_passages``: the ``shared`` root, then the 512 tokens of the default's passages BM25 ranks best
  for the question, read after it with the question (``whole_book.after_root_passages``);
  ``full_passages``: the same after the ``full`` prefill (the question's passages read again, next to it:
  what ``full``'s echo copies instead).

Per excerpt and method a ``build`` row (one-time seconds, kept tokens, bytes in memory and on disk); per
question and method an ``answer`` row: right or not, the first token's seconds (the entry already built:
a later question), decoding seconds per token against the bandwidth limit (every weight and the kept K/V
read once per token at the read bandwidth of ``kept_decode.read_bandwidth``), peak RSS so far. Rows are
appended to ``results/kept_forms_rows.jsonl`` and skipped on a re-run; each question goes through every
method before the next, so a busy machine slows them alike.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from homer_integrations import HomerModel
from homer_integrations.homer.reading.echo import PassageEcho
from homer_integrations.homer.reading.strategies import AutoRoot, WindowRoot

sys.path.insert(0, str(Path(__file__).parent))
from kept_decode import read_bandwidth
from whole_book import Item, after_root_passages, book_with_facts, paired, paired_markdown, peak_rss_mb

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROWS = RESULTS / "kept_forms_rows.jsonl"
BOOK = "northangerabbey"
METHODS = ("full", "full_plain", "query_aware", "shared", "root8k", "root16k", "shared_passages", "full_passages")
PASSAGES = {"shared_passages": "shared", "full_passages": "full"}
"""The methods that read the question's passages after a kept form, and that form."""
BUILT_AS = {**PASSAGES, "full_plain": "full"}
"""The methods that answer from another method's entry, and that method."""
ROOTS = {"root8k": 8192, "root16k": 16384}
MARGIN = 1000  # characters between an evidence offset and an excerpt's end


def excerpts(engine: HomerModel, text: str, tokens: int) -> list[tuple[int, int]]:
    """``text`` cut into consecutive (start, end) character spans of about ``tokens`` tokens each, at
    paragraph breaks."""
    from homer_integrations.homer.document.prompt import encode_offsets

    ids, offsets = encode_offsets(engine.tokenizer, text)
    starts = offsets[:, 0].tolist()
    spans, start, first = [], 0, 0  # the excerpt's first character and first token
    while first + tokens < len(ids):
        end = text.rfind("\n\n", start, int(starts[first + tokens]))
        end = int(starts[first + tokens]) if end <= start else end
        spans.append((start, end))
        start, first = end, bisect.bisect_left(starts, end)
    return spans


def chosen(spans: list[tuple[int, int]], items: list[Item], text: str, wanted: int) -> list[tuple[tuple, list]]:
    """Excerpts spread over the book (every ``len(spans) // 4``-th first, then the ones between), each with
    the items whose evidence lies inside (every inserted fact, story questions spread over the excerpt),
    until they hold ``wanted`` items."""
    inside = [[i for i in items if s + MARGIN <= i.depth * len(text) <= e - MARGIN] for s, e in spans]
    stride = max(1, len(spans) // 4)
    order = [*range(0, len(spans), stride), *(k for k in range(len(spans)) if k % stride)]
    picked: list[tuple[tuple, list]] = []
    for k in order:
        left = wanted - sum(len(held) for _, held in picked)
        if left <= 0:
            break
        facts = [i for i in inside[k] if i.kind.startswith("fact")]
        story = [i for i in inside[k] if not i.kind.startswith("fact")]
        take = max(left - len(facts), 0)  # every fact, then story questions spread over the excerpt
        if take < len(story):
            story = [story[round(j * (len(story) - 1) / max(take - 1, 1))] for j in range(take)]
        if facts or story:
            picked.append((spans[k], sorted({*facts, *story}, key=lambda i: i.depth)))
    return picked


def done_keys(rows: Path) -> set[tuple]:
    if not rows.is_file():
        return set()
    lines = [json.loads(line) for line in rows.read_text(encoding="utf-8").splitlines()]
    return {(r["row"], r["model"], r["budget"], r["method"], r.get("id") or r["excerpt"]) for r in lines}


def mode_of(engine: HomerModel, method: str) -> str:
    """The engine's mode for ``method``, its shared root builder and echo set to the method's."""
    root = WindowRoot(ROOTS[method]) if method in ROOTS else AutoRoot()
    echo = None if method == "full_plain" else PassageEcho()
    engine.tiers.recipe = replace(engine.tiers.recipe, shared_root=root, echo=echo)
    method = BUILT_AS.get(method, method)
    return method if method in ("full", "query_aware") else "shared"


def build_row(engine: HomerModel, document: str, method: str) -> dict:
    """Prepare ``document``'s entry for ``method`` (computed: the store is new) and say what it cost."""
    mode = mode_of(engine, method)
    started = time.perf_counter()
    prepared = engine.cache_document(document, mode)
    seconds = time.perf_counter() - started
    key = engine.entry_key(document, mode)
    entry = next((e for e in engine.document_cache.entries() if e.key == key), None)
    return {
        "source": prepared.source,
        "document_tokens": prepared.document_tokens,
        "seconds": round(seconds, 1),
        "kept_tokens": entry.tokens if entry else None,
        "nbytes": entry.nbytes if entry else None,
        "disk_bytes": entry.disk_bytes if entry else None,
    }


def answer_row(
    engine: HomerModel, document: str, item: Item, method: str, max_new_tokens: int, passage_tokens: int = 512
) -> dict:
    """Ask ``item`` of ``document``'s built entry through ``method`` (``passage_tokens``: the passages read after
    a kept form): the answer and its costs."""
    mode = mode_of(engine, method)
    started = time.perf_counter()
    if method in PASSAGES:
        stream = after_root_passages(engine, document, item.question, max_new_tokens, passage_tokens, mode)
        pieces = [next(stream, "")]
        ttft = time.perf_counter() - started  # the kept form's lookup included
        answer = "".join([*pieces, *stream])
    else:
        stream = engine.run(document, item.question, mode=mode, max_new_tokens=max_new_tokens)
        answer = stream.text()
        ttft = stream.info.time_to_first_token or 0.0
    info = stream.info
    decoded = time.perf_counter() - started - ttft
    return {
        "id": item.id,
        "kind": item.kind,
        "split": item.split,
        "question": item.question,
        "answer": answer,
        "correct": bool(item.check(answer)),
        "ttft_seconds": round(ttft, 3),
        "seconds": round(time.perf_counter() - started, 2),
        "output_tokens": info.output_tokens,
        "step_seconds": round(decoded / (info.output_tokens - 1), 4) if info.output_tokens > 1 else None,
        "read_tokens": info.cache_tokens + info.echoed_tokens + info.input_tokens,
        "document_seconds": round(info.document_seconds, 1),
        "peak_rss_mb": round(peak_rss_mb()),
    }


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    store = args.store or tempfile.mkdtemp(prefix="kept_forms_", dir=args.scratch)
    engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, store=store)
    c, model = engine.model.config, engine.model
    weights = sum({t.data_ptr(): t.numel() * t.element_size() for t in model.parameters()}.values())
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    kv_per_token *= torch.finfo(model.dtype).bits // 8
    bandwidth = read_bandwidth(model.dtype)
    text, items = book_with_facts(BOOK)
    items = [i for i in items if i.split == args.split]
    done = done_keys(args.rows)
    common = {"model": args.model, "dtype": str(model.dtype).removeprefix("torch."), "bandwidth_gbs": bandwidth / 1e9}

    def write(row: dict) -> None:
        with args.rows.open("a", encoding="utf-8") as f:
            f.write(json.dumps({**common, **row}) + "\n")

    for length in args.lengths:
        methods = [m for m in args.methods if ROOTS.get(m, 0) < length]
        for (start, end), held in chosen(excerpts(engine, text, length), items, text, args.questions):
            document, excerpt = text[start:end], f"{start}-{end}"
            where = {"budget": length, "excerpt": excerpt}
            print(f"{length:,} tokens: excerpt {excerpt}, {len(held)} questions", file=sys.stderr)
            for method in methods:
                if method not in BUILT_AS and ("build", args.model, length, method, excerpt) not in done:
                    write({"row": "build", **where, "method": method, **build_row(engine, document, method)})
            for form in {BUILT_AS[m] for m in methods if m in BUILT_AS}:  # built above or before: looked up
                mode_of(engine, form)
                engine.compress(document, mode=form)
            for item in held:
                for method in methods:
                    if ("answer", args.model, length, method, item.id) in done:
                        continue
                    row = answer_row(engine, document, item, method, args.max_new_tokens)
                    limit = (weights + row["read_tokens"] * kv_per_token) / bandwidth
                    step = row["step_seconds"]
                    row["step_over_limit"] = round(step / limit, 2) if step else None
                    write({"row": "answer", **where, "method": method, **row})
                    mark = "ok " if row["correct"] else "-- "
                    print(f"{mark}{method} {item.id} {row['ttft_seconds']}s: {row['answer'][:70]!r}", file=sys.stderr)
            engine.document_cache.clear(disk=False)  # the next excerpt's entries in memory, not this one's


def load_rows(path: Path = ROWS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def summarize(rows: list[dict]) -> list[dict]:
    """Per (split, length, method): story questions and facts right, the one-time build (median over excerpts), a
    later question's first token and decoding step (medians; a step: the seconds after the first token over
    the tokens after it, the stop token's step and the sources included), the step over its bandwidth limit
    at the best read bandwidth measured in any run, kept tokens and bytes, peak RSS."""
    builds: dict[tuple, list[dict]] = defaultdict(list)
    answers: dict[tuple, list[dict]] = defaultdict(list)
    best: dict[str, float] = defaultdict(float)  # a run that measured its bandwidth on a busy machine is
    for r in rows:  # held to the best one measured here, not to its own lower one
        best[r["model"]] = max(best[r["model"]], r["bandwidth_gbs"])
    for r in rows:
        if r["row"] == "build":
            builds[(r["budget"], r["method"])].append(r)
        else:
            answers[(r["split"], r["budget"], r["method"])].append(r)
    out = []
    for (split, length, method), rs in sorted(answers.items()):
        built = builds.get((length, BUILT_AS.get(method, method)), [])
        story = [r["correct"] for r in rs if not r["kind"].startswith("fact")]
        facts = [r["correct"] for r in rs if r["kind"].startswith("fact")]
        steps = [r["step_seconds"] for r in rs if r["step_seconds"]]
        later = [r["ttft_seconds"] for r in rs if r["document_seconds"] == 0]  # the entry was built before
        ratios = [r["step_over_limit"] * best[r["model"]] / r["bandwidth_gbs"] for r in rs if r["step_over_limit"]]
        out.append(
            {
                "split": split,
                "length": length,
                "method": method,
                "excerpts": len({r["excerpt"] for r in rs}),
                "story": [sum(story), len(story)],
                "facts": [sum(facts), len(facts)],
                "right": sum(story) + sum(facts),
                "asked": len(rs),
                "build_seconds": statistics.median(b["seconds"] for b in built) if built else None,
                "kept_tokens": statistics.median(b["kept_tokens"] or 0 for b in built) if built else None,
                "disk_mb": round(statistics.median(b["disk_bytes"] or 0 for b in built) / 1e6, 1) if built else None,
                "ttft_seconds": round(statistics.median(later), 2) if later else None,
                "step_seconds": round(statistics.median(steps), 3) if steps else None,
                "step_over_limit": round(statistics.median(ratios), 2) if ratios else None,
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            }
        )
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| tokens | method | right (story + facts) | story | facts | one-time s | kept tokens | disk MB "
        "| later question, first token s | decoding s/token | / bandwidth limit | peak RSS MB |",
        "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['length']:,} | {s['method']} | {s['right']}/{s['asked']} | {s['story'][0]}/{s['story'][1]} "
            f"| {s['facts'][0]}/{s['facts'][1]} | {s['build_seconds']} | {s['kept_tokens']} | {s['disk_mb']} "
            f"| {s['ttft_seconds']} | {s['step_seconds']} | {s['step_over_limit']} | {s['peak_rss_mb']:,} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    """Left: answers right by length and method. Right: a later question's first token (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (right_ax, ttft_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for method in METHODS:
        points = [s for s in summary if s["method"] == method]
        if points:
            xs = [s["length"] for s in points]
            right_ax.plot(xs, [s["right"] / s["asked"] for s in points], marker="o", label=method)
            ttft_ax.plot(xs, [s["ttft_seconds"] for s in points], marker="o", label=method)
    for ax in (right_ax, ttft_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document tokens")
    right_ax.set(ylabel="answers right (held out)", ylim=(0, 1.05), title="Accuracy")
    ttft_ax.set(yscale="log", ylabel="seconds", title="A later question's first token")
    ttft_ax.axhline(1.5, color="grey", ls=":", lw=1)
    right_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


PAIRS = [(m, "full") for m in METHODS if m != "full"]


def report(args: argparse.Namespace) -> None:
    rows = load_rows(args.rows)
    answers = [r for r in rows if r["row"] == "answer"]
    summary = summarize(rows)
    comparisons = {
        split: [c for m, ref in PAIRS for c in paired(of, m, ref) if c["kind"] == "all"]
        for split, of in (
            ("heldout", [r for r in answers if r["split"] == "heldout"]),
            ("tuning", [r for r in answers if r["split"] == "tuning"]),
            ("both", answers),
        )
    }
    (RESULTS / "kept_forms.json").write_text(
        json.dumps({"summary": summary, "paired": comparisons}, indent=1), encoding="utf-8"
    )
    lengths = sorted({r["budget"] for r in rows})
    bandwidth = max((r["bandwidth_gbs"] for r in rows), default=0.0)
    held, tuning = [s for s in summary if s["split"] == "heldout"], [s for s in summary if s["split"] == "tuning"]
    (RESULTS / "kept_forms.md").write_text(
        "# Ways to keep a document within the window\n\nGenerated by `benchmarks/kept_forms.py report` from "
        f"`kept_forms_rows.jsonl` ({len(answers)} answers, with `kept_forms.png`). *Northanger Abbey* excerpts of "
        f"{', '.join(f'{n:,}' for n in lengths)} tokens with inserted facts, the questions whose evidence lies in "
        f"the excerpt; {rows[0]['model'] if rows else ''} in {rows[0]['dtype'] if rows else ''}, 2 threads; read "
        f"bandwidth {bandwidth:.1f} GB/s. One-time: the entry computed once per excerpt (median over excerpts); "
        "first token and decoding: medians over questions, the entry already built.\n\n## Held out\n\n"
        + markdown(held)
        + "\n## Tuning split (the methods run there)\n\n"
        + markdown(tuning)
        + "".join(
            f"\n## Paired, {name} (each length apart, summed over lengths; difference: method minus reference, "
            f"90% bootstrap interval)\n\n" + paired_markdown(comparisons[split])
            for split, name in (("heldout", "held out"), ("tuning", "tuning split"), ("both", "both splits"))
        ),
        encoding="utf-8",
    )
    if held:
        plot(held, RESULTS / "kept_forms.png")
    print(markdown(held) + "\n" + paired_markdown(comparisons["both"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192, 16384, 32000])
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    r.add_argument("--questions", type=int, default=12, help="held-out questions per length, at least")
    r.add_argument("--split", default="heldout", choices=("tuning", "heldout"))
    r.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--store", default="", help="document store (default: a new one under --scratch)")
    r.add_argument("--scratch", default=None, help="where the new store goes (default: the system's temp dir)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rows", type=Path, default=ROWS)
    r.set_defaults(func=run)
    rep = sub.add_parser("report")
    rep.add_argument("--rows", type=Path, default=ROWS)
    rep.set_defaults(func=report)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
