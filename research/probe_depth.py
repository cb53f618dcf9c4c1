"""At which leaf layer should the shared root's reconstruction probe score? A RULER diagnostic.

    .venv/bin/python research/probe_depth.py --length 4096 --ratio 4 --indices 10 11 12 13 14 \
        --tasks niah_single_2 niah_multikey_2 niah_multivalue niah_multiquery vt

The package probes the last leaf layer (``ReconstructionScorer``): the probe rows run through every
leaf layer, about as much work as the leaves themselves. Scoring at an earlier layer would stop the
probe there. For each sample every leaf runs as the shared root runs it, the probe records its score
at every leaf layer, and each reference value's best token gets, per layer, its percentile among all
the document's tokens (the flat root selects across leaves) and whether it would be inside the
document's share of the budget. Samples 10-19 are the tuning split (``ruler_tasks.TUNING``;
``ruler.py`` never reports them).
Writes ``benchmarks/results/probe_depth_<length>_<ratio>.json``. With ``--time-layer N`` it instead times one
root with the probe at the last leaf layer and at layer N, alternated in one process:

    .venv/bin/python research/probe_depth.py --time-layer 9 --tasks niah_single_2 --indices 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # ruler, ruler_tasks
import ruler
import ruler_tasks
from ruler_trace import value_and_line

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.reading.strategies import Recipe
from homer_integrations.homer.scoring.probing import probe_scores
from homer_integrations.homer.scoring.scorers import ReconstructionScorer, ScoreInput

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks


@dataclass(frozen=True)
class LayerProbe(ReconstructionScorer):
    """The package's probe at every leaf layer, keeping each layer's scores [T] in ``records``."""

    records: list = field(default_factory=list, compare=False)

    def probe_scores(self, x: ScoreInput, length: int) -> torch.Tensor:
        scores = super().probe_scores(x, length)
        self.records.append(scores)
        return scores


def layer_scores(engine: HomerModel, prompt: ruler.Prompt) -> tuple[torch.Tensor, int, int]:
    """Probe scores [Lw, N] of the N document tokens at each of the Lw leaf layers, the first leaf
    layer's index, and the prompt tokens (prefix and suffix) the budget always holds."""
    comp = engine.tiers.builder().compressor(True, query_aware=False)
    prefix_ids, doc_ids, suffix_ids = engine.prompting.encode_span(prompt.prefix, prompt.document, prompt.suffix)
    plan = ChunkPlan.build(prefix_ids.numel(), doc_ids.numel(), suffix_ids.numel(), comp.nodes.settings.max_chunk_len)
    layers = comp.nodes.schedule(plan).layers_at(0)
    prefix = comp.leaves.prefix_part(prefix_ids, layers)
    P, per_leaf = prefix_ids.numel(), []
    for leaf in range(plan.num_leaves):
        span = plan.piece(leaf)
        probe = LayerProbe(engine.tiers.scoring.scorer.prompt_ids, every_layer=True)
        part = comp.leaves.leaf_part(prefix, doc_ids[span], span.start, layers)
        cache = cache_from_tensors(part.keys, part.values)
        probe_scores(comp.nodes.stack, probe, cache, part.position_ids, doc_ids[span], layers)
        per_leaf.append(torch.stack(probe.records)[:, P:])
    return torch.cat(per_leaf, dim=1), layers.start, P + suffix_ids.numel()


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per leaf layer (and ``last``: each sample's last leaf layer, where the package probes), over the
    samples that ran it: the share of reference values inside the budget and their mean percentile."""
    per: dict[str, list[dict]] = {}
    for row in rows:
        layers = row["layers"]
        for layer, v in layers.items():
            per.setdefault(layer, []).append(v)
        per.setdefault("last", []).append(layers[max(layers, key=int)])
    return {
        layer: {
            "samples": len(vs),
            "inside": round(sum(v["inside"] for v in vs) / len(vs), 3),
            "mean_percentile": round(sum(sum(v["percentile"]) / len(v["percentile"]) for v in vs) / len(vs), 3),
        }
        for layer, vs in sorted(per.items(), key=lambda kv: (kv[0] == "last", int(kv[0]) if kv[0] != "last" else 0))
    }


def time_roots(model: Any, tok: Any, args: argparse.Namespace) -> None:
    """Seconds to compress one shared root with the probe at the last leaf layer and at ``--time-layer``,
    alternated in this process (so both see the same load); ``benchmarks/results/probe_depth_time_<length>.json``."""
    sample = ruler_tasks.make_samples(args.tasks[0], args.length, args.indices[0] + 1, str(ruler.model_dir()))[-1]
    probe = HomerModel(model, tok, HomerConfig(), model_name=ruler.MODEL, progress=False)
    prompt = ruler.homer_prompt(probe, sample, "shared")
    config = ruler.sample_config(probe, sample, args.ratio, mode="shared")
    seconds: dict[str, list[float]] = {"last": [], f"layer_{args.time_layer}": []}
    for _ in range(args.repeats):
        for name in seconds:
            scoring = None  # the package's recipe
            if name != "last":
                package = probe.tiers.scoring
                scoring = replace(package, scorer=replace(package.scorer, probe_layer=args.time_layer))
            recipe = Recipe(scoring=scoring)
            engine = HomerModel(model, tok, config, model_name=ruler.MODEL, progress=False, recipe=recipe)
            start = time.perf_counter()
            engine.compress_span(prompt.prefix, prompt.document, prompt.suffix, mode="shared")
            seconds[name].append(round(time.perf_counter() - start, 2))
            print(name, seconds[name][-1], flush=True)
    out = {
        "task": sample.task,
        "index": sample.index,
        "length": args.length,
        "ratio": args.ratio,
        "threads": args.threads,
        "seconds": seconds,
        "ratio_of_medians": round(
            statistics.median(seconds[f"layer_{args.time_layer}"]) / statistics.median(seconds["last"]), 3
        ),
    }
    path = RESULTS / f"probe_depth_time_{args.length}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["niah_single_2", "niah_multikey_2", "niah_multivalue"])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--indices", type=int, nargs="+", default=[10, 11, 12, 13, 14])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-layer", type=int, default=None, help="time the root probed there against the last")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model, tok = load_model(ruler.MODEL)
    if args.time_layer is not None:
        time_roots(model, tok, args)
        return
    rows = []
    for task in args.tasks:
        samples = ruler_tasks.make_samples(task, args.length, max(args.indices) + 1, str(ruler.model_dir()))
        for sample in (s for s in samples if s.index in args.indices):
            probe = HomerModel(model, tok, HomerConfig(), model_name=ruler.MODEL, progress=False)
            prompt = ruler.homer_prompt(probe, sample, "shared")
            config = ruler.sample_config(probe, sample, args.ratio, mode="shared")
            budget = config.final_cache_len
            engine = HomerModel(model, tok, config, model_name=ruler.MODEL, progress=False)
            scores, first, fixed = layer_scores(engine, prompt)
            offsets = tok(sample.document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) != scores.shape[1]:
                raise RuntimeError(f"{len(offsets)} offsets for {scores.shape[1]} document tokens")
            share = (budget - fixed) / scores.shape[1]  # the document's share of the budget
            values = [value_and_line(sample.document, offsets, v)[0] for v in sample.outputs]
            row = {"task": task, "index": sample.index, "share": round(share, 3), "layers": {}}
            for k, layer_score in enumerate(scores):
                pct = [float((layer_score < layer_score[v].max()).float().mean()) for v in values]
                row["layers"][str(first + k)] = {
                    "percentile": [round(p, 3) for p in pct],
                    "inside": sum(p >= 1 - share for p in pct) / len(pct),
                }
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = summarize(rows)
    out = RESULTS / f"probe_depth_{args.length}_{args.ratio:g}.json"
    out.write_text(json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
