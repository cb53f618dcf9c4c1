"""Why a passkey is lost: the key's rank under the pruning score, per layer and per tree level.

    .venv/bin/python research/pruning_trace.py --model smollm2-135m-instruct --tokens 16000 --samples 4

Two views on the same passkey samples as ``passkey.py`` (shared mode, default settings):

- ``layers``: the leaf that holds the needle, cut exactly as the engine cuts it, runs through ALL
  decoder layers; at each layer, the fraction of document words that the calibrated last-token
  score ranks above the key (0 = the key is the top word). Shows which layers could find it.
- ``levels``: the real compression, observed through ``DocumentTiers.prune_observer``: at every node
  on the key's path, the layer that scored it, the key's rank fraction among the node's document
  tokens (after word units, pooling and score memory) and whether it survived.

Writes ``benchmarks/results/pruning_trace_<model>_<tokens>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # passkey_lib
from passkey_lib import QUESTION, engine_for, key_token_indices, make_sample, run_sample

from homer_integrations import HomerModel
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.layers.nodes import PruneEvent
from homer_integrations.homer.scoring.scorers import LastTokenScorer, ScoreInput
from homer_integrations.homer.scoring.units import pool_words

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks


def rank_fraction(scores: torch.Tensor, candidates: torch.Tensor, target: int) -> float:
    """Share of ``candidates`` positions whose score beats ``scores[target]``."""
    return float((scores[candidates] > scores[target]).float().mean())


@torch.inference_mode()
def layer_ranks(engine: HomerModel, document: str, key: list[int]) -> list[float]:
    """Key-word rank fraction at every layer of the needle's leaf run through the whole model."""
    tok, stack = engine.tokenizer, engine.stack
    lay = engine.prompting.layout(QUESTION)
    prefix, suffix = encode(tok, lay.prefix, first=True), encode(tok, lay.suffix)
    doc_ids = encode(tok, document)
    words = unit_ids(tok, document, "word")
    plan = ChunkPlan.build(prefix.numel(), doc_ids.numel(), suffix.numel(), engine.config.max_chunk_len)
    span = next(plan.piece(i) for i in range(plan.num_leaves) if plan.piece(i).start <= key[0] < plan.piece(i).stop)
    ids = torch.cat([prefix, doc_ids[span], suffix])
    n_doc, P = span.stop - span.start, prefix.numel()
    reducible = torch.zeros(ids.numel(), dtype=torch.bool)
    reducible[P : P + n_doc] = True
    word_of = torch.full((ids.numel(),), -1)
    word_of[P : P + n_doc] = words[span]
    positions = torch.arange(ids.numel())
    bias = engine.tiers.calibration.bias()
    hidden = stack.embed(ids)
    rope = stack.rotary(hidden, positions)
    cache = DynamicCache()
    key_pos = P + key[0] - span.start
    first_tokens = reducible & torch.cat([torch.tensor([True]), word_of[1:] != word_of[:-1]])
    ranks = []
    for layer in range(stack.num_layers):
        hidden, query = stack.attention(layer, hidden, rope, cache, query_rows=1)
        x = ScoreInput(query, cache.layers[layer].keys, positions, reducible, layer, stack.scaling, bias[layer])
        scores = LastTokenScorer()(x).cpu()
        ranks.append(rank_fraction(pool_words(scores, reducible, word_of), first_tokens, key_pos))
        hidden = stack.mlp(layer, hidden)
    return ranks


def level_trace(engine: HomerModel, sample) -> tuple[list[dict], dict]:
    """Compress the sample for real and follow the key's first token through every pruning."""
    key = key_token_indices(engine.tokenizer, sample.document, sample.key)
    events: list[dict] = []

    def observe(e: PruneEvent) -> None:
        where = (e.origin == key[0]).nonzero()
        if where.numel():
            i = int(where[0, 0])
            events.append({"layer": e.layer, "rank": rank_fraction(e.scores, e.reducible, i), "kept": bool(e.keep[i])})

    engine.tiers.prune_observer = observe
    try:
        row = run_sample(engine, "shared", sample, diagnostics=False)
    finally:
        engine.tiers.prune_observer = None
    return events, row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=16000)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    engine = engine_for(model, tok, args.model, "shared")
    rows = []
    for i in range(args.samples):
        sample = make_sample(tok, args.tokens, (i + 0.5) / args.samples, seed=1000 + i)
        key = key_token_indices(tok, sample.document, sample.key)
        ranks = layer_ranks(engine, sample.document, key)
        events, answer = level_trace(engine, sample)
        rows.append(
            {"seed": sample.seed, "depth": sample.depth, "layer_ranks": ranks, "levels": events}
            | {k: answer[k] for k in ("answer", "correct")}
        )
        path = " -> ".join(f"L{e['layer']}:{e['rank']:.2f}{'' if e['kept'] else ' DROPPED'}" for e in events)
        print(f"depth {sample.depth:.2f}: {path}; answer {answer['answer'][:24]!r}", flush=True)
    mean = torch.tensor([r["layer_ranks"] for r in rows]).mean(0).tolist()
    print("mean key-word rank per layer (0 = top):", " ".join(f"{x:.2f}" for x in mean))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pruning_trace_{args.model}_{args.tokens}.json"
    summary = {"model": args.model, "tokens": args.tokens, "mean_layer_ranks": mean, "samples": rows}
    out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
