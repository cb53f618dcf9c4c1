"""Questions only the whole book answers: the package's default, the retrieval route, the evidence itself
and map-reduce over every chunk, with the same model (issue 81, item 2).

    .venv/bin/python benchmarks/whole_document.py run --book northangerabbey --split heldout \\
        --methods default bm25 oracle
    .venv/bin/python benchmarks/whole_document.py run --book northangerabbey --split heldout --methods map_reduce
    .venv/bin/python benchmarks/whole_document.py report      # JSON + markdown + plot

The document is a bundled novel, whole, with the invented multi-part facts of ``whole_facts.json``
inserted (``whole_facts.book_with_whole_facts``). The questions are the novel's whole-document set
(``question_sets.whole_question_set``: lists, counts, order, a thread's course, comparisons, multi-hop,
summaries; each needs evidence from places a fifth of the book apart) plus one per inserted fact, each
scored by its own rule (``WholeQuestion.check``: at least ``need`` named parts, in order where
``ordered``). Every method is asked the same words: the question, then ``COMPLETE`` (the answer must
name every part), greedy, ``--max-new-tokens`` (128). Methods, the same model:

- ``default``: ``HomerModel.run(book, question)`` in the package's default mode (``auto``): past the
  window the passages BM25 ranks best for the question, ``--read-tokens`` of them, re-read
  (``whole_book``'s ``query_aware``).
- ``bm25``: the retrieval route at the same budget (``whole_book.Bm25Route``: ``HomerRouter``'s
  800-character chunks, as many as fill it), its prompt closed by ``CLOSING`` instead of "in a few words".
- ``oracle``: the question's evidence given directly: ``--oracle-chars`` either side of every part's
  evidence quote, overlaps merged, in document order, as the text of the same prompt as ``bm25``'s.
  What any selection can reach with this reader.
- ``map_reduce``: the expensive anchor (LangChain's map-reduce, LlamaIndex's tree_summarize), the
  package's ``MapReduce``: the book cut at paragraph ends into pieces of at most ``--chunk-tokens``, each
  kept as a ``full`` entry (prefilled once) and read with the question for notes (or NONE), the notes
  in document order read once more for the answer (combined in halves first where they overflow).
- ``shared``: the book's one question-agnostic root kept once, a ``WindowRoot`` of ``--shared-tokens``
  (16,384: half the demo model's window; its own engine over the same weights), every question read
  after it. ``tree``: HOMER's per-question merge tree over the whole
  book (``TreeReplay``: every leaf pruned with the question in its suffix, merged level by level), the
  leaf tier built by the first question. Both are wired but cost tens of minutes a question on 2 cores.

Rows (one per model, book, dtype, method, budget and question) go to
``results/whole_document_rows.jsonl`` and are skipped on a re-run. Several methods in one invocation
take the questions in turn (each question through every method before the next), so a busy machine
slows them alike; ``load_1m`` is the machine's load when the row was written. The questions come
interleaved by kind, so ``--limit N`` keeps a spread of kinds. ``tokens_read`` is what the answer was
read from (the default: the kept cache and the question; a plain prompt: its tokens; map-reduce: every
chunk with its question, every fold and the final read). ``document_seconds`` is the one-time part
(map-reduce: the chunks' prefills, kept in the store for later questions). ``peak_rss_mb`` is the
process's peak so far.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from homer_integrations import HomerModel
from homer_integrations.homer.reading.strategies import TreeReplay, WindowRoot
from homer_integrations.map_reduce import MapReduce
from homer_integrations.question_sets import WholeQuestion, whole_question_set
from homer_integrations.routing import retrieval_prompt

sys.path.insert(0, str(Path(__file__).parent))
from whole_book import Bm25Route, paired, paired_markdown, paired_parser, paired_rows, peak_rss_mb, read_prompt, replays
from whole_facts import book_with_whole_facts

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROWS = RESULTS / "whole_document_rows.jsonl"
BOOKS = ("northangerabbey", "prideprejudice")
METHODS = ("default", "bm25", "oracle", "map_reduce", "shared", "tree")
KINDS = ("list", "count", "order", "course", "comparison", "multihop", "summary")
COMPLETE = (
    "Answer completely: name every person, place, thing or event the question asks for, "
    "in the order of the story where it asks for an order."
)
"""Follows every question, for every method."""
CLOSING = "Answer using only the text."
"""Closes the plain prompts (``retrieval_prompt``'s instruction): the route's own asks for a few words."""


def asked(question: WholeQuestion) -> str:
    """The words every method is asked: the question, then ``COMPLETE``."""
    return f"{question.question}\n{COMPLETE}"


@dataclass(frozen=True)
class Item:
    """One question about the book with offsets into the text read: ``source`` is ``story`` (the novel's
    set) or ``facts`` (an inserted fact)."""

    question: WholeQuestion
    source: str


def moved(question: WholeQuestion, inserted: Sequence[tuple[int, int]]) -> WholeQuestion:
    """``question`` with its offsets moved into the text with paragraphs ``inserted``: (where one starts in
    that text, its length), in text order."""
    cuts, before = [], 0
    for at, length in inserted:
        cuts.append((at - before, length))  # where it was inserted, in the text before any insertion
        before += length

    def shift(offset: int) -> int:
        return offset + sum(length for cut, length in cuts if cut <= offset)

    parts = tuple(replace(p, offsets=tuple(map(shift, p.offsets))) for p in question.parts)
    return replace(question, parts=parts)


def interleave(items: Iterable[Item]) -> list[Item]:
    """``items`` taken in turn by kind (a list, a count, ... then the next of each), so a prefix spreads
    over the kinds."""
    by_kind: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        by_kind[item.question.kind].append(item)
    rounds = itertools.zip_longest(*(by_kind[k] for k in sorted(by_kind, key=KINDS.index)))
    return [item for turn in rounds for item in turn if item is not None]


def book_questions(book: str) -> tuple[str, list[Item]]:
    """The book with its whole facts inserted, and every whole-document question about it (story
    questions first, then facts; offsets into the returned text)."""
    text, facts = book_with_whole_facts(book)
    # each inserted paragraph ("\n\n" + sentence) and its start in the text: a fact part's offset is its sentence's
    inserted = sorted(
        {(o - 2, len(q) + 2) for f in facts for p in f.parts for o, q in zip(p.offsets, p.evidence, strict=True)}
    )
    story = [Item(moved(q, inserted), "story") for q in whole_question_set(book).questions]
    return text, story + [Item(q, "facts") for q in facts]


def select(items: list[Item], split: str, limit: int = 0, ids: Sequence[str] = ()) -> list[Item]:
    """``items`` of ``split`` interleaved by kind; the first ``limit`` of them; only ``ids`` where given."""
    chosen = interleave(i for i in items if split in ("all", i.question.split))
    chosen = chosen[:limit] if limit else chosen
    return [i for i in chosen if i.question.id in ids] if ids else chosen


def evidence_spans(text: str, question: WholeQuestion, around: int) -> list[tuple[int, int]]:
    """``around`` characters either side of every evidence quote of ``question`` in ``text`` (whitespace in
    a quote matches any), overlaps merged, in text order, cut at whitespace."""
    spans = []
    for part in question.parts:
        for offset, quote in zip(part.offsets, part.evidence, strict=True):
            found = re.compile(r"\s+".join(map(re.escape, quote.split()))).search(text, offset)
            start, end = (found.start(), found.end()) if found else (offset, offset + len(quote))
            spans.append((max(0, start - around), min(len(text), end + around)))
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out = []
    for start, end in merged:
        head = re.search(r"\s", text[start:end]) if start > 0 else None
        tail = re.search(r"\s\S*$", text[start:end]) if end < len(text) else None
        out.append((start + (head.end() if head else 0), start + (tail.start() if tail else end - start)))
    return out


def oracle_prompt(text: str, question: WholeQuestion, around: int) -> str:
    """The evidence of ``question`` (``evidence_spans``) as the text of ``retrieval_prompt``."""
    passages = [text[a:b] for a, b in evidence_spans(text, question, around)]
    return retrieval_prompt(asked(question), passages, CLOSING)


@dataclass
class Answer:
    """One method's answer: text, seconds to its first piece, tokens it was read from, the one-time
    seconds in it, where its cache came from, and (map-reduce) chunks read and notes kept."""

    text: str
    ttft: float
    tokens_read: int
    document_seconds: float = 0.0
    cache_source: str | None = None
    reads: int = 1
    notes: int | None = None


class Methods:
    """The ways to answer (``METHODS``) a question about ``text`` with one engine at one token budget."""

    def __init__(self, engine: HomerModel, text: str, args: argparse.Namespace) -> None:
        self.engine, self.text, self.args = engine, text, args
        self.budget = args.read_tokens
        self.route = Bm25Route(engine, text, self.budget) if "bm25" in args.methods else None
        self.map_reduce = (
            MapReduce(engine, args.chunk_tokens, args.note_tokens, progress=False)
            if "map_reduce" in args.methods
            else None
        )
        self.shared = self.shared_engine() if "shared" in args.methods else None

    def shared_engine(self) -> HomerModel:
        """An engine over the same weights, settings and store whose shared root is a ``WindowRoot`` of
        ``--shared-tokens``."""
        e = self.engine
        return HomerModel(
            e.model,
            e.tokenizer,
            e.config,
            model_name=e.model_name,
            document_cache=e.document_cache,
            calibration_dir=e.tiers.calibration.store.user_dir,
            recipe=replace(e.recipe, shared_root=WindowRoot(self.args.shared_tokens)),
            progress=True,
        )

    def ask(self, method: str, question: WholeQuestion) -> Answer:
        words, new = asked(question), self.args.max_new_tokens
        started = time.perf_counter()
        if method == "bm25":
            assert self.route is not None
            prompt = self.route.prompt(words, CLOSING)
            text, ttft = read_prompt(self.engine, prompt, new, started)
            return Answer(text, ttft, self.engine.count_tokens(prompt))
        if method == "oracle":
            prompt = oracle_prompt(self.text, question, self.args.oracle_chars)
            text, ttft = read_prompt(self.engine, prompt, new, started)
            return Answer(text, ttft, self.engine.count_tokens(prompt))
        if method == "map_reduce":
            assert self.map_reduce is not None
            m = self.map_reduce.answer(self.text, words, max_new_tokens=new)
            ttft = m.first_token_seconds or time.perf_counter() - started
            source = ",".join(m.cache_sources) or None  # computed, then memory or disk
            return Answer(m.text, ttft, m.tokens_read, m.built_seconds, source, m.reads, len(m.notes))
        engine, mode = self.engine, None  # default: auto
        if method == "tree":
            mode, replay = "query_aware", TreeReplay()
        else:
            replay = replays(self.budget)["query_aware"]
        if method == "shared":
            assert self.shared is not None
            engine, mode = self.shared, "shared"
        engine.tiers.recipe = replace(engine.tiers.recipe, replay=replay)
        stream = engine.run(self.text, words, mode=mode, max_new_tokens=new)
        text = stream.text()
        info = stream.info
        return Answer(
            text,
            info.time_to_first_token or time.perf_counter() - started,
            info.cache_tokens + info.input_tokens,
            info.document_seconds,
            info.cache_source,
        )


def load_rows(path: Path | None = None) -> list[dict]:
    path = path or ROWS
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def key(row: dict) -> tuple:
    return (row["model"], row["book"], row["dtype"], row["method"], row["budget"], row["id"])


def run(args: argparse.Namespace, engine: HomerModel | None = None) -> None:
    """Answer the selected questions by every method of ``args.methods``, question by question; ``engine``:
    a ready one (default: ``args.model`` loaded with the store)."""
    torch.set_num_threads(args.threads)
    if engine is None:
        engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, store=args.store or True)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    text, items = book_questions(args.book)
    items = select(items, args.split, args.limit, args.ids)
    done = {key(r) for r in load_rows(args.rows)}
    book_tokens = engine.count_tokens(text)
    print(f"{args.book}: {len(text):,} characters, {book_tokens:,} tokens; {len(items)} questions", file=sys.stderr)
    methods = Methods(engine, text, args)
    for item in items:
        q = item.question
        for method in args.methods:
            base = {"model": args.model, "book": args.book, "dtype": dtype, "method": method}
            if key({**base, "budget": args.read_tokens, "id": q.id}) in done:
                continue
            started = time.perf_counter()
            a = methods.ask(method, q)
            row = {
                **base,
                "budget": args.read_tokens,
                "id": q.id,
                "kind": q.kind,
                "source": item.source,
                "split": q.split,
                "question": q.question,
                "answer": a.text,
                "correct": bool(q.check(a.text)),
                "matched": q.matched(a.text),
                "need": q.need,
                "parts": len(q.parts),
                "ttft_seconds": round(a.ttft, 2),
                "seconds": round(time.perf_counter() - started, 2),
                "document_seconds": round(a.document_seconds, 1),
                "tokens_read": a.tokens_read,
                "cache_source": a.cache_source,
                "reads": a.reads,
                "notes": a.notes,
                "chunk_tokens": args.chunk_tokens if method == "map_reduce" else None,
                "max_new_tokens": args.max_new_tokens,
                "book_tokens": book_tokens,
                "peak_rss_mb": round(peak_rss_mb()),
                "load_1m": round(os.getloadavg()[0], 2),
                "threads": args.threads,
            }
            args.rows.parent.mkdir(parents=True, exist_ok=True)
            with args.rows.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            mark = "ok " if row["correct"] else "-- "
            print(
                f"{mark}{method} {q.id} {len(row['matched'])}/{q.need} {row['seconds']}s: {a.text.strip()[:80]!r}",
                file=sys.stderr,
            )


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, book, dtype, budget, method, split): right/asked per kind and over all (each method over
    the questions it answered: ``paired`` compares two on the same ones), inserted facts apart, the
    median seconds a question took and to its first token past the first question (the one-time cost
    apart: the largest ``document_seconds``), tokens read (median) and the peak RSS."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["book"], r["dtype"], r["budget"], r["method"], r["split"])].append(r)
    out = []
    for (model, book, dtype, budget, method, split), rs in sorted(groups.items()):
        later = [r for r in rs if not r["document_seconds"]] or rs
        out.append(
            {
                "model": model,
                "book": book,
                "dtype": dtype,
                "budget": budget,
                "method": method,
                "split": split,
                "kinds": {k: right_asked(r for r in rs if r["kind"] == k) for k in KINDS},
                "story": right_asked(r for r in rs if r["source"] == "story"),
                "facts": right_asked(r for r in rs if r["source"] == "facts"),
                "all": right_asked(rs),
                "parts_named": round(statistics.mean(min(len(r["matched"]) / r["need"], 1.0) for r in rs), 2),
                "median_seconds": _median([r["seconds"] for r in later]),
                "median_ttft_seconds": _median([r["ttft_seconds"] for r in later]),
                "one_time_seconds": max(r["document_seconds"] for r in rs),
                "median_tokens_read": int(statistics.median(r["tokens_read"] for r in rs)),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                "median_load_1m": _median([r["load_1m"] for r in rs]),
            }
        )
    return out


def right_asked(rows: Iterable[dict]) -> list[int]:
    rows = list(rows)
    return [sum(r["correct"] for r in rows), len(rows)]


def markdown(summary: list[dict]) -> str:
    def ratio(pair: list[int]) -> str:
        return f"{pair[0]}/{pair[1]}" if pair[1] else "-"

    lines = [
        "| book | method | split | "
        + " | ".join(KINDS)
        + " | story | facts | all | parts named | s / question (median) "
        "| first token s | one-time s | tokens read (median) | peak RSS MB | load (median) |",
        "|---|---|---|" + "---|" * (len(KINDS) + 11),
    ]
    for s in summary:
        kinds = " | ".join(ratio(s["kinds"][k]) for k in KINDS)
        lines.append(
            f"| {s['book']} | {s['method']} | {s['split']} | {kinds} | {ratio(s['story'])} | {ratio(s['facts'])} "
            f"| **{ratio(s['all'])}** | {s['parts_named']:.2f} | {s['median_seconds']} | {s['median_ttft_seconds']} "
            f"| {s['one_time_seconds']:.0f} | {s['median_tokens_read']:,} | {s['peak_rss_mb']:,} "
            f"| {s['median_load_1m']} |"
        )
    return "\n".join(lines) + "\n"


def against_bm25(rows: list[dict]) -> list[dict]:
    """Every other method against ``bm25`` on the questions both answered (both books, each split apart):
    per kind and over all (``whole_book.paired``, 90% bootstrap intervals)."""
    methods = sorted({r["method"] for r in rows} - {"bm25"}, key=METHODS.index)
    out = []
    for split in ("heldout", "tuning"):
        these = [r for r in rows if r["split"] == split]
        for method in methods:
            for c in paired(these, method, "bm25", kind_of=lambda r: r["kind"]):
                out.append({**c, "split": split})
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Left: held-out accuracy per kind and method (both books). Right: seconds per question per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held = [r for r in rows if r["split"] == "heldout"] or rows
    methods = [m for m in METHODS if any(r["method"] == m for r in held)]
    fig, (acc, cost) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        mine = [r for r in held if r["method"] == method]
        shares = []
        for kind in [*KINDS, "all"]:
            rs = [r for r in mine if kind in ("all", r["kind"])]
            shares.append(sum(r["correct"] for r in rs) / len(rs) if rs else 0.0)
        acc.bar([x + i * width for x in range(len(KINDS) + 1)], shares, width, label=f"{method} ({len(mine)})")
        seconds = [r["seconds"] - r["document_seconds"] for r in mine]
        cost.bar(i, statistics.median(seconds) if seconds else 0.0, 0.6)
    acc.set_xticks([x + 0.4 - width / 2 for x in range(len(KINDS) + 1)], [*KINDS, "all"])
    acc.set(ylabel="answers right", ylim=(0, 1.05), title="Whole-document questions, held out, both books")
    acc.legend(fontsize=8)
    cost.set_xticks(range(len(methods)), methods, rotation=30)
    cost.set(yscale="log", ylabel="seconds a question (median, one-time cost apart)", title="2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def rescored(rows: list[dict]) -> list[dict]:
    """``rows`` scored again by the question sets as they are now (a rule mended after a run, such as
    ``question_sets.unlisted``); a row whose question is gone keeps its score."""
    questions: dict[tuple[str, str], WholeQuestion] = {}
    for book in sorted({r["book"] for r in rows} & set(BOOKS)):
        questions.update({(book, i.question.id): i.question for i in book_questions(book)[1]})
    out = []
    for r in rows:
        q = questions.get((r["book"], r["id"]))
        out.append(r if q is None else {**r, "correct": q.check(r["answer"]), "matched": q.matched(r["answer"])})
    return out


def report(args: argparse.Namespace) -> None:
    rows = rescored(load_rows(getattr(args, "rows", None)))
    summary, pairs = summarize(rows), against_bm25(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "whole_document.json").write_text(
        json.dumps({"summary": summary, "against_bm25": pairs}, indent=1), encoding="utf-8"
    )
    table = markdown(summary)
    held = [c for c in pairs if c["split"] == "heldout"]
    (RESULTS / "whole_document.md").write_text(
        "# Whole-document questions\n\nGenerated by `benchmarks/whole_document.py report` from "
        f"`whole_document_rows.jsonl` ({len(rows)} answers), with `whole_document.png`.\n\n"
        "## Against the retrieval route, held out\n\nBoth books; each pair on the questions both methods "
        "answered (difference: the method's accuracy minus `bm25`'s, 90% bootstrap interval).\n\n"
        + paired_markdown(held)
        + "\n## Every run\n\nRight/asked per kind, each method over the questions it answered (counts differ "
        "where a method ran on fewer). `parts named`: the mean share of the parts a question needs that the "
        "answer named (partial credit; 1 when it names `need` of them). Seconds: the median per question past "
        "the one-time cost (the "
        "largest `document_seconds`: map-reduce's chunk prefills, kept for later questions), on a 2-core "
        "machine shared with other work (`load` is its 1-minute load average).\n\n" + table,
        encoding="utf-8",
    )
    if rows:
        plot(rows, RESULTS / "whole_document.png")
    print(paired_markdown(held) + "\n" + table)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--book", default="northangerabbey", choices=BOOKS)
    r.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--methods", nargs="+", default=["default", "bm25", "oracle"], choices=METHODS)
    r.add_argument("--split", default="heldout", choices=("tuning", "heldout", "all"))
    r.add_argument("--limit", type=int, default=0, help="the first N questions, interleaved by kind")
    r.add_argument("--ids", nargs="+", default=[], help="then only these question ids")
    r.add_argument("--read-tokens", type=int, default=2048, help="default's passages and bm25's chunks")
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--oracle-chars", type=int, default=600, help="oracle: characters either side of each quote")
    r.add_argument("--chunk-tokens", type=int, default=8192, help="map_reduce: most tokens a chunk has")
    r.add_argument("--note-tokens", type=int, default=64, help="map_reduce: most tokens a chunk's note has")
    r.add_argument("--shared-tokens", type=int, default=16384, help="shared: the window root's tokens")
    r.add_argument("--store", default="", help="document store (default: the package's cache directory)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rows", type=Path, default=ROWS, help="rows file (another: a timing run apart)")
    r.set_defaults(func=run)
    rep = sub.add_parser("report")
    rep.set_defaults(func=report)
    paired_parser(sub, METHODS).set_defaults(func=paired_command)
    return p


def paired_command(args: argparse.Namespace) -> None:
    rows = paired_rows(load_rows(), args)
    print(paired_markdown(paired(rows, args.method, args.reference, kind_of=lambda r: r["kind"])), end="")


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
