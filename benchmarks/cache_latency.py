"""Per-question latency with the document cache vs plain prefill, and disk reload vs recompute.

For each document length (tokens of the bundled Pride and Prejudice) it measures:
  (a) answering from the cache: time to first token and total, per question, cache in memory;
  (b) plain prefill of the same prompt (prefix + document + suffix + question) every time,
      through the engine's own ``decode`` loop over a fresh ``DynamicCache`` from position 0
      (no window check: beyond the model's trained window the answers are meaningless, the
      latency is not);
  (c) cold: compression + answer on an empty cache;
  and (d) loading the compressed cache from disk (a new ``DocumentCache`` over the directory)
      vs recomputing it (the compression time of (c)).

    .venv/bin/python benchmarks/cache_latency.py            # 16k and 32k tokens (long on a CPU)
    .venv/bin/python benchmarks/cache_latency.py --quick    # 2k tokens, to check it works

It measures the shared root (``mode="shared"``: one compression answers every question) on
SmolLM2-135M unless ``--model`` names another, as the committed results were measured; the
package's defaults (``query_aware``, the 1.5B model) would measure something else.

Writes benchmarks/results/cache_latency.{json,md} (``--quick``: cache_latency_quick.*).
Timings on a shared machine are noisy: compare the ratios measured within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.cache import DocumentCache
from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode
from homer_integrations.homer.document.prompt import encode
from homer_integrations.paths import bundled_excerpt, bundled_text

RESULTS = Path(__file__).parent / "results"
QUESTIONS = (
    "Who is Mr. Bingley?",
    "What does Mrs. Bennet want for her daughters?",
    "How does Elizabeth feel about Mr. Darcy?",
    "Who is Jane Bennet?",
)
PREFILL_CHUNK = 4096
"""Plain prefill runs in chunks of this many tokens so memory stays bounded at 32k (same compute)."""

MODEL = "smollm2-135m-instruct"
"""The model every committed result was measured on (the package's default was SmolLM2 then)."""
MODE = "shared"
"""The cache (a) answers from, (d) reloads and (c) computes: the document's one shared root."""

TARGET_TTFT_SPEEDUP = 50.0
TARGET_RELOAD_SPEEDUP = 10.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def document_of(engine: HomerModel, tokens: int) -> str:
    """The first ``tokens`` tokens of the bundled novel (from its title page), as text."""
    available = engine.prompting.count_tokens(bundled_text("prideprejudice"))
    if tokens > available:
        raise SystemExit(f"the bundled novel has only {available} tokens, fewer than {tokens}")
    return bundled_excerpt(engine.tokenizer, tokens, start_marker="")


@torch.inference_mode()
def plain_prefill_answer(engine: HomerModel, document: str, question: str, options: GenerationOptions) -> dict:
    """Answer with the whole prompt prefilled from position 0 (no HOMER); TTFT and total seconds."""
    layout = engine.prompting.layout(question, MODE)  # the same prompt texts as the cached answer's
    head = torch.cat(
        [
            encode(engine.tokenizer, layout.prefix, first=True),
            encode(engine.tokenizer, document),
            encode(engine.tokenizer, layout.suffix),
        ]
    )
    tail = encode(engine.tokenizer, layout.continuation)
    device = engine.model.device
    started = time.perf_counter()
    cache = DynamicCache()
    for start in range(0, head.numel(), PREFILL_CHUNK):
        part = head[start : start + PREFILL_CHUNK].to(device)
        positions = torch.arange(start, start + part.numel(), device=device)
        engine.model(input_ids=part[None], position_ids=positions[None], cache=cache, use_cache=True, logits_to_keep=1)
    state = DecodeState()
    prefill_seconds = time.perf_counter() - started
    # Like the engine's AnswerInfo: setup time + decode's own time to its first token.
    answer = "".join(decode(engine.model, engine.tokenizer, cache, tail, head.numel(), options, state))
    total = time.perf_counter() - started
    assert state.first_token_seconds is not None
    return {
        "question": question,
        "answer": answer.strip(),
        "time_to_first_token": prefill_seconds + state.first_token_seconds,
        "total_seconds": total,
        "prompt_tokens": head.numel() + tail.numel(),
        "output_tokens": len(state.token_ids),
    }


def cached_answer(engine: HomerModel, document: str, question: str, options: GenerationOptions) -> dict:
    stream = engine.run(document, question, mode=MODE, **options.model_dump())
    answer = stream.text()
    info = stream.info
    return {
        "question": question,
        "answer": answer.strip(),
        "cache_source": info.cache_source,
        "time_to_first_token": info.time_to_first_token,
        "total_seconds": info.total_seconds,
        "setup_seconds": info.compress_seconds,
        "output_tokens": info.output_tokens,
    }


def _not_on_disk() -> Any:
    raise RuntimeError("the benchmark's cache entry was not on disk")


def disk_reload(engine: HomerModel, document: str, repeats: int) -> dict:
    """Seconds to load the compressed cache from disk in a fresh ``DocumentCache`` (median of ``repeats``)."""
    layout = engine.prompting.layout("", MODE)
    key = engine.tiers.keys.root(layout.prefix, document, layout.suffix)
    doc = engine.document_cache.get(key)
    assert doc is not None, "compress first"
    with tempfile.TemporaryDirectory(prefix="homer-bench-") as tmp:
        DocumentCache(tmp).get_or_compute(key, lambda: doc)
        size = sum(p.stat().st_size for p in Path(tmp).iterdir() if p.is_file())
        times = []
        for _ in range(repeats):
            fresh = DocumentCache(tmp)
            started = time.perf_counter()
            loaded, source = fresh.get_or_compute(key, _not_on_disk)
            times.append(time.perf_counter() - started)
            assert source == "disk" and all(torch.equal(a, b) for a, b in zip(loaded.keys, doc.keys, strict=True))
    return {"seconds": statistics.median(times), "all_seconds": times, "file_bytes": size}


def measure(
    engine: HomerModel,
    tokens: int,
    questions: list[str],
    prefill_repeats: int,
    options: GenerationOptions,
    reload_repeats: int,
) -> dict:
    document = document_of(engine, tokens)
    document_tokens = engine.prompting.count_tokens(document)
    log(f"{document_tokens} tokens: (c) cold compression + answer")
    engine.document_cache.clear()
    cold = cached_answer(engine, document, questions[0], options)
    assert cold["cache_source"] == "computed", cold
    doc = engine.compress(document)
    log(f"  compressed in {doc.stats.seconds:.1f}s -> {doc.num_tokens} cache tokens; (a) answers from the cache")
    warm = [cached_answer(engine, document, q, options) for q in questions]
    assert all(a["cache_source"] == "memory" for a in warm), warm
    log("  (b) plain prefill of document + question")
    plain = []
    for q in questions[:prefill_repeats]:
        plain.append(plain_prefill_answer(engine, document, q, options))
        log(f"    prefill TTFT {plain[-1]['time_to_first_token']:.1f}s")
    log("  (d) disk reload")
    reload = disk_reload(engine, document, reload_repeats)
    cached_ttft = statistics.median(a["time_to_first_token"] for a in warm)
    plain_ttft = statistics.median(a["time_to_first_token"] for a in plain)
    recompute = doc.stats.seconds
    return {
        "document_tokens": document_tokens,
        "cache_tokens": doc.num_tokens,
        "cache_bytes": doc.nbytes,
        "compression": {
            "seconds": doc.stats.seconds,
            "tree_height": doc.stats.tree_height,
            "leaves": doc.stats.leaves,
            "peak_kv_bytes": doc.stats.peak_kv_bytes,
        },
        "cold": cold,
        "cached": warm,
        "plain_prefill": plain,
        "disk_reload": reload,
        "summary": {
            "cold_ttft": cold["time_to_first_token"],
            "cached_ttft_median": cached_ttft,
            "cached_total_median": statistics.median(a["total_seconds"] for a in warm),
            "plain_ttft_median": plain_ttft,
            "plain_total_median": statistics.median(a["total_seconds"] for a in plain),
            "ttft_speedup": plain_ttft / cached_ttft,
            "reload_seconds": reload["seconds"],
            "recompute_seconds": recompute,
            "reload_speedup": recompute / reload["seconds"],
        },
    }


def environment(engine: HomerModel, args: argparse.Namespace) -> dict[str, Any]:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                check=False,
            ).stdout.strip()
            or None
        )
    except OSError:
        commit = None
    return {
        "model": engine.model_name,
        "dtype": str(engine.stack.dtype).removeprefix("torch."),
        "device": str(engine.model.device),
        "context_window": engine.context_window,
        "homer_config": engine.config.model_dump(mode="json"),
        "generation": {"max_new_tokens": args.max_new_tokens, "temperature": 0.0},
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "git_commit": commit,
        "quick": args.quick,
    }


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Document cache latency",
        "",
        f"Model `{env['model']}` ({env['dtype']}, {env['device']}, {env['torch_threads']} threads), "
        f"HOMER max_chunk_len {env['homer_config']['max_chunk_len']}, warm-up {env['homer_config']['warmup_layers']}, "
        f"{env['generation']['max_new_tokens']} new tokens, greedy. Commit {env['git_commit']}.",
        "",
        "TTFT = time to first token. (a) cached: answer from the compressed cache in memory (median over "
        "questions); (b) plain: prefill of document + question every time; (c) cold: compression + answer; "
        "reload: a new DocumentCache loading the safetensors entry from disk vs recomputing it.",
        "",
        "| document tokens | cache tokens | (c) cold TTFT | (a) cached TTFT | (b) plain TTFT | TTFT speed-up (b)/(a) "
        "| (a) total | (b) total | disk reload | recompute | reload speed-up |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        s = run["summary"]
        lines.append(
            f"| {run['document_tokens']:,} | {run['cache_tokens']:,} | {s['cold_ttft']:.1f} s | "
            f"{s['cached_ttft_median']:.3f} s | {s['plain_ttft_median']:.1f} s | **{s['ttft_speedup']:.0f}x** | "
            f"{s['cached_total_median']:.2f} s | {s['plain_total_median']:.1f} s | {s['reload_seconds']:.3f} s | "
            f"{s['recompute_seconds']:.1f} s | **{s['reload_speedup']:.0f}x** |"
        )
    lines += [
        "",
        f"Targets (issue 3): TTFT speed-up >= {TARGET_TTFT_SPEEDUP:.0f}x at 16k tokens; "
        f"reload >= {TARGET_RELOAD_SPEEDUP:.0f}x faster than recomputing.",
    ]
    for run in result["runs"]:
        s = run["summary"]
        ttft = "met" if s["ttft_speedup"] >= TARGET_TTFT_SPEEDUP else "NOT met"
        reload = "met" if s["reload_speedup"] >= TARGET_RELOAD_SPEEDUP else "NOT met"
        lines.append(f"- {run['document_tokens']:,} tokens: TTFT target {ttft}, reload target {reload}")
    if env["context_window"] < max(r["document_tokens"] for r in result["runs"]):
        lines += [
            "",
            f"Plain prefill runs past the model's {env['context_window']}-token window: its answers are "
            "not meaningful there, only its latency is compared.",
        ]
    lines += [
        "",
        "Reproduce: `.venv/bin/python benchmarks/cache_latency.py" + (" --quick`" if env["quick"] else "`"),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one 2k-token document, two questions")
    parser.add_argument("--tokens", type=int, nargs="+", help="document lengths (default 16000 32000)")
    parser.add_argument("--model", default=MODEL, help=f"model name or path (default: {MODEL}, as the results)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else None)
    parser.add_argument("--max-chunk-len", type=int)
    parser.add_argument("--questions", type=int, default=3, help="questions answered from the cache")
    parser.add_argument("--prefill-repeats", type=int, default=2, help="questions answered by plain prefill")
    parser.add_argument("--reload-repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument(
        "--out", type=Path, help="output path without suffix (default benchmarks/results/cache_latency)"
    )
    args = parser.parse_args(argv)
    tokens = args.tokens or ([2000] if args.quick else [16000, 32000])
    questions = list(QUESTIONS[: 2 if args.quick else args.questions])
    out = args.out or RESULTS / ("cache_latency_quick" if args.quick else "cache_latency")

    config = HomerConfig(max_chunk_len=args.max_chunk_len, mode=MODE)  # mode: what homer_config records
    engine = HomerModel.from_pretrained(
        args.model, config=config, dtype=args.dtype, device=args.device, document_cache=DocumentCache(), progress=True
    )
    options = GenerationOptions(max_new_tokens=args.max_new_tokens)
    log(f"model {engine.model_name} on {engine.model.device}; calibrating if needed")
    engine.tiers.calibration.bias()
    result = {"environment": environment(engine, args), "runs": []}
    for n in tokens:
        result["runs"].append(
            measure(engine, n, questions, min(args.prefill_repeats, len(questions)), options, args.reload_repeats)
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    log(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
