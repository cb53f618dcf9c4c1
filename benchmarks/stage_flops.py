"""The machine's peak as the yardstick: each stage's achieved FLOP/s (or GB/s) against what this CPU can do.

    .venv/bin/python benchmarks/stage_flops.py --tokens 8000                  # an 8k excerpt, tier built here
    .venv/bin/python benchmarks/stage_flops.py --book northangerabbey --with-facts --store benchmarks/.work/store

In one run: the matmul peak of this machine in the model's dtype (the best of a few prefill-shaped
linear layers) and its memory bandwidth (a large copy); then, on one document, every stage timed and
its work counted from the model's shapes:

- ``plain prefill``: one forward of the whole prompt (where it fits the window);
- ``leaf tier``: every leaf's piece through the leaf layers (what a book pays once);
- ``leaf scoring``: a question's suffix through the leaf layers against every leaf's cached K/V, once
  per leaf (FLOP/s, and the tier's K/V bytes it reads in GB/s);
- ``re-read``: the plain prefill of the kept tokens through every layer;
- ``decoding``: tokens after the first, against the bandwidth limit of reading the weights once per token.

Linear layers count 2 FLOPs per weight per token; attention 4 x heads x head_dim per query-key pair
(causal: half the square). Writes ``results/stage_flops.json`` (rows appended by document length).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from homer_integrations import HomerModel
from homer_integrations.homer.leaves import leaf_pass
from homer_integrations.homer.tree import recompute
from homer_integrations.paths import bundled_text

RESULTS = Path(__file__).parent / "results"
QUESTION = "Who is Catherine's brother, and where does he study?"


def matmul_peak(dtype: torch.dtype, hidden: int, inner: int) -> float:
    """Best FLOP/s of a [2048, hidden] x [hidden, inner] linear layer in ``dtype``."""
    x, w = torch.randn(2048, hidden, dtype=dtype), torch.randn(inner, hidden, dtype=dtype)
    torch.nn.functional.linear(x, w)
    best = min(_timed(lambda: torch.nn.functional.linear(x, w)) for _ in range(5))
    return 2 * 2048 * hidden * inner / best


def bandwidth() -> float:
    """Bytes per second of a 512 MB copy (read + write)."""
    a = torch.empty(1 << 28, dtype=torch.float16)
    b = torch.empty_like(a)
    b.copy_(a)
    return 2 * a.numel() * a.element_size() / min(_timed(lambda: b.copy_(a)) for _ in range(3))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Shapes:
    """FLOP counts from a model config."""

    def __init__(self, config) -> None:
        h = config.hidden_size
        d = getattr(config, "head_dim", None) or h // config.num_attention_heads
        self.layers = config.num_hidden_layers
        self.attn_width = config.num_attention_heads * d
        kv = config.num_key_value_heads * d
        self.linear_per_token_layer = 2 * (h * self.attn_width * 2 + h * kv * 2 + 3 * h * config.intermediate_size)

    def forward(self, tokens: int, context_before: int, layers: int) -> float:
        """FLOPs of ``tokens`` new tokens after ``context_before`` cached ones, causal, through ``layers`` layers."""
        attention_pairs = tokens * context_before + tokens * (tokens + 1) / 2
        return layers * (tokens * self.linear_per_token_layer + 4 * self.attn_width * attention_pairs)


@contextlib.contextmanager
def timing(module, name: str, into: dict[str, list[float]]):
    """Time every call of ``module.name`` into ``into[name]``."""
    original = getattr(module, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.setdefault(name, []).append(time.perf_counter() - start)

    setattr(module, name, timed)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def timed_stages(into: dict[str, list[float]]):
    """Time the per-question stages into ``into``: ``score_leaves`` (every leaf scored with the question, in
    one batched pass) and ``prefill_kept`` (the re-read), where the package calls them."""
    with timing(leaf_pass, "score_leaves", into), timing(recompute, "prefill_kept", into):
        yield


def decoded_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter but the input embedding table, of which
    a step reads one row (unless the output layer shares it, tied, and reads it whole)."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embedding)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    store = args.store or tempfile.mkdtemp(prefix="homer-stage-flops-")
    engine = HomerModel.from_pretrained(args.model, dtype=args.dtype, store=store, progress=False)
    cfg, dtype = engine.model.config, engine.model.dtype
    shapes = Shapes(cfg)
    peak = matmul_peak(dtype, cfg.hidden_size, cfg.intermediate_size)
    bw = bandwidth()
    if args.with_facts:  # the whole-book benchmark's document, so its stored tier serves
        sys.path.insert(0, str(Path(__file__).parent))
        from whole_book import book_with_facts

        text = book_with_facts(args.book)[0]
    else:
        text = bundled_text(args.book)
    if args.tokens:
        enc = engine.tokenizer(text[: args.tokens * 8], add_special_tokens=False, return_offsets_mapping=True)
        text = text[: enc["offset_mapping"][min(args.tokens, len(enc["input_ids"])) - 1][1]]
    n = engine.prompting.count_tokens(text)
    stages: dict[str, dict] = {}

    def stage(name: str, seconds: float, flops: float | None = None, nbytes: float | None = None) -> None:
        row = {"seconds": round(seconds, 2)}
        if flops is not None:
            row |= {"gflop": round(flops / 1e9, 1), "gflops": round(flops / seconds / 1e9, 1)}
            row["of_peak"] = round(flops / seconds / peak, 3)
        if nbytes is not None:
            row |= {"gb": round(nbytes / 1e9, 2), "gb_per_s": round(nbytes / seconds / 1e9, 1)}
            row["of_bandwidth"] = round(nbytes / seconds / bw, 3)
        stages[name] = row
        print(name, row, flush=True)

    if n + 64 <= engine.context_window and n <= args.plain_limit:
        ids = engine.tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            seconds = _timed(lambda: engine.model(ids, logits_to_keep=1))
        stage("plain prefill", seconds, shapes.forward(ids.shape[1], 0, shapes.layers))

    calls: dict[str, list[float]] = {}
    with timed_stages(calls):
        first = engine.run(text, QUESTION, mode="query_aware", max_new_tokens=1)
        first.text()
        tier, _ = engine.tiers.leaf_tier(engine.prompting.layout(QUESTION, "query_aware").prefix, text)
        plan = tier.plan
        if first.info.document_seconds:
            pieces = [plan.piece(b).stop - plan.piece(b).start for b in range(plan.num_leaves)]
            build = sum(shapes.forward(piece, plan.prefix_len, tier.leaf_layers) for piece in pieces)
            stage("leaf tier", first.info.document_seconds, build)
        calls.clear()
        later = engine.run(text, QUESTION + " Answer briefly.", mode="query_aware", max_new_tokens=args.decode)
        answer = later.text()
    info = later.info
    kv_bytes = sum(t.numel() * t.element_size() for p in tier.pieces for t in p.keys + p.values)
    # the question's suffix runs through the leaf layers once per leaf, against that leaf's prefix and piece
    suffix = engine.prompting.count_tokens(engine.prompting.layout(QUESTION + " Answer briefly.", "query_aware").suffix)
    scoring = sum(
        shapes.forward(suffix, plan.prefix_len + plan.piece(b).stop - plan.piece(b).start, tier.leaf_layers)
        for b in range(plan.num_leaves)
    )
    stage("leaf scoring", sum(calls["score_leaves"]), scoring, nbytes=kv_bytes)
    kept = info.cache_tokens
    stage("re-read", sum(calls["prefill_kept"]), shapes.forward(kept, 0, shapes.layers))
    stage("question, first token", info.time_to_first_token or 0.0)
    weights = decoded_bytes(engine.model)
    if info.output_tokens > 1:
        per_token = (info.total_seconds - (info.time_to_first_token or 0.0)) / (info.output_tokens - 1)
        stage("decoding, per token", per_token, nbytes=weights)
    return {
        "model": args.model,
        "dtype": str(dtype).removeprefix("torch."),
        "document_tokens": n,
        "leaves": plan.num_leaves,
        "kept_tokens": kept,
        "threads": args.threads,
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "bandwidth_gb_per_s": round(bw / 1e9, 1),
        "answer": answer,
        "stages": stages,
        "other_seconds_in_first_token": round(
            (info.time_to_first_token or 0.0) - sum(calls["score_leaves"]) - sum(calls["prefill_kept"]), 2
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--book", default="northangerabbey")
    parser.add_argument("--tokens", type=int, default=0, help="an excerpt of this many tokens (0: the whole book)")
    parser.add_argument("--with-facts", action="store_true", help="the book with whole_book.py's facts inserted")
    parser.add_argument("--store", default="", help="a document store (a whole book's tier is reused from it)")
    parser.add_argument("--plain-limit", type=int, default=16000, help="longest prompt the plain prefill runs")
    parser.add_argument("--decode", type=int, default=16, help="tokens decoded by the later question")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    row = run(args)
    out = RESULTS / "stage_flops.json"
    previous = json.loads(out.read_text()) if out.is_file() else []
    rows = [r for r in previous if (r["document_tokens"], r["dtype"]) != (row["document_tokens"], row["dtype"])]
    out.write_text(json.dumps(sorted([*rows, row], key=lambda r: r["document_tokens"]), indent=1), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
