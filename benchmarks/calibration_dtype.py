"""Does a calibration table depend on the dtype? bfloat16 tables against the shipped float32 ones.

    .venv/bin/python benchmarks/calibration_dtype.py                        # the three shipped models
    .venv/bin/python benchmarks/calibration_dtype.py --models smollm2-135m-instruct

For each model: the shipped float32 table (its own segment count), and the bfloat16 table: the
shipped one, or else computed by the model loaded in bfloat16 over the same calibration windows
and shipped (written to the package's calibration directory), so ``dtype="auto"`` on a CPU that
picks bfloat16 never calibrates on first use. Reported: the largest and mean
difference, both against the table's own spread (std over distances, per layer), and what the
difference does to pruning: on a held-out window (Pride and Prejudice, not the calibration novel),
the bfloat16 model's last-token scores minus each table keep the top half of the window at every
layer; the overlap (Jaccard) of the two kept sets. Writes ``results/calibration_dtype.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import DynamicCache

from homer_integrations.engine.loading import EMBEDDED_MODELS, load_model
from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.calibration import CalibrationKey, CalibrationStore, compute_bias
from homer_integrations.homer.scoring.scorers import attention_logits
from homer_integrations.paths import PACKAGE_DATA, bundled_text

RESULTS = Path(__file__).parent / "results"
SHIPPED = CalibrationStore(PACKAGE_DATA / "calibration")
MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


def shipped_table(stack: DecoderStack, max_chunk_len: int) -> tuple[torch.Tensor, int] | None:
    """The bundled table for this model, dtype and chunk length, and its segment count; None if not shipped."""
    path = SHIPPED.path_for(CalibrationKey.for_stack(stack, max_chunk_len))
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as f:
        return f.get_tensor("bias"), int(f.metadata()["segments"])


@torch.inference_mode()
def kept_overlap(stack: DecoderStack, ids: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> list[float]:
    """Per layer, Jaccard of the top-half sets that last-token logits minus each table keep. ``ids`` [T]."""
    n = ids.numel()
    hidden = stack.embed(ids)
    positions = torch.arange(n)
    rope = stack.rotary(hidden, positions)
    cache = DynamicCache()
    distance = (n - 1) - positions
    overlaps = []
    for layer in range(stack.num_layers):
        hidden, queries = stack.attention(layer, hidden, rope, cache, query_rows=1)
        raw = attention_logits(queries, cache.layers[layer].keys, stack.scaling).amax(0).float().reshape(-1)
        kept = [set((raw - t[layer][distance]).topk(n // 2).indices.tolist()) for t in tables]
        overlaps.append(len(kept[0] & kept[1]) / len(kept[0] | kept[1]))
        hidden = stack.mlp(layer, hidden)
    return overlaps


def run(name: str) -> dict:
    spec = EMBEDDED_MODELS[name]
    mcl = spec.max_chunk_len
    fp32, segments = shipped_table(DecoderStack(load_model(name, dtype=torch.float32)[0]), mcl)
    # loaded in bfloat16, not cast with ``.to``: that would cast RoPE's inverse frequencies too
    model, tokenizer = load_model(name, dtype=torch.bfloat16)
    stack = DecoderStack(model)
    start = time.perf_counter()
    shipped = shipped_table(stack, mcl)
    if shipped is None:
        bf16 = compute_bias(stack, encode(tokenizer, bundled_text("northangerabbey")), mcl, segments)
        SHIPPED.save(CalibrationKey.for_stack(stack, mcl), bf16, segments)
    else:
        bf16 = shipped[0]
    seconds = time.perf_counter() - start if shipped is None else None
    spread = fp32.std(dim=1, keepdim=True)
    diff = (bf16 - fp32).abs()
    held_out = encode(tokenizer, bundled_text("prideprejudice"))[20_000 : 20_000 + mcl]
    overlaps = kept_overlap(stack, held_out, (fp32, bf16))
    return {
        "model": name,
        "max_chunk_len": mcl,
        "segments": segments,
        "bf16_compute_seconds": None if seconds is None else round(seconds, 1),
        "max_abs_diff": round(diff.max().item(), 4),
        "mean_abs_diff": round(diff.mean().item(), 4),
        "max_diff_over_spread": round((diff / spread).max().item(), 4),
        "mean_diff_over_spread": round((diff / spread).mean().item(), 4),
        "kept_jaccard_min": round(min(overlaps), 4),
        "kept_jaccard_mean": round(sum(overlaps) / len(overlaps), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        rows.append(run(name))
        print(json.dumps(rows[-1]), flush=True)
    out = RESULTS / "calibration_dtype.json"
    previous = {r["model"]: r for r in json.loads(out.read_text())["rows"]} if out.is_file() else {}
    previous.update({r["model"]: r for r in rows})
    report = {"cpu": torch.backends.cpu.get_cpu_capability(), "rows": list(previous.values())}
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
