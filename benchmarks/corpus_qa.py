"""Questions across a corpus: ``ask_corpus`` against what a user would use instead, on 92 chapters.

    .venv/bin/python benchmarks/corpus_qa.py run --methods corpus bm25 per_document --split heldout --limit 18
    .venv/bin/python benchmarks/corpus_qa.py report          # JSON + markdown table + plot

The corpus is both bundled novels split into their chapters (Northanger Abbey's 31, Pride and
Prejudice's 61), each a document named ``<book>/chapter-NN`` (chapter 1 also holds the title page, so
a book's chapters rejoin to it), laid out by ``Corpus`` as one text of about 275k tokens. The
invented two-hop facts of ``corpus_facts.json`` are inserted into it: each a pair of sentences, one
paragraph each, in two different chapters (the first ties something of the story to an invented
name, the second says what the question asks of that name). The questions:

- ``one_doc``: the whole-book sets (``homer_integrations/data/questions/<book>_book.json``), each
  mapped to the chapter holding its evidence (its character offset in the book);
- ``two_doc``: one per two-hop fact, its evidence the two chapters;

each with its split (``tuning`` / ``heldout``). Methods, the same model and token budget (``--read-tokens``):

- ``corpus``: ``stream_corpus`` (what ``ask_corpus`` consumes) over the whole corpus: past the model's
  window the passages BM25 ranks best across every chapter, ``--read-tokens`` of them, re-read once;
  ``cited_evidence`` is the share of the question's evidence chapters among the sources it cites.
- ``corpus_noheading``: ``corpus`` whose kept passages come without their document's ``Document:`` line
  and BM25 over words as written (``PassageSelection(heading=None, stemmer=None)``: the package before
  2026-12-02; its rows were named ``corpus``).
- ``corpus_unstemmed``, ``bm25_unstemmed``: ``corpus`` and ``bm25`` with BM25 over words as written (the
  package before 2026-12-03; their rows were named ``corpus`` and ``bm25``). ``per_document_unstemmed``:
  ``per_document`` routing by BM25 over words as written (its rows were named ``per_document``).
- ``bm25``: the retrieval route over the joined text (``whole_book.Bm25Route``: ``HomerRouter``'s 800-character
  chunks, as many as fill the budget); ``cited_evidence`` from the chapters its chunks lie in.
- ``per_document``: the one chapter BM25 ranks best for the question (whole chapters indexed), then
  ``HomerModel.run(chapter, q, mode="query_aware")``: HOMER's per-question path on one document within
  the window, its leaf tier built by the first question about that chapter and kept in the store
  (``document_seconds``). ``cited_evidence``: 1 when the chapter is the evidence, 1/2 for one of two.

``ttft_seconds`` is measured the same way for every method: from the call to the first piece of the
answer (the routing, the selection, the re-read and a leaf tier's build included).

Rows (one per model, dtype, method, budget and question) are appended to
``results/corpus_qa_rows.jsonl`` and skipped on a re-run. ``--limit N`` keeps at most N questions of
each kind (``one_doc``, ``two_doc``) spread over the corpus, ``--stride K`` then every K-th of each.
Several methods in one invocation take the questions in turn (each question through every method
before the next), so a busy machine slows them alike. ``peak_rss_mb`` is the process's peak so far.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import statistics
import sys
import time
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.corpus import Corpus, NamedText, stream_corpus
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import AutoReplay
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import KeywordQuestion, question_set

sys.path.insert(0, str(Path(__file__).parent))
from whole_book import (
    Bm25Route,
    paired,
    paired_markdown,
    paired_parser,
    paired_rows,
    peak_rss_mb,
    replays,
    shared_questions,
)

if TYPE_CHECKING:
    from homer_integrations.engine.answering import AnswerInfo

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROWS = RESULTS / "corpus_qa_rows.jsonl"
FACTS = HERE / "corpus_facts.json"
BOOKS = ("northangerabbey", "prideprejudice")
METHODS = (
    "corpus",
    "corpus_noheading",
    "corpus_unstemmed",
    "bm25",
    "bm25_unstemmed",
    "per_document",
    "per_document_unstemmed",
)
KINDS = ("one_doc", "two_doc")
CHAPTER = re.compile(r"^(?:CHAPTER|Chapter) (\d+)[ \t]*$", re.MULTILINE)


@functools.cache
def chapters(book: str) -> tuple[NamedText, ...]:
    """The bundled ``book`` cut at its chapter headings, each chapter a document ``<book>/chapter-NN``
    (the first also holds the title page): their texts joined are the book."""
    text = bundled_text(book)
    heads = list(CHAPTER.finditer(text))
    numbers = [int(m.group(1)) for m in heads]
    if numbers != list(range(1, len(heads) + 1)):
        raise ValueError(f"{book}: chapter headings out of order: {numbers}")
    cuts = [0, *(m.start() for m in heads[1:]), len(text)]
    return tuple(
        NamedText(f"{book}/chapter-{n:02d}", text[a:b]) for n, a, b in zip(numbers, cuts[:-1], cuts[1:], strict=True)
    )


def chapter_of(book: str, offset: int) -> str:
    """The name of the chapter of ``book`` holding character ``offset`` of the bundled text."""
    docs = chapters(book)
    starts = list(itertools.accumulate((len(doc.text) for doc in docs[:-1]), initial=0))
    return docs[bisect_right(starts, offset) - 1].name


def load_facts(path: Path = FACTS) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


def insert_paragraph(text: str, at: float, sentence: str) -> str:
    """``sentence`` as a paragraph of its own at the first paragraph break from ``at`` (0-1) of ``text`` on."""
    cut = text.find("\n\n", int(at * len(text)))
    cut = len(text) if cut < 0 else cut
    return text[:cut] + "\n\n" + sentence + text[cut:]


@dataclass(frozen=True)
class Item:
    """One question across the corpus: its checker, ``kind`` (``one_doc`` / ``two_doc``), the question's
    own kind (who / what / ... or the fact's), split, and the documents holding its evidence."""

    id: str
    question: str
    check: Callable[[str], bool]
    kind: str
    question_kind: str
    split: str
    evidence: tuple[str, ...]


def build(books: Sequence[str] = BOOKS, facts: list[dict[str, Any]] | None = None) -> tuple[Corpus, list[Item]]:
    """The corpus (every chapter of ``books``, the two-hop facts inserted) and every question about it,
    in corpus order (by the first evidence document, then the offset)."""
    documents = {doc.name: doc.text for book in books for doc in chapters(book)}
    facts = load_facts() if facts is None else facts
    items: list[tuple[tuple[int, int], Item]] = []
    order = {name: i for i, name in enumerate(documents)}
    for fact in facts:
        hops = [hop["document"] for hop in fact["hops"]]
        if len(set(hops)) != len(hops) or not all(h in documents for h in hops):
            raise ValueError(f"fact {fact['id']}: its hops need different documents of the corpus, not {hops}")
        for hop in fact["hops"]:
            documents[hop["document"]] = insert_paragraph(documents[hop["document"]], hop["at"], hop["sentence"])
        q = KeywordQuestion(fact["id"], fact["question"], tuple(map(tuple, fact["keywords"])), 0)
        item = Item(fact["id"], fact["question"], q.check, "two_doc", fact["kind"], fact["split"], tuple(hops))
        items.append(((min(order[h] for h in hops), 0), item))
    for book in books:
        for q in question_set(f"{book}_book").questions:
            name = chapter_of(book, q.offset)
            item = Item(q.id, q.question, q.check, "one_doc", q.kind, q.split, (name,))
            items.append(((order[name], q.offset), item))
    return Corpus(documents), [item for _, item in sorted(items, key=lambda pair: pair[0])]


def select(items: list[Item], split: str, limit: int = 0, stride: int = 1) -> list[Item]:
    """The questions of ``split`` (``all``: both); of each kind at most ``limit`` (0: all) spread evenly
    over the corpus, then every ``stride``-th; in corpus order."""
    kept: set[str] = set()
    for kind in KINDS:
        mine = [i for i in items if i.kind == kind and split in ("all", i.split)]
        if limit and len(mine) > limit:
            mine = [mine[round(j * (len(mine) - 1) / max(limit - 1, 1))] for j in range(limit)]
        kept |= {i.id for i in mine[::stride]}
    return [i for i in items if i.id in kept]


def cited_share(evidence: Sequence[str], cited: set[str]) -> float:
    """The share of the ``evidence`` documents among the ``cited`` ones."""
    return round(sum(name in cited for name in evidence) / len(evidence), 3)


def chunk_documents(corpus: Corpus, chunks: Sequence[str]) -> list[frozenset[str]]:
    """The documents each chunk of ``corpus.text`` lies in (chunks in text order, as a splitter gives
    them; a chunk not found: none)."""
    found, cursor = [], 0
    for chunk in chunks:
        at = corpus.text.find(chunk, cursor)
        at = corpus.text.find(chunk) if at < 0 else at
        if at < 0:
            found.append(frozenset())
            continue
        cursor = at + 1
        found.append(frozenset(s.name for s in corpus.cite([(at, at + len(chunk))])))
    return found


class DocumentRouter:
    """BM25 over whole documents: a question goes to the one ranked best (the first document when no
    word of it is indexed)."""

    def __init__(self, corpus: Corpus, stemmer: str | None = "english") -> None:
        from homer_integrations.homer.scoring.lexical import BM25Index

        self.corpus = corpus
        self.index = BM25Index([doc.text for doc in corpus], stemmer=stemmer)

    def route(self, question: str) -> NamedText:
        hits = self.index.search(question, 1)
        return self.corpus.documents[hits[0].index if hits else 0]


def consume(pieces: Iterator[str], started: float) -> tuple[str, float]:
    """The whole answer and the seconds from ``started`` to its first piece."""
    first = None
    text = []
    for piece in pieces:
        first = first if first is not None else time.perf_counter() - started
        text.append(piece)
    return "".join(text), first if first is not None else time.perf_counter() - started


@dataclass
class Asked:
    """One method's answer: text, seconds to the first piece, documents read, the engine's info if any."""

    answer: str
    ttft: float
    cited: set[str]
    info: AnswerInfo | None = None


class Methods:
    """The ways to answer a question across ``corpus`` (``METHODS``) with one engine at one token budget."""

    def __init__(self, engine: HomerModel, corpus: Corpus, budget: int, methods: Sequence[str]) -> None:
        self.engine, self.corpus = engine, corpus
        # every HOMER call re-reads the same tokens, whatever the machine (whole_book's query_aware)
        default = replays(budget)["query_aware"]
        noheading = replace(default.passages, selection=PassageSelection(heading=None, stemmer=None))
        unstemmed = replace(default.passages, selection=PassageSelection(stemmer=None))
        self.replays = {
            "corpus": default,
            "corpus_noheading": AutoReplay(noheading),
            "corpus_unstemmed": AutoReplay(unstemmed),
        }
        self.routes = {
            method: Bm25Route(engine, corpus.text, budget, stemmer=stemmer)
            for method, stemmer in (("bm25", "english"), ("bm25_unstemmed", None))
            if method in methods
        }
        route = next(iter(self.routes.values()), None)  # both split the text alike
        self.chunk_docs = chunk_documents(corpus, route.index.chunks) if route else []
        self.routers = {
            method: DocumentRouter(corpus, stemmer)
            for method, stemmer in (("per_document", "english"), ("per_document_unstemmed", None))
            if method in methods
        }

    def ask(self, method: str, question: str, max_new_tokens: int) -> Asked:
        started = time.perf_counter()
        replay = self.replays.get(method, self.replays["corpus"])
        self.engine.tiers.recipe = replace(self.engine.tiers.recipe, replay=replay)
        if method in self.replays:
            stream = stream_corpus(self.engine, self.corpus, question, max_new_tokens=max_new_tokens)
            answer, ttft = consume(stream, started)
            return Asked(answer, ttft, {s.name for s in stream.sources}, stream.info)
        if method in self.routes:
            retrieval = self.routes[method]
            answer, ttft = retrieval.answer(question, max_new_tokens)
            kept = retrieval.index.search(question, retrieval.k)  # the same search, again: cheap
            return Asked(answer, ttft, set().union(*(self.chunk_docs[p.index] for p in kept)))
        if method in self.routers:
            doc = self.routers[method].route(question)
            run = self.engine.run(doc.text, question, mode="query_aware", max_new_tokens=max_new_tokens)
            answer, ttft = consume(run, started)
            return Asked(answer, ttft, {doc.name}, run.info)
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")


def done_keys() -> set[tuple]:
    return {(r["model"], r["dtype"], r["method"], r["budget"], r["id"]) for r in load_rows()}


def run(args: argparse.Namespace, engine: HomerModel | None = None) -> None:
    """Answer the selected questions by every method in ``args.methods``; ``engine``: a ready one
    (default: ``args.model`` loaded with ``final_cache_len`` the budget and the store)."""
    torch.set_num_threads(args.threads)
    budget = args.read_tokens
    if engine is None:
        config = HomerConfig(final_cache_len=budget)
        engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, config=config, store=args.store or True)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    corpus, items = build()
    items = select(items, args.split, args.limit, args.stride)
    done = done_keys()
    offsets = engine.token_offsets(corpus.text)  # remembered: the corpus method tokenizes nothing again
    corpus_tokens = len(offsets) if offsets is not None else engine.count_tokens(corpus.text)
    print(
        f"{len(corpus)} documents, {len(corpus.text):,} characters, {corpus_tokens:,} tokens; {len(items)} questions",
        file=sys.stderr,
    )
    methods = Methods(engine, corpus, budget, args.methods)
    # question by question, every method in turn: a busy machine slows the methods alike
    for item in items:
        for method in args.methods:
            if (args.model, dtype, method, budget, item.id) in done:
                continue
            started = time.perf_counter()
            asked = methods.ask(method, item.question, args.max_new_tokens)
            row = {
                "model": args.model,
                "dtype": dtype,
                "method": method,
                "budget": budget,
                "id": item.id,
                "kind": item.kind,
                "question_kind": item.question_kind,
                "split": item.split,
                "question": item.question,
                "answer": asked.answer,
                "correct": bool(item.check(asked.answer)),
                "evidence": list(item.evidence),
                "cited_evidence": cited_share(item.evidence, asked.cited),
                "cited_documents": len(asked.cited),
                "ttft_seconds": round(asked.ttft, 2),
                "seconds": round(time.perf_counter() - started, 2),
                "document_seconds": round(asked.info.document_seconds, 1) if asked.info else 0.0,
                "cache_source": asked.info.cache_source if asked.info else None,
                "corpus_tokens": corpus_tokens,
                "peak_rss_mb": round(peak_rss_mb()),
            }
            ROWS.parent.mkdir(parents=True, exist_ok=True)
            with ROWS.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            mark = "ok " if row["correct"] else "-- "
            print(
                f"{mark}{method} {item.id} cited {row['cited_evidence']} ttft {row['ttft_seconds']}s: "
                f"{asked.answer.strip()[:80]!r}",
                file=sys.stderr,
            )


def load_rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()] if ROWS.is_file() else []


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, dtype, budget, method, split), over the questions it shares with the corpus path
    (``whole_book.shared_questions``: an ablation asked a few questions does not shrink the other rows;
    ``paired`` compares two methods exactly): right/asked and the mean share of evidence documents
    cited, per kind; the seconds spent building leaf tiers; the median seconds to the first token over
    every question and over those whose tier was ready."""
    asked: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        asked[(r["model"], r["dtype"], r["budget"], r["split"])][r["method"]].add(r["id"])
    common = {
        (*key, method): shared_questions(methods, method, default="corpus")
        for key, methods in asked.items()
        for method in methods
    }
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["id"] in common[(r["model"], r["dtype"], r["budget"], r["split"], r["method"])]:
            groups[(r["model"], r["dtype"], r["budget"], r["method"], r["split"])].append(r)
    out = []
    for (model, dtype, budget, method, split), rs in sorted(groups.items()):
        entry: dict[str, Any] = {"model": model, "dtype": dtype, "budget": budget, "method": method, "split": split}
        for kind in KINDS:
            mine = [r for r in rs if r["kind"] == kind]
            entry[kind] = [sum(r["correct"] for r in mine), len(mine)]
            shares = [r["cited_evidence"] for r in mine]
            entry[f"{kind}_cited"] = round(statistics.mean(shares), 3) if shares else None
        entry["two_doc_both_cited"] = sum(r["cited_evidence"] == 1 for r in rs if r["kind"] == "two_doc")
        entry["build_seconds"] = round(sum(r["document_seconds"] for r in rs), 1)
        entry["median_ttft_seconds"] = _median([r["ttft_seconds"] for r in rs])
        entry["median_ttft_ready_seconds"] = _median([r["ttft_seconds"] for r in rs if r["document_seconds"] == 0])
        entry["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rs)
        out.append(entry)
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| model | dtype | budget | method | split | one document | two documents | evidence cited, one doc "
        "| evidence cited, two docs (both) | tier build s | first token s (median) "
        "| first token s, tier ready (median) | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(pair: list[int]) -> str:
        return f"{pair[0]}/{pair[1]}" if pair[1] else "-"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for s in summary:
        both = f" ({s['two_doc_both_cited']}/{s['two_doc'][1]})" if s["two_doc"][1] else ""
        lines.append(
            f"| {s['model']} | {s['dtype']} | {s['budget']} | {s['method']} | {s['split']} | {ratio(s['one_doc'])} "
            f"| {ratio(s['two_doc'])} | {share(s['one_doc_cited'])} | {share(s['two_doc_cited'])}{both} "
            f"| {s['build_seconds']:.0f} | {s['median_ttft_seconds']} | {s['median_ttft_ready_seconds']} "
            f"| {s['peak_rss_mb']:,} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['method']}\n{s['split']}, {s['budget']}" for s in summary]
    xs = range(len(summary))
    fig, axes = plt.subplots(1, 2, figsize=(max(7, 1.3 * len(summary) + 2), 4), sharey=True)
    for ax, field, title in ((axes[0], "", "answers right"), (axes[1], "_cited", "evidence documents cited")):
        for shift, kind in ((-0.2, "one_doc"), (0.2, "two_doc")):
            if field:
                values = [s[f"{kind}_cited"] or 0.0 for s in summary]
            else:
                values = [s[kind][0] / s[kind][1] if s[kind][1] else 0.0 for s in summary]
            ax.bar([x + shift for x in xs], values, width=0.4, label=kind.replace("_", " "))
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
    axes[0].legend(fontsize=7)
    fig.suptitle("Questions across 92 chapters: same model, same token budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def paired_command(args: argparse.Namespace) -> None:
    rows = paired_rows(load_rows(), args)
    print(paired_markdown(paired(rows, args.method, args.reference, kind_of=lambda r: r["kind"])), end="")


def report(_: argparse.Namespace) -> None:
    rows = load_rows()
    summary = summarize(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "corpus_qa.json").write_text(json.dumps({"summary": summary}, indent=1), encoding="utf-8")
    table = markdown(summary)
    (RESULTS / "corpus_qa.md").write_text(
        "# Questions across a corpus\n\nGenerated by `benchmarks/corpus_qa.py report` from `corpus_qa_rows.jsonl` "
        f"({len(rows)} answers). Answers right/asked per kind, each method over the questions it shares with "
        "the corpus path (`corpus`), so counts differ between rows: `corpus_qa.py paired A B` compares two "
        "methods on exactly the same questions. Evidence cited: the mean share of a question's "
        "evidence documents the method read (in brackets: two-document questions with both read).\n\n" + table,
        encoding="utf-8",
    )
    if summary:
        plot(summary, RESULTS / "corpus_qa.png")
    print(table)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    r.add_argument("--split", default="tuning", choices=("tuning", "heldout", "all"))
    r.add_argument("--limit", type=int, default=0, help="at most this many questions of each kind, spread out")
    r.add_argument("--stride", type=int, default=1, help="then every n-th of those, of each kind")
    r.add_argument(
        "--read-tokens",
        type=int,
        default=2048,
        help="every method's token budget: passages re-read, BM25's chunks, final_cache_len (<= max_chunk_len)",
    )
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--store", default="", help="document store (default: the package's cache directory)")
    r.add_argument("--threads", type=int, default=2)
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    paired_parser(sub, METHODS).set_defaults(func=paired_command)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
