"""An edited book's leaf tier (issue 64, item 2): how many leaves a one-paragraph edit recomputes, and how long.

The target: a one-paragraph edit in the middle of a 100k-token book recomputes at most 3 leaves and
takes at most 10% of the full tier build; answers about unchanged parts stay identical to a
from-scratch build.

One engine with ``split="content"`` and a store builds the book's leaf tier (T1), then, for each of
``--edits`` paragraphs spread over the book (depths 1/(N+1) .. N/(N+1): 0.25, 0.5, 0.75 for 3), the
tier of the book with one sentence appended to that paragraph (T2): its leaves are copied from the
tier already held wherever their content key is found (``homer.leaves.leaf_reuse``), the rest computed
(counted from the builder's log). ``--verify N`` builds the first N edited versions again from scratch
in a fresh engine without a store and compares the tiers (largest absolute difference of every
tensor), and the kept tokens and answer of one question about the book's opening, which no edit
touches (``RecomputeReplay``, so the question reads the tier). Beside it the even split's T1, leaves,
fill (document tokens / (leaves x tokens a leaf holds)) and height for the same book.

    .venv/bin/python benchmarks/leaf_edits.py --verify 1                    # SmolLM2, Northanger Abbey
    .venv/bin/python benchmarks/leaf_edits.py --model qwen2.5-coder-1.5b-instruct --dtype bfloat16

Writes benchmarks/results/leaf_edits.json (rows of this model, book and dtype replaced) and leaf_edits.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.homer.leaves.leaf_tier import LeafTier
from homer_integrations.homer.leaves.tier_file import whole_tensors
from homer_integrations.homer.reading.strategies import Recipe, RecomputeReplay

RESULTS = Path(__file__).parent / "results"
QUESTION = "What was the name of Catherine Morland's father?"
"""About the first page of Northanger Abbey, which no edit at depth 0.25 or later touches."""
SENTENCES = (
    "She said nothing more, and the matter rested there a while.",
    "Nobody in the room thought it worth remarking upon at the time.",
    "It was, however, a point that would be remembered long afterwards.",
)

Engine = Callable[[str, Path | None], HomerModel]
"""An engine for a split (``even``/``content``) over a store directory (None: memory only)."""


@dataclass(frozen=True)
class Edit:
    """``text`` is the book with one sentence appended to the paragraph ending at character ``at``,
    asked for at relative ``depth``."""

    depth: float
    at: int
    text: str


def paragraph_edits(book: str, count: int, min_chars: int = 200) -> list[Edit]:
    """``count`` edits of ``book``, one paragraph each (the first of at least ``min_chars`` characters
    after depth i/(count+1)), a sentence appended to it."""
    edits = []
    for i in range(count):
        depth = (i + 1) / (count + 1)
        start = book.find("\n\n", int(depth * len(book)))
        while start >= 0:
            end = book.find("\n\n", start + 2)
            if end < 0 or end - start - 2 >= min_chars:
                break
            start = end
        if start < 0 or end < 0:
            raise ValueError(f"no paragraph of {min_chars} characters after depth {depth:.2f}")
        sentence = SENTENCES[i % len(SENTENCES)]
        edits.append(Edit(depth, end, book[:end] + " " + sentence + book[end:]))
    return edits


class LeafLog(logging.Handler):
    """The builder's ``leaf tier of ...`` log lines: (leaves, copied) of every tier built since."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.built: list[tuple[int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("leaf tier of") and isinstance(record.args, tuple):
            self.built.append((int(record.args[1]), int(record.args[2])))

    def __enter__(self) -> LeafLog:
        logger = logging.getLogger("homer_integrations.engine.builder")
        self._level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        logger = logging.getLogger("homer_integrations.engine.builder")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def build(engine: HomerModel, text: str, log: LeafLog) -> tuple[LeafTier, dict]:
    """``text``'s leaf tier in ``engine`` (looked up or built) and a row: wall seconds, leaves, copied."""
    prefix = engine.prompting.layout("", "query_aware").prefix
    before = len(log.built)
    store = engine.document_cache.store
    disk_before = store.disk_bytes() if store is not None else 0
    started = time.perf_counter()
    tier, source = engine.tiers.leaf_tier(prefix, text)
    seconds = time.perf_counter() - started
    written = (store.disk_bytes() - disk_before) if store is not None else 0
    leaves, copied = log.built[-1] if len(log.built) > before else (tier.plan.num_leaves, tier.plan.num_leaves)
    plan = tier.plan
    return tier, {
        "source": source,
        "seconds": round(seconds, 2),
        "build_seconds": round(tier.seconds, 2),
        "leaves": leaves,
        "copied": copied,
        "computed": leaves - copied,
        "stored_mb": round(written / 1e6, 1),
        "height": plan.height,
        "fill": round(plan.document_len / (plan.num_leaves * plan.effective_len), 3),
        "document_tokens": plan.document_len,
    }


def max_difference(a: LeafTier, b: LeafTier) -> float:
    """Largest absolute difference between the tensors of two tiers of one plan (inf for different plans)."""
    if a.plan != b.plan:
        return float("inf")
    x, y = whole_tensors(a)[0], whole_tensors(b)[0]
    return max(float((x[name].float() - y[name].float()).abs().max()) for name in x if x[name].is_floating_point())


def asked(engine: HomerModel, text: str, question: str, max_new_tokens: int) -> tuple[torch.Tensor, str]:
    """The kept document tokens (origins) and the answer of ``question`` about ``text``."""
    compressed = engine.compress(text, question=question, mode="query_aware")
    return compressed.origin, engine.answer(compressed, question, max_new_tokens=max_new_tokens)


def measure(
    make: Engine,
    book: str,
    store: Path,
    *,
    edits: int = 3,
    verify: int = 0,
    question: str = QUESTION,
    max_new_tokens: int = 16,
    even: bool = True,
) -> list[dict]:
    """Rows: the content split's v1 build, each edit's build (``ratio``: its seconds / v1's), the even
    split's v1 build (``even``); ``verify`` edits also rebuilt from scratch and compared (``verify`` fields)."""
    rows = []
    with LeafLog() as log:
        engine = make("content", store / "content")
        v1, row = build(engine, book, log)
        rows.append({"split": "content", "version": "v1", "depth": None, **row})
        print(rows[-1], file=sys.stderr, flush=True)
        for i, edit in enumerate(paragraph_edits(book, edits)):
            tier, row = build(engine, edit.text, log)
            row = {"split": "content", "version": f"edit {i + 1}", "depth": edit.depth, **row}
            row["ratio"] = round(row["seconds"] / rows[0]["seconds"], 4)
            if i < verify:
                fresh = make("content", None)
                scratch, scratch_row = build(fresh, edit.text, log)
                kept, answer = asked(engine, edit.text, question, max_new_tokens)
                kept_scratch, answer_scratch = asked(fresh, edit.text, question, max_new_tokens)
                row["verify"] = {
                    "scratch_seconds": scratch_row["seconds"],
                    "scratch_leaves": scratch_row["leaves"],
                    "same_plan": tier.plan == scratch.plan,
                    "max_abs_diff": max_difference(tier, scratch),
                    "question": question,
                    "same_kept_tokens": bool(torch.equal(kept, kept_scratch)),
                    "kept_tokens": int((kept >= 0).sum()),
                    "same_answer": answer == answer_scratch,
                    "answer": answer.strip(),
                }
                del fresh, scratch
            del tier
            rows.append(row)
            print(rows[-1], file=sys.stderr, flush=True)
        del engine, v1
        if even:
            _, row = build(make("even", store / "even"), book, log)
            rows.append({"split": "even", "version": "v1", "depth": None, **row})
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def markdown(result: dict) -> str:
    excerpt = f" (its first {result['characters']:,} characters)" if result.get("characters") else ""
    lines = [
        f"Leaf tier of {result['book']}{excerpt} ({result['book_tokens']:,} tokens), "
        f"{result['model']}, {result['dtype']}, "
        f"{result['threads']} threads; an edit appends one sentence to one paragraph at the depth given, "
        "its tier takes the leaves the content split finds unchanged from the store.",
        "",
        "| split | version | depth | seconds | / v1 | leaves | computed | copied | stored MB | height | fill |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        depth = "" if r["depth"] is None else f"{r['depth']:.2f}"
        ratio = f"{r['ratio']:.1%}" if "ratio" in r else ""
        lines.append(
            f"| {r['split']} | {r['version']} | {depth} | {r['seconds']} | {ratio} | {r['leaves']} | "
            f"{r['computed']} | {r['copied']} | {r.get('stored_mb', '')} | {r['height']} | {r['fill']} |"
        )
    for r in result["rows"]:
        v = r.get("verify")
        if v:
            lines += [
                "",
                f"Verified {r['version']} against a from-scratch build in a fresh engine without a store "
                f"({v['scratch_seconds']} s, {v['scratch_leaves']} leaves): same plan {v['same_plan']}, largest "
                f"absolute difference of the tier's tensors {v['max_abs_diff']:.3g}; {v['question']!r}: same "
                f"{v['kept_tokens']:,} kept tokens {v['same_kept_tokens']}, same answer {v['same_answer']} "
                f"({v['answer'][:80]!r}).",
            ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--book", default="northangerabbey")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--store", type=Path, help="where the tiers are stored (default: a temporary directory)")
    parser.add_argument("--chars", type=int, default=0, help="the book's first N characters (0: whole)")
    parser.add_argument("--no-even", action="store_true", help="skip the even split's build for comparison")
    parser.add_argument("--edits", type=int, default=3)
    parser.add_argument("--verify", type=int, nargs="?", const=1, default=0, help="edits rebuilt from scratch")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    from homer_integrations.engine.loading import load_model
    from homer_integrations.paths import bundled_text

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    book = bundled_text(args.book)
    book = book[: args.chars] if args.chars else book
    recipe = Recipe(replay=RecomputeReplay())  # a question past the window then reads the tier too

    def make(split: str, store: Path | None) -> HomerModel:
        cache = DocumentCache(store, memory_budget_bytes=1 << 40)
        config = HomerConfig(mode="query_aware", split=split)
        return HomerModel(
            model, tokenizer, config, model_name=args.model, progress=False, document_cache=cache, recipe=recipe
        )

    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp)
        rows = measure(
            make,
            book,
            store,
            edits=args.edits,
            verify=args.verify,
            max_new_tokens=args.max_new_tokens,
            even=not args.no_even,
        )
    result = {
        "model": args.model,
        "book": args.book,
        "characters": args.chars or None,
        "dtype": str(model.dtype).removeprefix("torch."),
        "threads": args.threads,
        "book_tokens": rows[0]["document_tokens"],
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "leaf_edits.json"
    kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    fields = ("model", "book", "characters", "dtype")
    same = lambda r: all(r.get(f) == result[f] for f in fields)  # noqa: E731
    results = [r for r in kept if not same(r)] + [result]
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (RESULTS / "leaf_edits.md").write_text("\n".join(markdown(r) for r in results), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
