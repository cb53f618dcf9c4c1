"""Which leaf layer and which reduction should pick a question's tokens? Offline study on RULER samples.

    .venv/bin/python research/question_layers.py record --tasks niah_multikey_2 qa_1 --indices 10 11 12
    .venv/bin/python research/question_layers.py simulate

The per-question path (``replay="recompute"``) keeps the ``final_cache_len`` best document tokens of
all leaves by the question's attention in the last leaf layer, then re-reads them with a plain prefill;
what it answers wrong at 4k was never kept (``ruler_trace.py``). ``record`` runs the package's
query-aware compression of a RULER sample with a scorer that also writes down, for every leaf and every
leaf layer, each head's most attention from any suffix row to each token (``[layers, heads, T]``,
``benchmarks/results/question_layers/<task>_<length>_<index>.pt``, not committed). ``simulate`` replays selection
rules on those records without the model (which layer or layers, max or mean over heads, which units)
and reports how often each rule keeps every reference value's tokens
(``benchmarks/results/question_layers_<length>.json``).
A rule is ``layers/heads/units``: ``last`` (the package), ``L<i>`` one leaf layer, ``zmax``/``zmean``
every leaf layer's standardised scores; ``stmt`` the sentence bonus over statements (the recipe before
2026-11-26), ``stmt_max`` a statement's best score, ``mix=w`` its best plus w x its mean (the package since
2026-11-26 with w=4), ``word`` a word's, ``none`` single tokens.
Indices 10-19 are the tuning split (``ruler_tasks.TUNING``; ``ruler.py`` never reports them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # ruler, ruler_tasks
import ruler
import ruler_tasks
from ruler_trace import value_and_line

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.prompt import unit_ids
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.scoring.scorers import QuestionAttentionScorer, ScoreInput
from homer_integrations.homer.scoring.units import pool_words

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks
RECORDS = RESULTS / "question_layers"
TAPE: list[torch.Tensor] = []


@dataclass(frozen=True)
class RecordingScorer(QuestionAttentionScorer):
    """The package's question scorer (last leaf layer decides) that also tapes every layer's [H, T]."""

    tape: list[torch.Tensor] = field(default_factory=lambda: TAPE, compare=False, repr=False)

    def scores_at(self, layer: int, layers: range) -> bool:
        return True

    def __call__(self, x: ScoreInput) -> torch.Tensor:
        rows, keys = x.queries.shape[2], x.keys.shape[2]
        heads, kv_heads = x.queries.shape[1], x.keys.shape[1]
        q = x.queries[0].float().view(kv_heads, heads // kv_heads, rows, -1)
        logits = torch.einsum("hgrd,hkd->hgrk", q, x.keys[0].float()) * x.scaling
        future = torch.arange(keys)[None, :] > torch.arange(keys - rows, keys)[:, None]
        probs = logits.masked_fill(future, float("-inf")).softmax(-1).amax(2).reshape(heads, keys)
        self.tape.append(probs.half())
        return probs.amax(0).clamp(min=1e-12).log()


def record(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    RECORDS.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(ruler.MODEL)
    for task in args.tasks:
        samples = ruler_tasks.make_samples(task, args.length, max(args.indices) + 1, str(ruler.model_dir()))
        for sample in (s for s in samples if s.index in args.indices):
            out = RECORDS / f"{task}_{args.length}_{sample.index}.pt"
            if out.is_file():
                continue
            probe = HomerModel(model, tok, HomerConfig(), model_name=ruler.MODEL, progress=False)
            config = ruler.sample_config(probe, sample, args.ratio, mode="query_aware")
            budget = config.final_cache_len
            engine = HomerModel(model, tok, config, model_name=ruler.MODEL, progress=False)
            scoring = engine.tiers.question_scoring
            engine.tiers.question_scoring = replace(scoring, scorer=RecordingScorer())
            prompt = ruler.homer_prompt(engine, sample, "query_aware")
            TAPE.clear()
            doc = engine.compress_span(
                prompt.prefix, sample.document, prompt.suffix, question=sample.question.lstrip(), mode="query_aware"
            ).document
            text = sample.document
            offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            tier, _ = engine.tiers.leaf_tier(prompt.prefix, text)
            plan = tier.plan
            P = plan.prefix_len
            per_leaf = len(TAPE) // plan.num_leaves
            leaves = []
            for index in range(plan.num_leaves):
                span = plan.piece(index)
                tape = torch.stack(TAPE[index * per_leaf : (index + 1) * per_leaf])  # [L, H, T]
                leaves.append({"start": span.start, "probs": tape[:, :, P : P + span.stop - span.start]})
            torch.save(
                {
                    "task": task,
                    "index": sample.index,
                    "budget": budget,
                    "doc_budget": int((doc.origin >= 0).sum()),
                    "kept": doc.origin[doc.origin >= 0],
                    "statements": unit_ids(tok, text, "statement"),
                    "words": unit_ids(tok, text, "word"),
                    "spans": [value_and_line(text, offsets, v) for v in sample.outputs],
                    "leaves": leaves,
                },
                out,
            )
            print(f"{out.name}: {plan.num_leaves} leaves x {per_leaf} layers, budget {budget}", flush=True)


Rule = Callable[[dict, torch.Tensor], torch.Tensor]
"""(record, one leaf's probs [L, H, n]) -> that leaf's scores [n] (higher is kept)."""


def layer_heads(layers: str, heads: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def reduce(probs: torch.Tensor) -> torch.Tensor:
        p = probs.float()
        p = p.amax(1) if heads == "max" else p.mean(1)  # [L, n]
        logp = p.clamp(min=1e-12).log()
        if layers == "last":
            return logp[-1]
        if layers.startswith("L"):
            return logp[int(layers[1:])]
        z = torch.stack([standardise(row, torch.ones_like(row, dtype=torch.bool)) for row in logp])
        if layers == "zmax":
            return z.amax(0)
        if layers == "zmean":
            return z.mean(0)
        start = int(layers.split(":")[0])
        return z[start:].mean(0)

    return reduce


def units(raw: torch.Tensor, rec: dict, start: int, how: str) -> torch.Tensor:
    n = raw.numel()
    every = torch.ones(n, dtype=torch.bool)
    if how == "none":
        return raw
    if how == "word":
        return pool_words(raw, every, rec["words"][start : start + n])
    statements = rec["statements"][start : start + n]
    if how == "stmt_max":
        return pool_words(raw, every, statements)
    if how.startswith("mix="):  # a statement's best plus w x its mean (both standardised)
        means = pool_words(raw, every, statements, reduce="mean")
        best = pool_words(raw, every, statements)
        return standardise(best, every) + float(how[4:]) * standardise(means, every)
    weight = float(how.split("=")[1]) if "=" in how else 4.0
    means = pool_words(raw, every, statements, reduce="mean")
    return standardise(raw, every) + weight * standardise(means, every)


def select(rec: dict, rule: Callable[[torch.Tensor], torch.Tensor], how: str) -> set[int]:
    """The document tokens a flat selection by ``rule`` keeps: per-leaf standardised, best overall."""
    scores, origin = [], []
    for leaf in rec["leaves"]:
        n = leaf["probs"].shape[2]
        s = units(rule(leaf["probs"]), rec, leaf["start"], how)
        scores.append(standardise(s.float(), torch.ones(n, dtype=torch.bool)))
        origin.append(torch.arange(leaf["start"], leaf["start"] + n))
    s, o = torch.cat(scores), torch.cat(origin)
    return set(o[s.topk(min(rec["doc_budget"], s.numel())).indices].tolist())


def simulate(args: argparse.Namespace) -> None:
    records = [torch.load(p) for p in sorted(RECORDS.glob(f"*_{args.length}_*.pt"))]
    rules = [(lay, heads, how) for lay in args.layers for heads in ("max", "mean") for how in args.units]
    results = []
    for lay, heads, how in rules:
        rule = layer_heads(lay, heads)
        per_task: dict[str, list[float]] = {}
        for rec in records:
            kept = select(rec, rule, how)
            whole = [all(i in kept for i in value) for value, _ in rec["spans"]]
            per_task.setdefault(rec["task"], []).append(sum(whole) / len(whole))
        row = {t: round(sum(v) / len(v), 2) for t, v in per_task.items()}
        row["mean"] = round(sum(row.values()) / len(row), 3)
        results.append({"rule": f"{lay}/{heads}/{how}", **row})
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec["task"]] = counts.get(rec["task"], 0) + 1
    results.sort(key=lambda r: -r["mean"])
    out = RECORDS.parent / f"question_layers_{args.length}.json"
    out.write_text(json.dumps({"samples": counts, "rules": results}, indent=1) + "\n")
    for row in results:
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--tasks", nargs="+", default=["niah_multikey_2", "qa_1"])
    rec.add_argument("--indices", type=int, nargs="+", default=list(range(10, 20)))
    rec.add_argument("--length", type=int, default=4096)
    rec.add_argument("--ratio", type=float, default=4.0)
    rec.add_argument("--threads", type=int, default=1)
    sim = sub.add_parser("simulate")
    sim.add_argument("--length", type=int, default=4096)
    sim.add_argument("--layers", nargs="+", default=["last", "zmax", "zmean", "L6", "L9", "L12", "L15"])
    sim.add_argument("--units", nargs="+", default=["stmt", "stmt_max", "word", "none"])
    args = parser.parse_args()
    record(args) if args.command == "record" else simulate(args)


if __name__ == "__main__":
    main()
