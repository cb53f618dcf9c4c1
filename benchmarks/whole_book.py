"""Whole books, many questions: HOMER's per-question path against the retrieval route, on a whole novel.

    .venv/bin/python benchmarks/whole_book.py run --book northangerabbey --methods query_aware --split tuning
    .venv/bin/python benchmarks/whole_book.py run --book northangerabbey --methods bm25 --split tuning
    .venv/bin/python benchmarks/whole_book.py report          # JSON + markdown table + plot

The document is a bundled novel, whole (Northanger Abbey ~106k tokens, Pride and Prejudice ~168k:
three to five times Qwen2.5's 32k window), with the invented facts of ``book_facts.json`` inserted
as paragraphs at depths 0.05-0.95. The questions are the book's whole-book set
(``homer_integrations/data/questions/<book>_book.json``: who / what / where / when / why, in words
that differ from the text's) plus one per inserted fact; each has a split (``tuning`` / ``heldout``)
and is reported by split, kind and depth. Methods, the same model and token budget:

- ``query_aware``: ``HomerModel.answer(book, q, mode="query_aware")`` with a store (the package's
  default). Past the model's window it keeps the whole passages BM25 ranks best for the question
  (``homer.reading.passages``, no leaf tier) and re-reads them.
- ``fused``: the same passages ranked by BM25 and question attention over the leaf tier together
  (reciprocal-rank fusion, ``PassageSelection(attention=1.0)``): the tier built once (paid by the
  first question, kept on disk). The rows before 2026-12-03 named ``query_aware`` were this method.
- ``tokens``: the per-question path before passages (``RecomputeReplay``): the ``final_cache_len``
  best single statements by question attention, re-read (the rows before 2026-12-02 named
  ``query_aware`` were this method and are relabelled).
- ``hybrid``: ``tokens`` whose selection also keeps the statements BM25 ranks best for the
  question (``homer.scoring.lexical.LexicalEvidence``: at most a quarter of the same budget), from the same tier.
- ``shared``: the book's one question-agnostic root (``mode="shared"``), built once.
- ``window``: the same, a ``WindowRoot`` of ``--window-tokens`` (16,384: half the demo model's window)
  instead of one chunk's. ``window_passages``: that root kept, then the ``--passage-tokens`` (512) of
  BM25 chunks best for the question read after it with the question (``after_root``).
- ``kept``: the same root, then the 512 tokens of the default's own passages (``PassageSelection``,
  about 128 tokens each, in the document's order) BM25 ranks best, between a header and a footer, then
  the question (``after_root_passages``): ``mode="kept"`` for one commit, removed when a 512-token re-read
  with no root answered as well, 2.5x sooner.
- ``bm25``: the retrieval route the package ships (``HomerRouter``'s: ``RecursiveCharacterTextSplitter``
  chunks of 800 characters, BM25, ``retrieval_prompt``), with as many chunks as fill the budget.
- ``query_aware_unstemmed``, ``bm25_unstemmed``: the two above with BM25 over words as written, as
  they were before 2026-12-03, when BM25 began to stem (``BM25Index``); their rows of before are
  relabelled. The rows of ``fused``, ``hybrid`` and the layouts also ran BM25 over words as written.
- ``upper``: the default's passages read from the leaf tier, only the layers above the leaves run per
  question (``upper_read.UpperRead``).
- ``reuse15`` / ``reuse0``: the default's passages read from stored blocks' K/V, 15% (or none) of their
  tokens recomputed past the first layer (``passage_reuse.ReusedPassages``, CacheBlend).

Rows (one per model, book, dtype, method, budget and question) are appended to
``results/whole_book_rows.jsonl`` and skipped on a re-run. Several methods in one invocation take the
questions in turn (each question through every method before the next), so a busy machine slows them
alike and their times compare as ratios. ``peak_rss_mb`` is the process's peak so far (the model,
the tier pages read, the index): run one method per invocation for a clean peak.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.passages import PassageSelection
from homer_integrations.homer.reading.strategies import (
    AutoReplay,
    AutoRoot,
    PassageReplay,
    RecomputeReplay,
    Replay,
    WindowRoot,
)
from homer_integrations.homer.scoring.lexical import LexicalEvidence
from homer_integrations.paths import bundled_text
from homer_integrations.question_sets import question_set

sys.path.insert(0, str(Path(__file__).parent))
from candidate_merge import CandidateMerge
from passage_layout import layouts
from passage_reuse import ReusedPassages
from upper_read import UpperRead

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROWS = RESULTS / "whole_book_rows.jsonl"
FACTS = HERE / "book_facts.json"
METHODS = (
    "query_aware",
    "fused",
    "tokens",
    "hybrid",
    "shared",
    "window",
    "window_passages",
    "kept",
    "bm25",
    "sep",
    "rank",
    "rank_last",
    "qfirst",
    "merge",
    "query_aware_unstemmed",
    "bm25_unstemmed",
    "route_prompt",
    "instructed",
    "upper",
    "reuse15",
    "reuse0",
)
CHUNK_CHARS, CHUNK_OVERLAP = 800, 100  # HomerRouter's defaults


@dataclass(frozen=True)
class Item:
    """One question about the book as asked: its id, text, checker, kind, split and depth (0-1)."""

    id: str
    question: str
    check: Callable[[str], bool]
    kind: str
    split: str
    depth: float


def book_with_facts(book: str) -> tuple[str, list[Item]]:
    """The book with its invented facts inserted as paragraphs, and every question about it."""
    from homer_integrations.question_sets import KeywordQuestion

    text = bundled_text(book)
    facts = [f for f in json.loads(FACTS.read_text(encoding="utf-8")) if f["book"] == book]
    items: list[Item] = []
    # deepest first, so the offsets of the shallower insertions and of the questions still hold
    shift: list[tuple[int, int]] = []
    for fact in sorted(facts, key=lambda f: -f["depth"]):
        at = text.find("\n\n", int(fact["depth"] * len(text)))
        at = len(text) if at < 0 else at
        insert = "\n\n" + fact["sentence"]
        text = text[:at] + insert + text[at:]
        shift.append((at, len(insert)))
        q = KeywordQuestion(fact["id"], fact["question"], tuple(map(tuple, fact["keywords"])), at)
        items.append(Item(fact["id"], fact["question"], q.check, "fact_" + fact["kind"], fact["split"], fact["depth"]))
    original = len(bundled_text(book))
    for q in question_set(f"{book}_book").questions:
        items.append(Item(q.id, q.question, q.check, q.kind, q.split, q.offset / original))
    return text, sorted(items, key=lambda i: i.depth)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def done_keys(rows: Path = ROWS) -> set[tuple]:
    if not rows.is_file():
        return set()
    keys = set()
    for line in rows.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        keys.add((r["model"], r["book"], r["dtype"], r["method"], r["budget"], r["id"]))
    return keys


class Bm25Route:
    """The retrieval route at a token budget: the chunks ``HomerRouter`` makes, as many as fill it."""

    def __init__(self, engine: HomerModel, text: str, budget: int, stemmer: str | None = "english") -> None:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        from homer_integrations.homer.scoring.lexical import BM25Index

        splitter = RecursiveCharacterTextSplitter(chunk_size=CHUNK_CHARS, chunk_overlap=CHUNK_OVERLAP)
        chunks = splitter.split_text(text)
        self.index = BM25Index(chunks, stemmer=stemmer)
        sample = chunks[:: max(1, len(chunks) // 200)]
        per_chunk = statistics.mean(len(engine.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in sample)
        self.k = max(1, round(budget / per_chunk))
        self.engine = engine

    def prompt(self, question: str, instruction: str | None = None) -> str:
        """The route's prompt: the ``k`` chunks BM25 ranks best for ``question`` (``retrieval_prompt``)."""
        from homer_integrations.routing import retrieval_prompt

        return retrieval_prompt(question, [p.text for p in self.index.search(question, self.k)], instruction)

    def answer(self, question: str, max_new_tokens: int, instruction: str | None = None) -> tuple[str, float]:
        started = time.perf_counter()
        return read_prompt(self.engine, self.prompt(question, instruction), max_new_tokens, started)


AFTER_ROOT = "Passages of the document that may help:\n\n{passages}\n\nQuestion: {question}"


def after_root(engine: HomerModel, text: str, route: Bm25Route | None, question: str, max_new_tokens: int):
    """The engine's kept shared root of ``text`` (built once), then, as this question's own read, the
    passages ``route`` ranks best for ``question`` and the question (``AFTER_ROOT``): a kept root followed by a
    short per-question read (issue 79, item 1). Returns the answer's stream."""
    assert route is not None
    root = engine.compress(text, mode="shared")
    passages = "\n\n".join(p.text for p in route.index.search(question, route.k))
    return engine.run(root, AFTER_ROOT.format(passages=passages, question=question), max_new_tokens=max_new_tokens)


KEPT_PASSAGES = "Passages of the document that may help:\n\n{passages}\n\n(End of the passages.)\n\n{question}"


def after_root_passages(
    engine: HomerModel, text: str, question: str, max_new_tokens: int, tokens: int = 512, mode: str = "shared"
):
    """The ablation ``kept``: the engine's kept shared root of ``text`` (``mode="full"``: its whole kept
    prefill), then the ``tokens`` of the default's own passages (``PassageSelection``) BM25 ranks best for
    ``question``, in the document's order, and the question (``KEPT_PASSAGES``). Returns the answer's stream."""
    root = engine.compress(text, mode=mode)
    passages = "\n\n".join(passage_runs(engine, text, question, tokens))
    return engine.run(root, KEPT_PASSAGES.format(passages=passages, question=question), max_new_tokens=max_new_tokens)


_PASSAGES: dict[str, Any] = {}


def passage_tokens(engine: HomerModel, text: str, question: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``text``'s token ids [N] and the indices [M] (ascending) of the tokens of its passages
    (``PassageSelection()``) BM25 ranks best for ``question``, at most ``tokens`` of them."""
    from homer_integrations.homer.document.prompt import encode_offsets, units_at

    selection = PassageSelection()
    if text not in _PASSAGES:  # the book's ids and passages, from one tokenizer call, once
        ids, offsets = encode_offsets(engine.tokenizer, text)
        _PASSAGES[text] = ids, selection.passages(engine.tokenizer, ids, units_at(text, offsets, "statement"))
    ids, passages = _PASSAGES[text]
    return ids, torch.cat(selection.taken(question, None, passages, tokens)).sort().values


def passage_runs(engine: HomerModel, text: str, question: str, tokens: int) -> list[str]:
    """The texts of the runs of ``text``'s passages (``PassageSelection()``) BM25 ranks best for ``question``,
    at most ``tokens`` tokens, in the document's order."""
    ids, kept = passage_tokens(engine, text, question, tokens)
    runs = torch.tensor_split(kept, (torch.diff(kept) != 1).nonzero().flatten() + 1)
    return [engine.tokenizer.decode(ids[run].tolist()).strip() for run in runs]


def read_prompt(
    engine: HomerModel, prompt: str, max_new_tokens: int, started: float | None = None
) -> tuple[str, float]:
    """``prompt`` as one user message, read whole however long (never taken for a document to compress):
    the answer and the seconds from ``started`` (default: now) to its first piece."""
    from langchain_core.messages import HumanMessage

    from homer_integrations.langchain import ChatHomer

    started = time.perf_counter() if started is None else started
    chat = ChatHomer(engine=engine, max_tokens=max_new_tokens, long_prompt_tokens=1 << 30)
    first = None
    pieces = []
    for chunk in chat.stream([HumanMessage(prompt)]):
        first = first if first is not None else time.perf_counter() - started
        pieces.append(chunk.text)
    return "".join(pieces), first if first is not None else time.perf_counter() - started


def replays(read_tokens: int, unit: str = "token", candidates: int = 8192) -> dict[str, Replay]:
    """The replay each per-question method asks of the engine; ``read_tokens``: the passages' fixed
    budget (0: the package's ``ReadBudget``, which grows with the machine); ``unit``: the question
    scoring's unit; ``candidates``: the BM25 tokens ``merge`` narrows down."""
    budget = ReadBudget(tokens=read_tokens or None)
    return {
        "query_aware": AutoReplay(PassageReplay(budget=budget)),
        "fused": AutoReplay(PassageReplay(PassageSelection(attention=1.0), budget)),
        "tokens": RecomputeReplay(),
        "hybrid": RecomputeReplay(),
        "merge": CandidateMerge(candidates, unit, PassageReplay(budget=budget)),
        "query_aware_unstemmed": AutoReplay(PassageReplay(PassageSelection(stemmer=None), budget)),
        "upper": AutoReplay(UpperRead(budget=budget)),
        "reuse15": AutoReplay(ReusedPassages(budget=budget, ratio=0.15)),
        "reuse0": AutoReplay(ReusedPassages(budget=budget, ratio=0.0)),
        **layouts(budget),
    }


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    config = HomerConfig(final_cache_len=args.budget) if args.budget else None
    engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, config=config, store=args.store or True)
    budget = args.read_tokens or engine.config.final_cache_len or engine.config.max_chunk_len
    by_method = replays(args.read_tokens, engine.tiers.question_scoring.unit, args.candidates)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    text, items = book_with_facts(args.book)
    items = [i for i in items if args.split == "all" or i.split == args.split]
    if args.limit:
        count = min(args.limit, len(items))
        items = [items[round(j * (len(items) - 1) / max(count - 1, 1))] for j in range(count)]
    items = items[:: args.stride]
    if args.ids:
        wanted = set(args.ids)
        items = [i for i in items if i.id in wanted]
    done = done_keys(args.rows)
    book_tokens = len(engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    print(f"{args.book}: {len(text):,} characters, {book_tokens:,} tokens; {len(items)} questions", file=sys.stderr)
    routes = {
        method: Bm25Route(engine, text, budget, stemmer="english" if method == "bm25" else None)
        for method in ("bm25", "bm25_unstemmed")
        if method in args.methods
    }
    hybrid = Bm25Route(engine, text, args.passage_tokens) if "window_passages" in args.methods else None
    # question by question, every method in turn: a busy machine slows the methods alike
    for item in items:
        for method in args.methods:
            if (args.model, args.book, dtype, method, budget, item.id) in done:
                continue
            route = routes.get(method)
            started = time.perf_counter()
            if route is not None:
                answer, ttft = route.answer(item.question, args.max_new_tokens)
                info = None
            else:
                lexical = LexicalEvidence() if method == "hybrid" else None
                engine.tiers.question_scoring = replace(engine.tiers.question_scoring, lexical=lexical)
                replay = by_method.get(method, AutoReplay())
                kept = method in ("window", "window_passages", "kept")
                root = WindowRoot(args.window_tokens) if kept else AutoRoot()
                engine.tiers.recipe = replace(engine.tiers.recipe, replay=replay, shared_root=root)
                if method in ("window_passages", "kept"):
                    stream = (
                        after_root_passages(engine, text, item.question, args.max_new_tokens)
                        if method == "kept"
                        else after_root(engine, text, hybrid, item.question, args.max_new_tokens)
                    )
                    pieces = [next(stream, "")]
                    ttft = time.perf_counter() - started  # the root's lookup included
                    answer = "".join([*pieces, *stream])
                else:
                    mode = "query_aware" if method in by_method else "shared" if kept else method
                    stream = engine.run(text, item.question, mode=mode, max_new_tokens=args.max_new_tokens)
                    answer = stream.text()
                    ttft = stream.info.time_to_first_token
                info = stream.info
            row = {
                "model": args.model,
                "book": args.book,
                "dtype": dtype,
                "method": method,
                "budget": budget,
                "id": item.id,
                "kind": item.kind,
                "split": item.split,
                "depth": round(item.depth, 4),
                "question": item.question,
                "answer": answer,
                "correct": bool(item.check(answer)),
                "ttft_seconds": round(ttft or 0.0, 2),
                "seconds": round(time.perf_counter() - started, 2),
                "document_seconds": round(info.document_seconds, 1) if info else 0.0,
                "cache_source": info.cache_source if info else None,
                "book_tokens": book_tokens,
                "k": route.k if route else None,
                "peak_rss_mb": round(peak_rss_mb()),
            }
            with args.rows.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            mark = "ok " if row["correct"] else "-- "
            print(f"{mark}{method} {item.id} ttft {row['ttft_seconds']}s: {answer.strip()[:80]!r}", file=sys.stderr)


def load_rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()] if ROWS.is_file() else []


def shared_questions(asked: dict[str, set[str]], method: str, default: str = "query_aware") -> set[str]:
    """The questions ``method``'s summary counts, of those each method ``asked``: the ones it shares with
    the ``default``, and the default's ones any other method also answered (every method's, where the
    default asked none), so an ablation run on a few questions does not shrink the others' counts."""
    if default not in asked:
        return set.intersection(*asked.values())
    if method != default:
        return asked[method] & asked[default]
    others = [ids for name, ids in asked.items() if name != default]
    return asked[default] & set.union(*others) if others else asked[default]


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, book, dtype, budget, method, split), over the questions it shares with the default
    (``shared_questions``: each row says how many; ``paired`` compares two methods exactly): accuracy
    over story questions and over facts, build seconds (the first question's document time), median
    seconds to the first token after it."""
    asked: dict[tuple, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        asked[(r["model"], r["book"], r["dtype"], r["budget"], r["split"])][r["method"]].add(r["id"])
    common = {(*key, method): shared_questions(methods, method) for key, methods in asked.items() for method in methods}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    builds: dict[tuple, float] = defaultdict(float)
    for r in rows:
        key = (r["model"], r["book"], r["dtype"], r["budget"], r["method"], r["split"])
        builds[key] = max(builds[key], r["document_seconds"])
        if r["id"] in common[(r["model"], r["book"], r["dtype"], r["budget"], r["split"], r["method"])]:
            groups[key].append(r)
    out = []
    for (model, book, dtype, budget, method, split), rs in sorted(groups.items()):
        story = [r for r in rs if not r["kind"].startswith("fact")]
        facts = [r for r in rs if r["kind"].startswith("fact")]
        later = [r["ttft_seconds"] for r in rs if r["document_seconds"] == 0]
        out.append(
            {
                "model": model,
                "book": book,
                "dtype": dtype,
                "budget": budget,
                "method": method,
                "split": split,
                "story": [sum(r["correct"] for r in story), len(story)],
                "facts": [sum(r["correct"] for r in facts), len(facts)],
                "build_seconds": builds[(model, book, dtype, budget, method, split)],
                "median_ttft_seconds": round(statistics.median(later), 1) if later else None,
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            }
        )
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| book | model | dtype | budget | method | split | story questions | inserted facts | tier build s "
        "| later question, first token s (median) | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        story = f"{s['story'][0]}/{s['story'][1]}" if s["story"][1] else "-"
        facts = f"{s['facts'][0]}/{s['facts'][1]}" if s["facts"][1] else "-"
        lines.append(
            f"| {s['book']} | {s['model']} | {s['dtype']} | {s['budget']} | {s['method']} | {s['split']} | {story} "
            f"| {facts} | {s['build_seconds']:.0f} | {s['median_ttft_seconds']} | {s['peak_rss_mb']:,} |"
        )
    return "\n".join(lines) + "\n"


def story_or_facts(row: dict) -> str:
    return "facts" if row["kind"].startswith("fact") else "story"


def paired(
    rows: list[dict], method: str, reference: str, kind_of: Callable[[dict], str] = story_or_facts, draws: int = 2000
) -> list[dict]:
    """``method`` against ``reference`` on the questions both answered (the same model, book, dtype,
    budget and question), per ``kind_of`` (story questions, inserted facts) and over all: right counts, the mean
    difference per question and its 90% interval from a bootstrap over the pairs."""
    import random

    answers: dict[tuple, dict[str, bool]] = defaultdict(dict)
    for r in rows:
        if r["method"] in (method, reference):
            key = (kind_of(r), r["model"], r.get("book"), r["dtype"], r["budget"], r["id"])
            answers[key][r["method"]] = r["correct"]
    kinds = sorted({key[0] for key in answers}, key=lambda k: (k == "facts", k))
    out = []
    for kind in kinds + (["all"] if len(kinds) > 1 else []):
        pairs = [
            (int(a[method]), int(a[reference]))
            for key, a in sorted(answers.items())
            if len(a) == 2 and kind in ("all", key[0])
        ]
        if not pairs:
            continue
        rng = random.Random(0)
        gaps = sorted(sum(x - y for x, y in rng.choices(pairs, k=len(pairs))) / len(pairs) for _ in range(draws))
        out.append(
            {
                "method": method,
                "reference": reference,
                "kind": kind,
                "pairs": len(pairs),
                "right": sum(x for x, _ in pairs),
                "reference_right": sum(y for _, y in pairs),
                "difference": sum(x - y for x, y in pairs) / len(pairs),
                "interval_90": [gaps[int(0.05 * draws)], gaps[int(0.95 * draws) - 1]],
            }
        )
    return out


def paired_markdown(comparisons: list[dict]) -> str:
    lines = [
        "| method | reference | questions | pairs | method right | reference right | difference | 90% interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        low, high = c["interval_90"]
        lines.append(
            f"| {c['method']} | {c['reference']} | {c['kind']} | {c['pairs']} | {c['right']} | {c['reference_right']} "
            f"| {c['difference']:+.2f} | [{low:+.2f}, {high:+.2f}] |"
        )
    return "\n".join(lines) + "\n"


def paired_parser(sub: Any, methods: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``paired`` command's parser (its rows picked by ``paired_rows``), for this benchmark and corpus_qa's."""
    pair = sub.add_parser("paired", help="one method against another on the questions both answered")
    pair.add_argument("method", choices=methods)
    pair.add_argument("reference", choices=methods)
    pair.add_argument("--split", default="heldout", choices=("tuning", "heldout", "all"))
    pair.add_argument("--read-tokens", type=int, default=2048)
    pair.add_argument("--dtype", default="bfloat16", help="or 'any'")
    return pair


def paired_rows(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """The ``rows`` of ``args``' split, budget, dtype and (where the parser has ``--book``) book."""
    book = getattr(args, "book", "both")
    return [
        r
        for r in rows
        if args.split in ("all", r["split"])
        and r["budget"] == args.read_tokens
        and args.dtype in ("any", r["dtype"])
        and book in ("both", r.get("book"))
    ]


def paired_command(args: argparse.Namespace) -> None:
    print(paired_markdown(paired(paired_rows(load_rows(), args), args.method, args.reference)), end="")


# (method, against), held out on the questions both answered: the default against the route and the shared
# root; the fused ranking against the default as it was when fused ran (BM25 over words as written)
HEADLINE = (
    ("query_aware", "bm25"),
    ("query_aware", "shared"),
    ("query_aware", "window"),
    ("query_aware", "window_passages"),
    ("query_aware", "kept"),
    ("query_aware_unstemmed", "fused"),
)
CURVE = ("query_aware", "bm25")  # the default and the route at every read budget both ran


def held_out(rows: list[dict], budget: int = 2048) -> list[dict]:
    """The held-out rows in bfloat16 at ``budget`` tokens read: the questions the headline counts."""
    return [r for r in rows if r["split"] == "heldout" and r["budget"] == budget and r["dtype"] == "bfloat16"]


def headline(rows: list[dict]) -> list[dict]:
    """The pairs of ``HEADLINE`` on held-out questions (``paired``: story, facts, all)."""
    return [c for method, against in HEADLINE for c in paired(held_out(rows), method, against)]


def by_kind(rows: list[dict]) -> list[dict]:
    """The default against the route, held out, per kind of question (who ... why, each kind of fact)."""
    return paired(held_out(rows), "query_aware", "bm25", kind_of=lambda r: r["kind"])


def budget_curve(rows: list[dict], split: str = "tuning", book: str = "northangerabbey") -> list[dict]:
    """Per read budget and method of ``CURVE``, over the questions every (budget, method) of the curve
    answered: right/asked and the median seconds to the first token (the budgets where both methods ran)."""
    asked: dict[tuple[int, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["split"] == split and r.get("book") == book and r["dtype"] == "bfloat16" and r["method"] in CURVE:
            asked[(r["budget"], r["method"])][r["id"]] = r
    budgets = sorted(b for b in {b for b, _ in asked} if all((b, m) in asked for m in CURVE))
    common = set.intersection(*(set(asked[(b, m)]) for b in budgets for m in CURVE)) if budgets else set()
    if not common:
        return []
    return [
        {
            "budget": b,
            "method": m,
            "right": sum(asked[(b, m)][q]["correct"] for q in common),
            "asked": len(common),
            "median_ttft_seconds": round(statistics.median(asked[(b, m)][q]["ttft_seconds"] for q in common), 1),
        }
        for b in budgets
        for m in CURVE
    ]


def curve_markdown(curve: list[dict]) -> str:
    lines = ["| tokens read | method | right / asked | first token s (median) |", "|---|---|---|---|"]
    lines += [
        f"| {c['budget']:,} | {c['method']} | {c['right']}/{c['asked']} | {c['median_ttft_seconds']} |" for c in curve
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], curve: list[dict], path: Path) -> None:
    """Left: held-out accuracy by depth of the evidence, default, route and shared root on the questions
    each shares with the default. Right: the budget curve, accuracy (solid) and first-token seconds (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (depth_ax, budget_ax) = plt.subplots(1, 2, figsize=(11, 4))
    held = held_out(rows)
    default_ids = {(r["book"], r["id"]) for r in held if r["method"] == "query_aware"}
    for method in ("query_aware", "bm25", "shared", "window"):
        bins: dict[int, list[bool]] = defaultdict(list)
        for r in held:
            if r["method"] == method and (r["book"], r["id"]) in default_ids:
                bins[min(int(r["depth"] * 5), 4)].append(r["correct"])
        xs = sorted(bins)
        if xs:
            asked = sum(len(b) for b in bins.values())
            depth_ax.plot(
                [0.1 + 0.2 * x for x in xs],
                [sum(bins[x]) / len(bins[x]) for x in xs],
                marker="o",
                label=f"{method} ({asked} questions)",
            )
    depth_ax.set(xlabel="depth of the evidence in the book", ylabel="answers right", ylim=(0, 1.05))
    depth_ax.set_title("Held out, both books, 2,048 tokens read")
    depth_ax.legend(fontsize=8)
    seconds_ax = budget_ax.twinx()
    for method in CURVE:
        points = [c for c in curve if c["method"] == method]
        if not points:
            continue
        xs = [c["budget"] for c in points]
        (line,) = budget_ax.plot(xs, [c["right"] / c["asked"] for c in points], marker="o", label=method)
        seconds_ax.plot(xs, [c["median_ttft_seconds"] for c in points], ls="--", marker="x", color=line.get_color())
    budget_ax.set(xscale="log", xlabel="tokens read per question", ylabel="answers right (solid)", ylim=(0, 1.05))
    budgets = sorted({c["budget"] for c in curve})
    budget_ax.set_xticks(budgets, [f"{b:,}" for b in budgets], minor=False)
    budget_ax.minorticks_off()
    seconds_ax.set_ylabel("first token, median s (dashed)")
    asked = curve[0]["asked"] if curve else 0
    budget_ax.set_title(f"Budget, Northanger Abbey tuning split ({asked} questions)")
    budget_ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(_: argparse.Namespace) -> None:
    rows = load_rows()
    summary, top, kinds, curve = summarize(rows), headline(rows), by_kind(rows), budget_curve(rows)
    (RESULTS / "whole_book.json").write_text(
        json.dumps({"headline": top, "by_kind": kinds, "budget_curve": curve, "summary": summary}, indent=1),
        encoding="utf-8",
    )
    table = markdown(summary)
    (RESULTS / "whole_book.md").write_text(
        "# Whole books\n\nGenerated by `benchmarks/whole_book.py report` from `whole_book_rows.jsonl` "
        f"({len(rows)} answers), with `whole_book.png`.\n\n"
        "## Held out: the default against the route, the shared root and the fused ranking\n\n"
        "Both books, 2,048 tokens read, bfloat16; each pair on the questions both methods answered "
        "(difference: the method's accuracy minus the reference's, 90% bootstrap interval). `fused` ran "
        "before BM25 stemmed its words: it is paired with the default as it was then.\n\n"
        + paired_markdown(top)
        + "\n## Held out, by kind of question: the default against the route\n\n"
        + paired_markdown(kinds)
        + "\n## The read budget (tuning split, *Northanger Abbey*)\n\n"
        "The default and the route on the same questions at every budget both ran.\n\n"
        + curve_markdown(curve)
        + "\n## Every run\n\nStory questions and inserted facts as right/asked; each method over the "
        "questions it shares with the default (`query_aware`), so counts differ between rows: "
        "`whole_book.py paired A B` compares two methods on exactly the same questions.\n\n" + table,
        encoding="utf-8",
    )
    if rows:
        plot(rows, curve, RESULTS / "whole_book.png")
    print(paired_markdown(top) + "\n" + curve_markdown(curve))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--book", default="northangerabbey", choices=("northangerabbey", "prideprejudice"))
    r.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--methods", nargs="+", default=["query_aware"], choices=METHODS)
    r.add_argument("--split", default="tuning", choices=("tuning", "heldout", "all"))
    r.add_argument("--limit", type=int, default=0, help="at most this many questions, spread over the book")
    r.add_argument("--stride", type=int, default=1, help="then every n-th of those (still spread over the book)")
    r.add_argument("--ids", nargs="+", default=[], help="then only these question ids (e.g. to pair dtypes)")
    r.add_argument("--budget", type=int, default=0, help="kept tokens (final_cache_len); 0: the model's default")
    r.add_argument(
        "--read-tokens", type=int, default=0, help="past the window: passages' and BM25's kept tokens (0: ReadBudget)"
    )
    r.add_argument("--candidates", type=int, default=8192, help="merge: BM25 tokens narrowed to the budget")
    r.add_argument("--window-tokens", type=int, default=16384, help="window: the kept root's tokens (WindowRoot)")
    r.add_argument("--passage-tokens", type=int, default=512, help="window_passages: BM25 tokens read after the root")
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--store", default="", help="document store (default: the package's cache directory)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rows", type=Path, default=ROWS, help="rows file (another: a timing run apart)")
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    pair = paired_parser(sub)
    pair.add_argument("--book", default="both", choices=("both", "northangerabbey", "prideprejudice"))
    pair.set_defaults(func=paired_command)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
