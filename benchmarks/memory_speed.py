"""Peak memory and wall time: plain prefill vs HOMER compression (and a question replayed from a leaf tier).

    .venv/bin/python benchmarks/memory_speed.py                    # 4k..64k on SmolLM2, CPU
    .venv/bin/python benchmarks/memory_speed.py --tokens 4000 8000 # a subset
    python benchmarks/memory_speed.py --device cuda --dtype bfloat16 --model qwen2.5-coder-0.5b-instruct \
        --tokens 8000 32000 64000 --methods plain homer tier question [--random-weights DIR]

On the CPU every (method, length) runs in a new Python process that loads the model, reads the RSS
after loading, then prefills the whole document once (``plain``: K/V cache kept, last-position
logits only), compresses it with HOMER (``homer``: the shared root), builds its leaf tier
(``tier``), or builds the tier untimed and replays one question from it (``question``: what every
later query-aware question costs); it reports its peak RSS (ru_maxrss), the working memory above
the loaded model, the engine's K/V bytes and the wall time. On CUDA the rows run in one process
per model (after an untimed warm-up of each method) and memory is the allocator's peak above the
loaded model (``torch.cuda.max_memory_allocated``).

``--random-weights DIR`` builds the model from ``DIR``'s config.json and tokenizer with random
weights: the same shapes, so the same time and memory (nothing here depends on the weights'
values), for a machine the real weights cannot be copied to. Results: CPU rows in
benchmarks/results/memory_speed.json/.md, others in memory_speed_<device>.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
METHODS = ("plain", "homer", "tier", "question")
QUESTION = "What is the pass key? Answer with the number only."


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load(model_name: str, device: str, dtype: str, random_weights: str | None):
    """(model, tokenizer, engine) on ``device`` in ``dtype``; random weights from a config dir if given."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.cache import DocumentCache
    from homer_integrations.engine.loading import load_model

    torch_dtype = getattr(torch, dtype)
    if random_weights:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(random_weights), dtype=torch_dtype)
        model, tok = model.eval(), AutoTokenizer.from_pretrained(random_weights)
    else:
        model, tok = load_model(model_name, dtype=torch_dtype, device=device)
    # A budget above any tier measured here, so the question's replay finds the tier it built.
    cache = DocumentCache(memory_budget_bytes=64 * 1024**3)
    # shared: the question-less layout below is the shared root's, as every committed row was measured
    config = HomerConfig(mode="shared")
    engine = HomerModel(model, tok, config, model_name=model_name, document_cache=cache, progress=False)
    engine.tiers.calibration.bias()  # loaded from the package, not part of the measurement
    return model, tok, engine


def document_of(tok, tokens: int) -> str:
    from homer_integrations.paths import bundled_text

    ids = tok(bundled_text("prideprejudice"), add_special_tokens=False)["input_ids"]
    return tok.decode((ids * -(-tokens // len(ids)))[:tokens])


def measure(method: str, tokens: int, model, tok, engine) -> dict:
    """One row: ``method`` on ``tokens`` document tokens; memory is read by the caller."""
    import torch
    from transformers import DynamicCache

    from homer_integrations.homer.document.prompt import encode

    document = document_of(tok, tokens)
    layout = engine.prompting.layout("")
    cuda = model.device.type == "cuda"
    row: dict = {"method": method, "tokens": tokens}
    with torch.inference_mode():
        if method == "question":
            engine.tiers.leaf_tier(layout.prefix, document)  # built untimed: the question's replay is measured
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            row["base_bytes"] = torch.cuda.memory_allocated()
        start = time.perf_counter()
        if method == "plain":
            full = torch.cat(
                [encode(tok, layout.prefix, first=True), encode(tok, document), encode(tok, layout.suffix)]
            )
            out = model(full[None].to(model.device), cache=DynamicCache(), use_cache=True, logits_to_keep=1)
            row["kv_bytes"] = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in out.cache.layers)
            row["prompt_tokens"] = full.numel()
            del out
        elif method == "homer":
            doc, *_ = engine.compress_span(layout.prefix, document, layout.suffix, mode="shared")
            row.update(kv_bytes=doc.stats.peak_kv_bytes, cache_tokens=doc.num_tokens)
            # the default AutoRoot: head-wise, or the flat root where the model refuses it
            row["root"] = "headwise" if doc.head_lengths is not None else "flat"
            row["prompt_tokens"] = doc.stats.prompt_tokens
        elif method == "tier":
            tier, _ = engine.tiers.leaf_tier(layout.prefix, document)
            row.update(kv_bytes=tier.nbytes, cache_tokens=tier.num_tokens)
        else:
            asked = engine.prompting.layout(QUESTION, "query_aware")
            doc, *_ = engine.compress_span(asked.prefix, document, asked.suffix, question=QUESTION, mode="query_aware")
            row.update(kv_bytes=doc.stats.peak_kv_bytes, cache_tokens=doc.num_tokens)
        if cuda:
            torch.cuda.synchronize()
        row["seconds"] = time.perf_counter() - start
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated()
            row["working_bytes"] = row["peak_bytes"] - row["base_bytes"]
    engine.document_cache.clear()  # the next row starts from an empty cache
    if cuda:
        torch.cuda.empty_cache()
    return row


def one_cpu(method: str, tokens: int, args: argparse.Namespace) -> dict:
    """A CPU row in this (fresh) process: peak RSS above the loaded model."""
    import torch

    torch.set_num_threads(args.threads)
    model, tok, engine = load(args.model, "cpu", args.dtype, args.random_weights)
    base_rss = rss_now()
    row = measure(method, tokens, model, tok, engine)
    row["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row["working_bytes"] = row["peak_rss"] - base_rss
    row["rss_after_load"] = base_rss
    return row


def rows_on_device(args: argparse.Namespace) -> list[dict]:
    """All rows of ``args`` in this process, after one untimed warm-up of each method."""
    model, tok, engine = load(args.model, args.device, args.dtype, args.random_weights)
    for method in args.methods:
        measure(method, 2000, model, tok, engine)
    rows = []
    for tokens in args.tokens:
        for method in args.methods:
            rows.append(measure(method, tokens, model, tok, engine))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cell(row: dict | None, key: str, scale: float = 1.0, digits: int = 0) -> str:
    """One table cell: ``row[key] * scale`` with ``digits`` decimals, or "-" where not measured."""
    return "-" if row is None or key not in row else f"{row[key] * scale:.{digits}f}"


def table(rows: list[dict], model: str, memory: str) -> list[str]:
    """Markdown rows of one model: each method's seconds and peak/working MB per length."""
    by = {(r["method"], r["tokens"]): r for r in rows if r["model"] == model}
    methods = [m for m in METHODS if any(m == k for k, _ in by)]
    head = ["doc tokens"] + [f"{m} s" for m in methods]
    head += ["HOMER/plain time"] if {"plain", "homer"} <= set(methods) else []
    head += [f"{m} peak {memory} MB" for m in methods] + [f"{m} working MB" for m in methods]
    head += ["plain K/V MB", "HOMER peak live K/V MB", "HOMER root"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mb = 1 / 2**20
    peak = "peak_bytes" if memory == "GPU" else "peak_rss"
    for t in sorted({t for _, t in by}):
        r = {m: by.get((m, t)) for m in methods}
        cells = [str(t)] + [cell(r[m], "seconds", digits=2 if memory == "GPU" else 1) for m in methods]
        if {"plain", "homer"} <= set(methods):
            p, h = r["plain"], r["homer"]
            cells.append(f"{h['seconds'] / p['seconds']:.2f}" if p and h else "-")
        cells += [cell(r[m], peak, mb) for m in methods] + [cell(r[m], "working_bytes", mb) for m in methods]
        cells += [cell(r.get("plain"), "kv_bytes", mb), cell(r.get("homer"), "kv_bytes", mb, 1)]
        cells.append(r["homer"].get("root", "flat") if r.get("homer") else "-")  # rows before "root": flat
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", nargs="*", type=int, default=[4000, 8000, 16000, 32000, 64000])
    ap.add_argument("--methods", nargs="*", choices=METHODS, default=["plain", "homer"])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="torch dtype name: float32, bfloat16, float16")
    ap.add_argument("--random-weights", metavar="DIR", help="random weights from DIR's config.json and tokenizer")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_cpu(args.one[0], int(args.one[1]), args)))
        return
    RESULTS.mkdir(exist_ok=True)
    cpu = args.device == "cpu"
    stem = "memory_speed" if cpu else f"memory_speed_{args.device.split(':')[0]}"
    # Runs add to (and replace rows of) earlier results, so long points can be measured separately.
    out_json = RESULTS / f"{stem}.json"
    old = json.loads(out_json.read_text()) if out_json.is_file() else []
    remeasured = {(args.model, m, t) for m in args.methods for t in args.tokens}
    rows = [r for r in old if (r["model"], r["method"], r["tokens"]) not in remeasured]
    same = {"model": args.model, "dtype": args.dtype, "weights": "random" if args.random_weights else "real"}
    if cpu:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        passed = sys.argv[1:]
        new = []
        for tokens in args.tokens:
            for method in args.methods:
                command = [sys.executable, __file__, *passed, "--one", method, str(tokens)]
                out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                new.append({**same, "threads": args.threads, **json.loads(out.stdout.strip().splitlines()[-1])})
                print(json.dumps(new[-1]), flush=True)
    else:
        import torch

        same["gpu"] = torch.cuda.get_device_name(args.device)
        new = [{**same, **row} for row in rows_on_device(args)]
    rows = sorted(rows + new, key=lambda r: (r["model"], r["tokens"], r["method"]))
    out_json.write_text(json.dumps(rows, indent=1) + "\n")
    lines = []
    for model in sorted({r["model"] for r in rows}):
        first = next(r for r in rows if r["model"] == model)
        where = first.get("gpu", f"CPU, {first.get('threads', 2)} threads")
        weights = "random weights, same shapes" if first.get("weights") == "random" else "real weights"
        lines += [f"{model}, {first.get('dtype', 'float32')}, {weights}, {where}:", ""]
        lines += [*table(rows, model, "RSS" if cpu else "GPU"), ""]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
