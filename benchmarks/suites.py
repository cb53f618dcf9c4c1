"""The benchmark suites behind ``python -m benchmarks``: each one names existing scripts, run in order.

Every script writes its own results under ``benchmarks/results/`` (JSON, markdown, plots) and most
append rows that a later run skips, so a suite resumes where it stopped. Times are for a 2-core CPU
with nothing measured yet; committed rows make a rerun much shorter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The environment every result in benchmarks/results/ was measured under (Makefile's BENCH_ENV,
# run_all.sh): spinning OpenMP workers fight each other on a busy 2-core machine.
BENCH_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class Step:
    """One script call: ``script`` (a path from the repository root) with ``args``.

    ``extra``: whether the arguments given after ``--`` are appended (not to ``report`` steps,
    which only rebuild tables from the rows).
    """

    script: str
    args: tuple[str, ...] = ()
    extra: bool = True

    @property
    def name(self) -> str:
        """The script's stem, as ``--only`` names it."""
        return self.script.rsplit("/", 1)[-1].removesuffix(".py")

    def argv(self, extra: Sequence[str] = ()) -> list[str]:
        """The script and its arguments, ``extra`` appended where this step takes them."""
        return [self.script, *self.args, *(extra if self.extra else ())]


@dataclass(frozen=True)
class Suite:
    """A named group of steps: what it measures and roughly how long it takes on 2 CPU cores."""

    name: str
    measures: str
    cpu_time: str
    steps: tuple[Step, ...]


def _report(script: str) -> Step:
    return Step(script, ("report",), extra=False)


NOVEL_QA = "benchmarks/novel_qa.py"
RULER = "benchmarks/ruler.py"
WHOLE_BOOK = "benchmarks/whole_book.py"
CORPUS_QA = "benchmarks/corpus_qa.py"
WHOLE_DOCUMENT = "benchmarks/whole_document.py"
CORPUS_METHODS = ("corpus", "bm25", "per_document")
BUDGET = ("--read-tokens", "2048")  # every method reads the same tokens, whatever the machine
KEPT_QUESTIONS = ("--book", "northangerabbey", "--split", "heldout", "--limit", "36", "--stride", "2")
CURVE_QUESTIONS = ("--book", "northangerabbey", "--split", "tuning", "--limit", "16")
RULER_GRID = ("--lengths", "4096", "8192", "--ratios", "4", "8", "--samples", "10")

SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "quick",
            "SmolLM2's shared root: a cached question against a plain prefill (2k tokens); the novel's questions (8k)",
            "~5 min",
            (
                Step("benchmarks/cache_latency.py", ("--quick",)),
                Step(NOVEL_QA, ("run", "--models", "smollm2-135m-instruct", "--tokens", "8000", "--methods", "shared")),
                _report(NOVEL_QA),
            ),
        ),
        Suite(
            "quality",
            "answers: the novel's questions per model and mode; RULER's six tasks, HOMER against plain prefill",
            "1-2 days (RULER's grid)",
            (
                Step(NOVEL_QA, ("run",)),
                _report(NOVEL_QA),
                Step(RULER, ("run", *RULER_GRID, "--methods", "plain", "homer_shared", "homer_query_aware")),
                _report(RULER),
            ),
        ),
        Suite(
            "speed",
            "a cached question's latency (16k), decoding vs generate(), decoding over a kept cache (2k-32k), each "
            "stage's FLOP/s, a question's host cost",
            "~55 min",
            (
                Step("benchmarks/cache_latency.py", ("--tokens", "16000")),
                Step("benchmarks/decode_speed.py"),
                Step("benchmarks/kept_decode.py"),
                Step("benchmarks/stage_flops.py", ("--tokens", "8000")),
                Step("benchmarks/question_overhead.py"),
            ),
        ),
        Suite(
            "memory",
            "peak RSS and seconds, HOMER against plain prefill (4k-64k); a tier's memory; where a peak comes from",
            "~40 min",
            (
                Step("benchmarks/memory_speed.py", ("--tokens", "4000", "8000", "16000", "32000")),
                Step("benchmarks/memory_speed.py", ("--tokens", "64000", "--methods", "homer")),
                Step("benchmarks/tier_memory.py", ("--tokens", "16000")),
                Step("benchmarks/peak_stages.py", ("--tokens", "8000")),
            ),
        ),
        Suite(
            "peers",
            "RULER against the kvpress presses (KVzip, SnapKV, ExpectedAttention, StreamingLLM, Knorm); "
            "kvpress gets its own venv under benchmarks/.work/ on first use (pip, needs the network)",
            "days",
            (Step(RULER, ("run", *RULER_GRID, "--share-prefill")), _report(RULER)),
        ),
        Suite(
            "kept-forms",
            "every way to keep a document within the window (the whole prefill with its passages echoed and "
            "without, the per-question path, shared roots of 2k-16k, a kept form then the question's passages "
            "read again) on 4k-32k-token excerpts "
            "of a novel, held out and tuning: "
            "one-time cost, a later question's first token, decoding against the bandwidth limit, disk, accuracy",
            "~1.5 h",
            (
                Step("benchmarks/kept_forms.py", ("run",)),
                Step(
                    "benchmarks/kept_forms.py",
                    ("run", "--split", "tuning", "--methods", "full", "full_plain", "full_passages"),
                ),
                _report("benchmarks/kept_forms.py"),
            ),
        ),
        Suite(
            "whole-book",
            "both novels whole with inserted facts, held out: the per-question path against BM25 retrieval; "
            "then both at 512-8k tokens read on Northanger Abbey's tuning split (the budget curve); the default's 512 "
            "tokens on every held-out question; a kept 16k-token root, alone and followed by the question's "
            "passages, on Northanger Abbey held out",
            "~3 h",
            (
                *(
                    Step(WHOLE_BOOK, ("run", "--book", book, "--methods", "query_aware", "bm25", *split, *BUDGET))
                    for book, split in (
                        ("northangerabbey", ("--split", "heldout", "--limit", "36", "--stride", "2")),
                        ("prideprejudice", ("--split", "heldout", "--limit", "24", "--stride", "2")),
                    )
                ),
                *(
                    Step(WHOLE_BOOK, ("run", "--methods", "query_aware", "bm25", *CURVE_QUESTIONS, "--read-tokens", n))
                    for n in ("512", "1024", "2048", "4096", "8192")
                ),
                *(  # the default's budget on 2 cores: every held-out question of both books
                    Step(
                        WHOLE_BOOK,
                        (
                            "run",
                            "--book",
                            book,
                            "--methods",
                            "query_aware",
                            "--split",
                            "heldout",
                            "--read-tokens",
                            "512",
                        ),
                    )
                    for book in ("northangerabbey", "prideprejudice")
                ),
                Step(WHOLE_BOOK, ("run", "--methods", "window", "window_passages", "kept", *KEPT_QUESTIONS, *BUDGET)),
                _report(WHOLE_BOOK),
            ),
        ),
        Suite(
            "whole-document",
            "questions only the whole novel answers (lists, counts, order, a thread's course, comparisons, "
            "multi-hop, summaries) and multi-part inserted facts, held out: the default against BM25 retrieval "
            "and the evidence given directly, a kept 16k-token root (WindowRoot); map-reduce over kept 8k-token "
            "pieces on Northanger Abbey's first questions",
            "~2.5 h",
            (
                Step(WHOLE_DOCUMENT, ("run", "--book", "northangerabbey", "--methods", "default", "bm25", "oracle")),
                Step(WHOLE_DOCUMENT, ("run", "--book", "northangerabbey", "--methods", "shared")),
                Step(
                    WHOLE_DOCUMENT,
                    ("run", "--book", "prideprejudice", "--methods", "default", "--read-tokens", "512"),
                ),
                Step(WHOLE_DOCUMENT, ("run", "--book", "prideprejudice", "--methods", "bm25", "oracle")),
                Step(WHOLE_DOCUMENT, ("run", "--book", "northangerabbey", "--methods", "map_reduce", "--limit", "3")),
                _report(WHOLE_DOCUMENT),
            ),
        ),
        Suite(
            "edits",
            "an edited book's leaf tier (content-defined leaves): the leaves one paragraph's edit recomputes and its "
            "time against the full build, the even split beside it, one edit checked against a from-scratch build",
            "~15 min",
            (Step("benchmarks/leaf_edits.py", ("--verify", "1")),),
        ),
        Suite(
            "corpus",
            "questions across 92 chapters of both novels, one-document and two-document (invented two-hop facts), "
            "held out: ask_corpus against BM25 retrieval and against routing to one chapter",
            "~1.5 h",
            (
                Step(CORPUS_QA, ("run", "--methods", *CORPUS_METHODS, "--split", "heldout", "--limit", "18", *BUDGET)),
                _report(CORPUS_QA),
            ),
        ),
    )
}
