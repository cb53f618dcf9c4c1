"""RULER side by side: plain prefill, HOMER (shared root, per-question path) and kvpress presses.

    .venv/bin/python benchmarks/ruler.py run --lengths 4096 --samples 2 --ratios 4 \\
        --methods plain homer_shared homer_query_aware knorm kvzip
    .venv/bin/python benchmarks/ruler.py report

Samples come from NVIDIA's ``nvidia-long-context-eval`` generators (``ruler_tasks.py``), saved once
under ``results/ruler_samples/`` so that every method sees the same inputs. All methods run on the
same converted Qwen2.5-Coder-0.5B weights with the same prompt: the chat template's user turn is
RULER's instruction head + document + ``HomerConfig``'s document suffix + the question, then the
assistant turn starts with RULER's answer prefix. What is compressed is the part before the
question (question-agnostic), except for ``homer_query_aware`` (the question also sits in HOMER's
suffix while pruning, as in the paper) and ``snapkv_question`` (kvpress's question-aware mode: the
question is part of the compressed context).

Budget: at compression ratio r every method keeps ``context_tokens / r`` tokens (HOMER's
``final_cache_len``; kvpress's ``compression_ratio = 1 - 1/r``); ``plain`` keeps everything (r = 1).
Each (method, length, ratio) runs in a fresh process, so its peak RSS is its own (except the
score-based presses with ``--share-prefill``, which share one prefill and one process). Rows are
appended to ``results/ruler.jsonl`` as they finish; a later run skips what is there (resume), so
the grid can be filled over several runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import ruler_tasks
from ruler_tasks import TASKS, RulerSample, SampleStore

HERE = Path(__file__).parent
RESULTS = Path(os.environ.get("RULER_RESULTS", HERE / "results"))
"""Where rows, samples and reports go (``RULER_RESULTS`` overrides it, e.g. for a smoke run)."""
RESULTS_FILE = RESULTS / "ruler.jsonl"
SAMPLES = SampleStore(RESULTS / "ruler_samples")
WORK = RESULTS / ".work" if "RULER_RESULTS" in os.environ else HERE / ".work" / "ruler"
MODEL = "qwen2.5-coder-0.5b-instruct"
HOMER_METHODS = (
    "plain",
    "homer_shared",
    "homer_shared_stmt",
    "homer_query_aware",
    "homer_query_aware_last_token",
    "homer_query_aware_qattn",
    "homer_shared_compact",
    "homer_query_aware_compact",
    "homer_shared_recompute",
    "homer_query_aware_tree",
    "homer_query_aware_stmt_mean",
    "homer_query_aware_stmt_max",
    "homer_shared_probe9",
    "homer_shared_headwise",
    "homer_shared_headwise_whole",
    "homer_shared_headwise_cut",
    "homer_shared_headwise_probe9",
)
"""``homer_shared_stmt``: the shared root with the ``reconstruction_statements`` ablation (its sentence
bonus over statements, so a needle's key and value are ranked as one unit);
``homer_query_aware`` the package's per-question path (question attention over statements, each ranked
by its best token plus 4x its mean, ``UnitBestAndMean``, the recipe since 2026-11-26; the flat selection
re-read by a plain prefill of the kept tokens: ``RecomputeReplay``, the default since 2026-11-26;
rows run as ``homer_query_aware_stmt_best_mean`` were renamed to it); ``homer_query_aware_stmt_max``
the same re-read with a statement's best token alone (ablation ``question_statement_max``; rows run as
``homer_query_aware_stmt_max`` and, for a day, ``homer_query_aware``); ``homer_query_aware_stmt_mean``
the same re-read with the question recipe of 2026-11-25 (ablation ``question_statement_mean``: 4x a
statement's mean attention added to each token's; rows recorded as ``homer_query_aware`` before
2026-11-26 were renamed to it); ``homer_query_aware_tree`` the recipe of 2026-11-25 replayed through
the paper's merge tree (the package's
per-question path before 2026-11-26, whose rows were recorded as ``homer_query_aware``). The other
``homer_query_aware_*`` ablations replay the tree, as when they were measured:
``homer_query_aware_last_token`` with the ``question_last_token`` ablation (the paper's calibrated last
token and the recipe's word units; the package's per-question path before 2026-11-25);
``homer_query_aware_qattn`` with the ``question_attention_sentences`` ablation (sentence units, which
end at a colon). See ``_scoring``. ``_compact``: answering from ``ablations.compact_positions`` of the
cache (each kept token its own position, 0..K-1). ``homer_shared_recompute``: the shared root's flat
selection re-read by one plain prefill of the kept tokens (``RecomputeRoot``).
``homer_shared_probe9``: the shared root whose reconstruction probe scores at model layer 9 and stops
there (ablation ``reconstruction_probe_layer_9``; ``research/probe_depth.py`` chose the layer on the
tuning split). ``homer_shared_headwise``: the head-wise shared root (``HeadwiseRoot``: the flat
selection of twice the budget re-read by a prefill, then each K/V head of each layer keeps its own
tokens, KVzip's allocation, in a ragged cache of the budget's bytes; the package's default,
``AutoRoot``, since 2026-11-27). ``homer_shared_headwise_whole``: the same with the whole
document as candidates (one plain prefill of it where the window has room: KVzip's own input;
``headwise.root.CANDIDATES`` raised past the ratio); the package's recipe for an hour on 2026-11-27,
it lost at 8k, 4x held out, and its rows were renamed from ``homer_shared_headwise``.
``homer_shared_headwise_cut``: the head-wise root whose candidates are re-read as the selection kept
them, words cut (``headwise.root.WHOLE_WORDS = False``); the recipe until 2026-11-28, whose rows were
renamed from ``homer_shared_headwise``.
``homer_shared_headwise_probe9``: the head-wise root whose candidates' reconstruction probe scores at
model layer 9, so its leaves run only layers 0-9 (ablation ``reconstruction_probe_layer_9``).
``homer_shared``: the flat shared root (``FlatRoot``)."""
KVPRESS_METHODS = ("kvzip", "snapkv", "expected_attention", "streaming_llm", "knorm", "snapkv_question")
METHODS = HOMER_METHODS + KVPRESS_METHODS
ABLATION_METHODS = tuple(m for m in HOMER_METHODS if m not in ("plain", "homer_shared", "homer_query_aware"))
"""Run only when named: ``run`` without ``--methods`` runs the package's and kvpress's methods."""
CALIBRATED_CHUNKS = (2048, 4096)
"""Chunk lengths with a bundled Qwen calibration table (any other is calibrated once, minutes on a CPU)."""


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def chunk_length(context_tokens: int, budget: int) -> int:
    """HOMER's ``max_chunk_len`` for a context: 4096 (the model's default) once the context needs two
    such chunks, else 2048 so that short contexts still form a merge tree; never below the budget."""
    mcl = 4096 if context_tokens > 5120 else 2048
    return max(mcl, budget)


# ----------------------------------------------------------------------------------- the prompt
@dataclass(frozen=True)
class Prompt:
    """The texts around a sample: ``prefix + document + suffix`` is compressed, ``continuation`` follows."""

    prefix: Any
    document: str
    suffix: Any
    continuation: Any


def homer_prompt(engine: Any, sample: RulerSample, mode: str) -> Prompt:
    """RULER's texts in the engine's chat layout for ``mode`` (shared / query_aware / full)."""
    from homer_integrations.homer.document.prompt import concat

    question = sample.question.lstrip()
    layout = engine.prompting.layout(question, mode=mode)
    return Prompt(
        prefix=concat(layout.prefix, sample.head),
        document=sample.document,
        suffix=layout.suffix,
        continuation=concat(layout.continuation, sample.answer_prefix),
    )


def sample_config(engine: Any, sample: RulerSample, ratio: float, **settings: Any) -> Any:
    """The ``HomerConfig`` a HOMER method runs ``sample`` with at ``ratio`` (as ``homer_rows``): the budget
    is the shared prompt's tokens / ``ratio``, the same for every method, and the chunk length
    ``chunk_length``'s; ``settings`` (``mode``, ``replay``, ...) go to the config as they are."""
    from homer_integrations import HomerConfig
    from homer_integrations.homer.document.prompt import encode

    shared = homer_prompt(engine, sample, "shared")
    tok = engine.prompting.tokenizer
    context = sum(len(encode(tok, t)) for t in (shared.prefix, shared.document, shared.suffix))
    budget = round(context / ratio)
    return HomerConfig(max_chunk_len=chunk_length(context, budget), final_cache_len=budget, **settings)


def kvpress_job(sample: RulerSample, document_suffix: str) -> dict:
    """The same texts for kvpress's pipeline (it applies the chat template itself)."""
    return {
        "task": sample.task,
        "length": sample.length,
        "index": sample.index,
        "context": sample.head + sample.document + document_suffix,
        "question": sample.question.lstrip(),
        "answer_prefix": sample.answer_prefix,
        "max_new_tokens": sample.max_new_tokens,
    }


# ----------------------------------------------------------------------------------- results
def row_key(row: dict) -> tuple:
    # the dtype too: a bfloat16 run must neither skip nor replace a float32 row (rows before it: float32)
    return (row["task"], row["length"], row["method"], float(row["ratio"]), row["index"], row.get("dtype", "float32"))


def load_rows(path: Path = RESULTS_FILE) -> list[dict]:
    """Rows of the results file, the last one per key (a rerun replaces an earlier row)."""
    if not path.is_file():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row_key(row)] = row
    return list(rows.values())


def _other_live_run(pending: Path) -> bool:
    """Whether ``rows-<pid>-<ns>.jsonl`` (or ``jobs-...``) belongs to another ``ruler.py`` that is still
    running (its worker may still be appending to it, or not have read it yet)."""
    with contextlib.suppress(IndexError, ValueError):
        pid = int(pending.name.split("-")[1])
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 0)
                return True
    return False


def merge_pending() -> None:
    """Score the rows that workers left in ``.work/ruler/*.jsonl`` and append them to the results file.

    Two runs may share the results: each merges only its own files and those of runs that ended, under
    a lock, so no row is read while written nor appended twice.
    """
    from filelock import FileLock

    if not WORK.is_dir():
        return
    with FileLock(str(WORK / "merge.lock")):
        for pending in sorted(WORK.glob("rows-*.jsonl")):
            if not _other_live_run(pending):
                _merge_one(pending)


def _merge_one(pending: Path) -> None:
    lines = []
    for line in pending.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a worker killed mid-line leaves half a row: dropped
            lines.append(json.loads(line))
    RESULTS.mkdir(exist_ok=True)
    with RESULTS_FILE.open("a") as f:
        for row in lines:
            sample = next(s for s in SAMPLES.load(row["task"], row["length"]) if s.index == row["index"])
            row["score"] = ruler_tasks.score(sample, row["prediction"])
            row["outputs"] = sample.outputs
            row.setdefault("model", MODEL)
            f.write(json.dumps(row) + "\n")
    pending.unlink()


# ----------------------------------------------------------------------------------- HOMER worker
def homer_rows(args: argparse.Namespace) -> None:
    """Worker (fresh process): one HOMER method or plain over the jobs, rows appended to ``args.out``."""
    import torch

    from homer_integrations import HomerConfig, HomerModel, PromptTooLongError
    from homer_integrations.engine.loading import load_model
    from homer_integrations.homer.document.prompt import encode

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(MODEL, dtype=getattr(torch, args.dtype), device=args.device)
    loaded = peak_rss_mb()
    keys = [tuple(json.loads(line)) for line in args.jobs.read_text().splitlines() if line.strip()]
    probe = HomerModel(model, tok, HomerConfig(), model_name=MODEL, progress=False)
    for task, length, index in keys:
        sample = next(s for s in SAMPLES.load(task, length) if s.index == index)
        shared = homer_prompt(probe, sample, "shared")
        context_tokens = sum(len(encode(tok, t)) for t in (shared.prefix, shared.document, shared.suffix))
        budget = round(context_tokens / args.ratio)
        if args.method == "plain":
            # a fresh engine per sample: no earlier document stays in its memory cache (peak RSS)
            engine, mode = HomerModel(model, tok, HomerConfig(), model_name=MODEL, progress=False), "full"
        else:
            mcl = args.max_chunk_len or chunk_length(context_tokens, budget)
            mode = "shared" if args.method.startswith("homer_shared") else "query_aware"
            from ablations import recipe_of

            config = HomerConfig(max_chunk_len=mcl, final_cache_len=budget, mode=mode)
            switches = _replay(args.method)
            engine = HomerModel(model, tok, config, model_name=MODEL, progress=False, recipe=recipe_of(**switches))
            if args.method == "homer_shared_headwise_whole":
                from homer_integrations.homer.tree import headwise as headwise_root

                headwise_root.CANDIDATES = 1e6  # every document token a candidate, where the window has room
            if args.method == "homer_shared_headwise_cut":
                from homer_integrations.homer.tree import headwise as headwise_root

                headwise_root.WHOLE_WORDS = False  # the candidates as the selection kept them
            scoring = _scoring(args, engine.tiers.scoring)
            if scoring is not None:
                recipe = recipe_of(scoring, **switches)
                engine = HomerModel(model, tok, config, model_name=MODEL, progress=False, recipe=recipe)
            if args.method.endswith("_compact"):
                from ablations import with_compact_positions

                engine = with_compact_positions(engine)
        prompt = homer_prompt(engine, sample, mode)
        try:
            stream = _answer(engine, prompt, sample, mode)
        except PromptTooLongError as error:
            # cwe's few-shot example sits in HOMER's prefix: at a small budget it alone exceeds it; no row
            # (the table shows "-"), and the other samples of this worker still run
            print(f"{args.method} x{args.ratio:g} {task} {length} #{index}: skipped: {error}", flush=True)
            continue
        prediction = stream.text()
        info = stream.info
        document_seconds = info.document_seconds
        row = {
            "task": task,
            "length": length,
            "index": index,
            "method": args.method,
            "ratio": 1.0 if args.method == "plain" else args.ratio,
            "context_tokens": context_tokens,
            "budget": context_tokens if args.method == "plain" else budget,
            "cache_tokens": info.cache_tokens,
            "max_chunk_len": None if args.method == "plain" else engine.config.max_chunk_len,
            "prediction": prediction,
            # the document's own cost (prefill, shared root or leaf tier); a question's replay is in its ttft
            "compress_seconds": document_seconds,
            "ttft": (info.time_to_first_token or info.total_seconds) - document_seconds,
            "question_seconds": info.total_seconds - document_seconds,
            "shared_prefill": False,
            "peak_rss_mb": peak_rss_mb(),
            "model_rss_mb": loaded,
            "device": args.device,
            "dtype": args.dtype,
            "threads": torch.get_num_threads(),
        }
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{args.method} x{row['ratio']:g} {task} {length} #{index}: {prediction[:60]!r}", flush=True)


RECOMPUTED = ("homer_query_aware_stmt_mean", "homer_query_aware_stmt_max")
"""Per-question ablations that re-read their selection by a prefill (the others replay the tree)."""


def _replay(method: str) -> dict[str, str]:
    """The research switches a method pins (``ablations.recipe_of``): ``homer_shared`` and its ablations the
    flat root (the default before 2026-11-27, which all their rows measured), the per-question ablations
    replay the tree (as measured)."""
    if method == "homer_shared_recompute":
        return {"shared_root": "recompute"}
    if method.startswith("homer_shared_headwise"):
        return {"shared_root": "headwise"}
    if method.startswith("homer_shared"):
        return {"shared_root": "flat"}
    if method.startswith("homer_query_aware_") and method not in RECOMPUTED:
        return {"replay": "tree"}
    return {}


def _scoring(args: argparse.Namespace, package: Any) -> Any:
    """The method's scoring when it is not the package's shared scoring ``package`` (None: the package's).

    ``_last_token``: questions prune by the paper's last-token recipe (ablation ``question_last_token``);
    ``_qattn``: by question attention ranked by sentences, which end at a colon (ablation
    ``question_attention_sentences``); ``_stmt``: the reconstruction root's sentence bonus over statements.
    """
    from ablations import ABLATIONS, RECONSTRUCTION_ABLATIONS

    from homer_integrations.homer.scoring.chain import Scoring

    if args.method.endswith("_stmt"):
        return RECONSTRUCTION_ABLATIONS["reconstruction_statements"](package)
    if args.method.endswith("_probe9"):
        return RECONSTRUCTION_ABLATIONS["reconstruction_probe_layer_9"](package)
    if args.method.endswith("_last_token"):
        return ABLATIONS["question_last_token"](Scoring.default())
    if args.method.endswith("_qattn"):
        return ABLATIONS["question_attention_sentences"](package)
    if args.method == "homer_query_aware_stmt_max":
        return ABLATIONS["question_statement_max"](package)
    if args.method in ("homer_query_aware_stmt_mean", "homer_query_aware_tree"):
        return ABLATIONS["question_statement_mean"](package)
    return None


def _answer(engine: Any, prompt: Prompt, sample: RulerSample, mode: str) -> Any:
    from homer_integrations.homer.decoding.generation import GenerationOptions

    return engine.answerer.answer_span(
        prompt.prefix,
        prompt.document,
        prompt.suffix,
        prompt.continuation,
        GenerationOptions(max_new_tokens=sample.max_new_tokens),
        question=sample.question.lstrip() if mode == "query_aware" else None,
        mode=mode,
    )


# ----------------------------------------------------------------------------------- orchestration
def model_dir() -> Path:
    """The converted Qwen checkpoint (converted from its GGUF packages on first use)."""
    from homer_integrations.engine.loading import QWEN25_CODER_05B, converted_dir, load_model

    path = converted_dir(QWEN25_CODER_05B)
    if not (path / "config.json").is_file():
        load_model(MODEL)
    return path


def ensure_samples(args: argparse.Namespace) -> None:
    path = str(model_dir())
    for length in args.lengths:
        for task in args.tasks:
            SAMPLES.ensure(task, length, args.samples, path)


def _worker_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def _launch(command: list[str], args: argparse.Namespace) -> None:
    print("$ " + " ".join(command), flush=True)
    result = subprocess.run(command, env=_worker_env(args), check=False)
    merge_pending()  # keep what finished even when the worker failed
    if result.returncode != 0:
        raise SystemExit(f"worker failed with exit code {result.returncode}: {' '.join(command)}")


def run(args: argparse.Namespace) -> None:
    """Every (method, length, ratio) with samples missing from the results, each in a fresh process."""
    merge_pending()
    ensure_samples(args)
    indices = ruler_tasks.reported(range(args.first, args.samples))
    skipped = [i for i in range(args.first, args.samples) if i in ruler_tasks.TUNING]
    if skipped:
        print(f"skipping indices {skipped[0]}-{skipped[-1]}: the tuning split (ruler_tasks.TUNING)", flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    done = {row_key(r) for r in load_rows()}
    from kvpress_runner import SHARABLE, ensure_venv

    def pending(method: str, length: int, ratios: list[float]) -> list[tuple[str, int, int]]:
        return [  # index-major: a run stopped early has covered every task
            (task, length, i)
            for i in indices
            for task in args.tasks
            if any((task, length, method, r, i, args.dtype) not in done for r in ratios)
        ]

    def jobs_file(keys: list[tuple[str, int, int]], rows: list[dict] | None = None) -> Path:
        path = WORK / f"jobs-{os.getpid()}-{time.monotonic_ns()}.jsonl"
        path.write_text("".join(json.dumps(r if rows else k) + "\n" for k, r in zip(keys, rows or keys, strict=True)))
        return path

    def out_file() -> Path:
        return WORK / f"rows-{os.getpid()}-{time.monotonic_ns()}.jsonl"

    common = ["--device", args.device, "--dtype", args.dtype] + (
        ["--threads", str(args.threads)] if args.threads else []
    )
    ratios = [float(r) for r in args.ratios]
    kv_methods = [m for m in args.methods if m in KVPRESS_METHODS]
    groups: list[list[str]] = []
    if args.share_prefill and any(m in SHARABLE for m in kv_methods):
        groups.append([m for m in kv_methods if m in SHARABLE])
    groups += [[m] for m in kv_methods if not (args.share_prefill and m in SHARABLE)]
    from homer_integrations.homer.config import DEFAULT_DOCUMENT_SUFFIX

    for length in args.lengths:
        for method in [m for m in args.methods if m in HOMER_METHODS]:
            for ratio in [1.0] if method == "plain" else ratios:
                keys = pending(method, length, [ratio])
                if not keys:
                    continue
                command = [sys.executable, __file__, "worker", "--method", method, "--ratio", str(ratio)]
                command += ["--jobs", str(jobs_file(keys)), "--out", str(out_file()), *common]
                if args.max_chunk_len:
                    command += ["--max-chunk-len", str(args.max_chunk_len)]
                _launch(command, args)
        for group in groups:
            # a shared-prefill group answers every ratio in one process; single presses one ratio each
            shared = args.share_prefill and group[0] in SHARABLE
            for ratio_set in [ratios] if shared else [[r] for r in ratios]:
                keys = sorted({k for m in group for k in pending(m, length, ratio_set)})
                if not keys:
                    continue
                samples = {s.key: s for t in args.tasks for s in SAMPLES.load(t, length)}
                jobs = [kvpress_job(samples[k], DEFAULT_DOCUMENT_SUFFIX) for k in keys]
                python = ensure_venv(torch_spec=args.kvpress_torch)
                command = [str(python), str(HERE / "kvpress_runner.py"), "--model", str(model_dir())]
                command += ["--jobs", str(jobs_file(keys, jobs)), "--out", str(out_file()), "--presses", *group]
                command += ["--ratios", *map(str, ratio_set), *common]
                if shared:
                    command.append("--share-prefill")
                _launch(command, args)
    drop_jobs()


def drop_jobs() -> None:
    """Delete the job lists of this run and of runs that ended; another live run's worker may not have
    read its own yet (two runs side by side lost a row so)."""
    for stale in WORK.glob("jobs-*.jsonl"):
        if not _other_live_run(stale):
            stale.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------- report
SECONDS = ("compress_seconds", "ttft", "question_seconds")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _device(row: dict) -> str:
    return row.get("device", "cpu")


def summarize(rows: list[dict]) -> dict[str, list[dict]]:
    """Per (task, length, method, ratio) and, averaged over tasks, per (length, method, ratio).

    Accuracy counts every row; seconds and peak RSS only the rows of one device per (length, method,
    ratio), the CPU where it ran there (``seconds_device``): a GPU's seconds are not the CPU's.
    """
    cells: dict[tuple, list[dict]] = defaultdict(list)
    timed: dict[tuple, str] = {}
    for r in rows:
        cells[(r["task"], r["length"], r["method"], float(r["ratio"]))].append(r)
        point = (r["length"], r["method"], float(r["ratio"]))
        timed[point] = "cpu" if "cpu" in (timed.get(point), _device(r)) else _device(r)
    per_task = []
    for (task, length, method, ratio), rs in sorted(cells.items()):
        device = timed[(length, method, ratio)]
        on = [r for r in rs if _device(r) == device]
        isolated = [r for r in on if not r.get("shared_prefill")]
        per_task.append(
            {
                "task": task,
                "length": length,
                "method": method,
                "ratio": ratio,
                "samples": len(rs),
                "accuracy": _mean([r["score"] for r in rs]),
                "budget": _mean([r["budget"] for r in rs]),
                "seconds_device": device,
                **{k: _mean([r[k] for r in on]) for k in SECONDS},
                "peak_rss_mb": max((r["peak_rss_mb"] for r in isolated), default=None),
                "shared_prefill": len(isolated) < len(on),
            }
        )
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in per_task:
        groups[(e["length"], e["method"], e["ratio"])].append(e)
    overall = []

    def order(item: tuple) -> tuple:
        (length, method, ratio), _ = item
        return (length, METHODS.index(method) if method in METHODS else len(METHODS), method, ratio)

    for (length, method, ratio), es in sorted(groups.items(), key=order):
        rss = [e["peak_rss_mb"] for e in es if e["peak_rss_mb"] is not None]
        overall.append(
            {
                "length": length,
                "method": method,
                "ratio": ratio,
                "tasks": {e["task"]: {"accuracy": e["accuracy"], "samples": e["samples"]} for e in es},
                "accuracy": _mean([e["accuracy"] for e in es]),  # macro average over the tasks run
                "samples": sum(e["samples"] for e in es),
                "seconds_device": es[0]["seconds_device"],
                **{k: _mean([e[k] for e in es if e[k] is not None]) for k in SECONDS},
                "peak_rss_mb": max(rss) if rss else None,
                "shared_prefill": any(e["shared_prefill"] for e in es),
            }
        )
    return {"overall": overall, "per_task": per_task}


def markdown(summary: dict[str, list[dict]], methods: Callable[[str], bool] = lambda m: True) -> str:
    """README-ready table of the ``methods`` rows: accuracy per task (samples), macro average (tasks),
    seconds and peak RSS."""
    overall = [e for e in summary["overall"] if methods(e["method"])]
    present = {t for e in overall for t in e["tasks"]}
    tasks = [t for t in TASKS if t in present] + sorted(present - set(TASKS))
    head = ["tokens", "method", "ratio", *tasks, "average", "compress s", "TTFT s", "question s", "on", "peak RSS MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in overall:
        cells = []
        for t in tasks:
            c = e["tasks"].get(t)
            cells.append("-" if c is None else f"{c['accuracy']:.2f} ({c['samples']})")
        rss = "-" if e["peak_rss_mb"] is None else f"{e['peak_rss_mb']:.0f}"
        method = e["method"] + (" *" if e["shared_prefill"] else "")
        lines.append(
            f"| {e['length']} | {method} | {e['ratio']:g}x | " + " | ".join(cells) + f" | {e['accuracy']:.2f} "
            f"({len(e['tasks'])}) | "
            f"{e['compress_seconds']:.1f} | {e['ttft']:.2f} | {e['question_seconds']:.1f} | {e['seconds_device']} | "
            f"{rss} |"
        )
    lines += [
        "",
        "Accuracy: RULER's per-sample metric (string_match_all; string_match_part for qa), mean over samples "
        "(count in brackets); average: mean over the tasks in the row (their count in brackets: rows over "
        "different tasks do not compare; the paired tables do). compress s: the document's cost "
        "(plain prefill, HOMER shared root or leaf tier, kvpress prefill + press); TTFT and question s: per "
        "question after that (HOMER's query-aware replay included). * shared one prefill with the other "
        "score-based presses: compress s = that prefill + the press's own scoring, no peak RSS of its own; "
        "kvpress_full: that prefill's whole cache, answered by the press harness (a control for plain). "
        "on: the device the seconds and peak RSS were measured on (the CPU where a point ran on both; "
        "accuracy counts both, fp32 either way).",
    ]
    return "\n".join(lines) + "\n"


def plots(summary: dict[str, list[dict]], ratio_length: int) -> None:
    """Accuracy by length per method (one line per method and ratio), and by ratio at ``ratio_length``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = summary["overall"]
    methods = [m for m in METHODS if any(e["method"] == m for e in overall)]
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method in methods:
        for ratio, style in zip(
            sorted({e["ratio"] for e in overall if e["method"] == method}), ("-", "--", ":", "-."), strict=False
        ):
            es = sorted(
                (e for e in overall if e["method"] == method and e["ratio"] == ratio), key=lambda e: e["length"]
            )
            label = method if ratio == 1 else f"{method} {ratio:g}x"
            ax.plot(
                [e["length"] for e in es],
                [e["accuracy"] for e in es],
                style,
                marker="o",
                color=colors[method],
                label=label,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted({e["length"] for e in overall}), [f"{n // 1024}k" for n in sorted({e["length"] for e in overall})]
    )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("RULER length (tokens)")
    ax.set_ylabel("accuracy (mean over tasks)")
    ax.set_title("RULER on Qwen2.5-Coder-0.5B: accuracy by length")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(RESULTS / "ruler_by_length.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    at = [e for e in overall if e["length"] == ratio_length]
    for method in methods:
        es = sorted((e for e in at if e["method"] == method), key=lambda e: e["ratio"])
        if method == "plain" and es:  # the uncompressed reference, drawn across every ratio
            ax.axhline(es[0]["accuracy"], color=colors[method], linestyle="--", label="plain (1x)")
        elif es:
            ax.plot(
                [e["ratio"] for e in es], [e["accuracy"] for e in es], marker="o", color=colors[method], label=method
            )
    ax.set_xscale("log", base=2)
    ratios = sorted({e["ratio"] for e in at}) or [1.0]
    ax.set_xticks(ratios, [f"{r:g}x" for r in ratios])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("compression ratio (context tokens / kept tokens)")
    ax.set_ylabel("accuracy (mean over tasks)")
    ax.set_title(f"RULER at {ratio_length // 1024}k tokens: accuracy by compression ratio")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "ruler_by_ratio.png", dpi=120)
    plt.close(fig)


def paired(
    rows: list[dict], method: str, reference: str = "plain", draws: int = 2000, pooled: bool = False
) -> list[dict]:
    """``method`` against ``reference`` on exactly the samples both answered, per (length, ratio), or
    ``pooled`` over every length and ratio both ran (one entry, length and ratio ``"all"``: the peers
    issue's target averages over the tasks at 4x and 8x).

    The difference is the macro mean over tasks of (method - reference) per sample; its 90% interval
    comes from a bootstrap that redraws each task's samples (pairs kept together), so it says how far
    the sample counts can move the gap. Tasks need at least one pair to count. A compressing
    ``reference`` (a press) is compared at the method's own ratio, plain prefill at any.
    """
    import random

    same_ratio = reference != "plain"
    scores: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["method"] in (method, reference):
            ratio = float(r["ratio"]) if r["method"] == method or same_ratio else None
            scores[(r["length"], ratio, r["task"], r["index"])][r["method"]] = r["score"]
    groups: dict[tuple, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for (length, ratio, task, index), s in scores.items():
        ref = scores.get((length, ratio if same_ratio else None, task, index), {}).get(reference)
        if ratio is not None and method in s and ref is not None:
            groups[("all", "all") if pooled else (length, ratio)][task].append((s[method], ref))
    out = []
    for (length, ratio), by_task in sorted(groups.items()):
        rng = random.Random(0)
        tasks = sorted(by_task)

        def macro(pairs_by_task: list[list[tuple[float, float]]], value: Callable[[float, float], float]) -> float:
            return sum(sum(value(a, b) for a, b in ps) / len(ps) for ps in pairs_by_task) / len(pairs_by_task)

        def gap(pairs_by_task: list[list[tuple[float, float]]]) -> float:
            return macro(pairs_by_task, lambda a, b: a - b)

        draws_ = sorted(gap([rng.choices(by_task[t], k=len(by_task[t])) for t in tasks]) for _ in range(draws))
        observed = [by_task[t] for t in tasks]
        out.append(
            {
                "length": length,
                "method": method,
                "ratio": ratio,
                "reference": reference,
                "pairs": {t: len(by_task[t]) for t in tasks},
                "accuracy": macro(observed, lambda a, _: a),
                "reference_accuracy": macro(observed, lambda _, b: b),
                "difference": gap(observed),
                "interval_90": [draws_[int(0.05 * draws)], draws_[int(0.95 * draws) - 1]],
            }
        )
    return out


def _ratio(ratio: float | str) -> str:
    return ratio if isinstance(ratio, str) else f"{ratio:g}x"


def paired_markdown(comparisons: list[dict]) -> str:
    """README-ready table of ``paired`` comparisons: one reference names a column; several get a
    ``versus`` column and a ``reference`` accuracy column."""
    references = sorted({c["reference"] for c in comparisons}) or ["plain"]
    one = len(references) == 1
    head = "| tokens | method | ratio |" + ("" if one else " versus |")
    ref_column = references[0] if one else "reference"
    lines = [
        f"{head} tasks (pairs) | method | {ref_column} | difference | 90% interval |",
        "|---|---|---|" + ("" if one else "---|") + "---|---|---|---|---|",
    ]
    for c in comparisons:
        low, high = c["interval_90"]
        versus = "" if one else f" {c['reference']} |"
        lines.append(
            f"| {c['length']} | {c['method']} | {_ratio(c['ratio'])} |{versus} {len(c['pairs'])} "
            f"({sum(c['pairs'].values())}) | {c['accuracy']:.2f} | {c['reference_accuracy']:.2f} | "
            f"{c['difference']:+.3f} | [{low:+.3f}, {high:+.3f}] |"
        )
    who = references[0] if one else "the reference"
    lines += [
        "",
        f"Paired: only the samples both the method and {who} answered"
        + ("" if references == ["plain"] else ", at the same ratio")
        + "; macro mean over the tasks; the interval is a bootstrap over each task's samples (2000 draws).",
    ]
    return "\n".join(lines) + "\n"


PAIRED_METHODS = (
    "homer_query_aware",
    "homer_shared",
    "homer_shared_headwise",
    "homer_shared_headwise_cut",
    "kvpress_full",
)
"""The package's two tiers (and the head-wise recipe before 2026-11-28, which holds most of its rows),
and the press harness's uncompressed control (``kvpress_runner.FULL``), compared sample by sample with
plain prefill in the report."""


MAIN_TABLE = (
    "plain",
    "homer_shared",
    "homer_shared_headwise",
    "homer_shared_headwise_cut",
    "homer_query_aware",
    *KVPRESS_METHODS,
    "kvpress_full",
)
"""The methods of ``ruler.md`` (the README's table); the ablations, with plain prefill, go to ``ruler_ablations.md``."""

PEER_PAIRS = (
    *(("homer_shared", press) for press in ("kvzip", "snapkv", "expected_attention", "streaming_llm", "knorm")),
    ("homer_query_aware", "snapkv_question"),
    ("homer_shared_headwise", "homer_shared"),
    ("homer_shared_headwise", "kvzip"),
    ("homer_shared_headwise_cut", "homer_shared"),
    ("homer_shared_headwise_cut", "kvzip"),
)
"""The peers issue's comparisons at equal budget: the shared root against each question-agnostic press,
the per-question path against kvpress's question-aware SnapKV, the head-wise root (and its recipe
before 2026-11-28, ``_cut``) against the flat root and KVzip (sample by sample, same ratio)."""
POOLED_PAIRS = (("homer_shared_headwise", "kvzip"), ("homer_shared", "kvzip"), ("homer_query_aware", "snapkv_question"))
"""The peers issue's targets as it states them, over every length and ratio both ran (``paired(pooled=True)``):
the shared root against the best question-agnostic press, the per-question path against question-aware SnapKV."""
ABLATION_PAIRS = (
    ("homer_shared_probe9", "homer_shared"),
    ("homer_shared_headwise_whole", "homer_shared_headwise"),
    ("homer_shared_headwise_cut", "homer_shared_headwise"),
    ("homer_shared_headwise_probe9", "homer_shared_headwise"),
)
"""Ablations against the recipe they vary, sample by sample (``ruler_ablations.md``)."""


GLANCE_TASKS = tuple(t for t in TASKS if t != "cwe")
"""The tasks of the at-a-glance table: cwe is left out, since its few-shot example alone exceeds HOMER's
budget at 4k and at 8k, 8x (no row), and plain prefill answers it 0 at 8k (the 0.5B model repeats the
example's words)."""
GLANCE_COLUMNS = (
    ("per-question path", ("homer_query_aware",)),
    ("shared root", ("homer_shared_headwise",)),
    ("KVzip", ("kvzip",)),
    ("best other question-agnostic press", ("snapkv", "expected_attention", "streaming_llm", "knorm")),
    ("SnapKV, question-aware", ("snapkv_question",)),
)
"""Columns of the at-a-glance table: a label and the methods it stands for (several: the best at each point)."""


def glance(rows: list[dict], draws: int = 200) -> list[dict]:
    """Per (length, ratio) a HOMER tier ran: plain prefill's accuracy over ``GLANCE_TASKS`` and, per
    ``GLANCE_COLUMNS`` label, the best of its methods paired with plain (``paired``) where it covers every
    one of those tasks, with its share of plain's accuracy on the same pairs."""
    six = [r for r in rows if r["task"] in GLANCE_TASKS]
    versus = {
        (c["length"], c["ratio"], m): c
        for _, methods in GLANCE_COLUMNS
        for m in methods
        for c in paired(six, m, draws=draws)
        if len(c["pairs"]) == len(GLANCE_TASKS)
    }
    points = sorted({(length, ratio) for length, ratio, m in versus if m.startswith("homer_")})
    out = []
    for length, ratio in points:
        plain = [r for r in six if r["method"] == "plain" and r["length"] == length]
        by_task = {t: [r["score"] for r in plain if r["task"] == t] for t in GLANCE_TASKS}
        entry: dict[str, Any] = {
            "length": length,
            "ratio": ratio,
            "plain": {
                "accuracy": _mean([_mean(s) for s in by_task.values() if s]),
                "samples": {t: len(s) for t, s in by_task.items()},
            },
            "columns": {},
        }
        for label, methods in GLANCE_COLUMNS:
            found = [versus[(length, ratio, m)] for m in methods if (length, ratio, m) in versus]
            if found:
                best = max(found, key=lambda c: c["accuracy"])
                share = best["accuracy"] / best["reference_accuracy"] if best["reference_accuracy"] else None
                entry["columns"][label] = {
                    "method": best["method"],
                    "accuracy": best["accuracy"],
                    "of_plain": share,
                    "pairs": sum(best["pairs"].values()),
                }
        out.append(entry)
    return out


def glance_markdown(points: list[dict]) -> str:
    """README-ready at-a-glance table of ``glance``."""
    labels = [label for label, _ in GLANCE_COLUMNS]
    several = {label for label, methods in GLANCE_COLUMNS if len(methods) > 1}
    lines = ["| tokens | ratio | plain (samples) | " + " | ".join(labels) + " |", "|" + "---|" * (3 + len(labels))]
    for p in points:
        cells = []
        for label in labels:
            c = p["columns"].get(label)
            if c is None:
                cells.append("-")
                continue
            name = f" {c['method']}" if label in several else ""
            share = "" if c["of_plain"] is None else f"{c['of_plain']:.2f} of plain, "
            cells.append(f"{c['accuracy']:.2f}{name} ({share}{c['pairs']})")
        n = sum(p["plain"]["samples"].values())
        lines.append(
            f"| {p['length']} | {_ratio(p['ratio'])} | {p['plain']['accuracy']:.2f} ({n}) | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Each method paired with plain prefill on the samples both answered, macro mean over six tasks ("
        + ", ".join(GLANCE_TASKS)
        + "; cwe is left out: HOMER cannot run it at most budgets, and plain answers it 0 at 8k); "
        "of plain: the method's accuracy over plain's on those pairs; the count is pairs. A cell needs all six "
        "tasks. plain: its mean over all its samples of the six tasks at that length. The shared root "
        '(`mode="shared"`) is built head-wise (`AutoRoot`); the per-question path, the package\'s default, is '
        '`mode="query_aware"`.',
    ]
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace) -> None:
    merge_pending()
    rows = load_rows()
    if not rows:
        raise SystemExit(f"no rows in {RESULTS_FILE}; run `ruler.py run` first")
    summary: dict[str, Any] = summarize(rows)
    summary["paired"] = [c for m in PAIRED_METHODS for c in paired(rows, m)]
    summary["peers"] = [c for m, press in PEER_PAIRS for c in paired(rows, m, press)]
    summary["peers"] += [c for m, press in POOLED_PAIRS for c in paired(rows, m, press, pooled=True)]
    summary["glance"] = glance(rows)
    table = "\n".join(
        (
            glance_markdown(summary["glance"]),
            markdown(summary, lambda m: m in MAIN_TABLE),
            paired_markdown(summary["paired"]),
        )
    )
    if summary["peers"]:
        table += "\n" + paired_markdown(summary["peers"])
    (RESULTS / "ruler.md").write_text(table)
    summary["ablation_pairs"] = [c for m, recipe in ABLATION_PAIRS for c in paired(rows, m, recipe)]
    ablations = markdown(summary, lambda m: m not in MAIN_TABLE or m == "plain")
    if summary["ablation_pairs"]:
        ablations += "\n" + paired_markdown(summary["ablation_pairs"])
    (RESULTS / "ruler_ablations.md").write_text(ablations)
    (RESULTS / "ruler.json").write_text(json.dumps(summary, indent=1) + "\n")
    lengths = sorted({r["length"] for r in rows})
    plots(summary, args.ratio_length if args.ratio_length in lengths else lengths[-1])
    print(table)


def dtype_pairs(
    rows: list[dict], reference: list[dict], dtype: str, lengths: list[int], draws: int = 2000
) -> list[dict]:
    """Each method of ``rows`` run in ``dtype`` against the same method's float32 ``reference`` rows, on the
    samples both ran (``paired``, float32 the reference), at ``lengths``."""
    comparisons = []
    for method in sorted({r["method"] for r in rows if r["dtype"] == dtype}):
        named = [
            {**r, "method": f"{method} {r['dtype']}"}
            for r in rows + reference
            if r["method"] == method and r["dtype"] in (dtype, "float32") and r["length"] in lengths
        ]
        # a reference other than "plain" pairs at the same ratio, which plain's rows (ratio 1) also share
        comparisons += paired(named, f"{method} {dtype}", f"{method} float32", draws=draws)
    return comparisons


def dtypes(args: argparse.Namespace) -> None:
    """``dtype_pairs`` of ``args.rows`` against ``results/ruler.jsonl``, as a table."""
    reference = load_rows(HERE / "results" / "ruler.jsonl")
    comparisons = dtype_pairs(load_rows(args.rows), reference, args.dtype, args.lengths)
    print(paired_markdown(comparisons))
    for c in comparisons:
        print(f"{c['method']}: pairs per task {c['pairs']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("samples", help="generate and save the samples only")
    r = sub.add_parser("run", help="run methods over tasks / lengths / ratios, resuming")
    for p in (s, r):
        p.add_argument("--tasks", nargs="+", default=list(TASKS))
        p.add_argument("--lengths", type=int, nargs="+", default=[4096])
        p.add_argument(
            "--samples",
            type=int,
            default=10,
            help="samples per task and length (indices 0..n-1; run skips 10-19, the probes' tuning split)",
        )
    r.add_argument(
        "--first", type=int, default=0, help="first sample index to run: run does indices first..samples-1 (default 0)"
    )
    r.add_argument("--methods", nargs="+", choices=METHODS, default=[m for m in METHODS if m not in ABLATION_METHODS])
    r.add_argument("--ratios", type=float, nargs="+", default=[4.0, 8.0])
    r.add_argument("--share-prefill", action="store_true", help="score-based presses share one prefill")
    r.add_argument("--max-chunk-len", type=int, default=None, help="HOMER chunk length (default: by context)")
    r.add_argument("--device", default="cpu")
    r.add_argument("--dtype", default="float32")
    r.add_argument("--threads", type=int, default=None)
    r.add_argument(
        "--kvpress-torch", default=None, help="torch requirement for the kvpress venv (default torch==2.13.0)"
    )
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("--method", choices=HOMER_METHODS, required=True)
    w.add_argument("--ratio", type=float, required=True)
    w.add_argument("--jobs", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--max-chunk-len", type=int, default=None)
    w.add_argument("--device", default="cpu")
    w.add_argument("--dtype", default="float32")
    w.add_argument("--threads", type=int, default=None)
    d = sub.add_parser("dtypes", help="another dtype's rows against float32's, paired on the same samples")
    d.add_argument("--rows", type=Path, default=HERE / "results" / "ruler_bfloat16" / "ruler.jsonl")
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--lengths", type=int, nargs="+", default=[8192])
    rep = sub.add_parser("report", help="JSON summary, markdown table and plots from results/ruler.jsonl")
    rep.add_argument("--ratio-length", type=int, default=8192, help="length of the accuracy-by-ratio plot")
    args = parser.parse_args()
    {"samples": ensure_samples, "run": run, "worker": homer_rows, "report": report, "dtypes": dtypes}[args.command](
        args
    )


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
