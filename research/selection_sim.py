"""Which whole-document selection keeps the facts? Offline replays of the flat shared root's choice.

    .venv/bin/python research/selection_sim.py record --tokens 16000 --seeds 3000 3001 3002
    .venv/bin/python research/selection_sim.py simulate --tokens 16000 --seeds 3000 3001 3002

``record`` runs the default shared compression (reconstruction probe, flat root) of a two_tier sample
with every score unit stripped, and keeps each leaf's raw standardised probe scores [n] (one array
per document token) with the document's word and sentence unit ids and the facts' token spans
(``benchmarks/results/selection_scores/<tokens>_<seed>.pt``; not committed, ~0.3 MB each).

``simulate`` replays selection rules on those scores without the model: the previous default (max-pool
over 3 tokens, word units, per-leaf standardisation, the best ``final_cache_len`` document tokens of the
whole document), variants (per-leaf quota, wider pools, sentence units) and the sentence bonus the
package now uses (``SentenceBonus``: a token's standardised score plus 4x its sentence's mean).
``--question-aware`` records and replays the per-question flat path instead (each question in the
suffix, the last-token scorer, ``replay="flat"``; one record per question), with rules that add the
shared root's scores of the same document. Per rule and fact: is the value kept whole, and what
fraction of the fact's sentence is kept. Retention is necessary, not sufficient (see two_tier's
trace); the winners are then run for real by ``two_tier.py``. Seeds 3000+ are the tuning split;
two_tier's seeds 2000+ stay held out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # two_tier
from two_tier import FACTS, engine_for, make_sample, value_tokens

from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.prompt import encode, unit_ids
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.scoring.units import pool_words

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks
SCORES = RESULTS / "selection_scores"
MODEL = "qwen2.5-coder-0.5b-instruct"


def record(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    SCORES.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(MODEL)
    for seed in args.seeds:
        out = SCORES / f"{args.tokens}_{seed}{'_q' if args.question_aware else ''}.pt"
        if out.is_file():
            continue
        sample = make_sample(tok, args.tokens, seed)
        engine, _ = engine_for("per_question_flat" if args.question_aware else "shared_recon_flat", model, tok, MODEL)
        # the same switches, scoring without units (its with_question() prunes for questions)
        recipe = replace(engine.recipe, scoring=replace(engine.tiers.scoring, units=()), question_scoring=None)
        engine = type(engine)(model, tok, engine.config, model_name=MODEL, progress=False, recipe=recipe)
        ids = encode(tok, sample.document)
        facts = []
        for (template, _, _), value in zip(FACTS, sample.answers, strict=True):
            sentence = template.format(value)
            facts.append(
                {
                    "value": value,
                    "tokens": value_tokens(tok, sample.document, value),
                    "sentence": value_tokens(tok, sample.document, sentence),
                }
            )
        asked = (
            [(q, [f]) for q, f in zip(sample.questions, facts, strict=True)] if args.question_aware else [(None, facts)]
        )
        records = []
        for question, wanted in asked:
            leaves, affixes = observe_leaves(engine)
            mode = "query_aware" if question else "shared"
            engine.compress(sample.document, question=question, mode=mode)
            leaves.sort(key=lambda leaf: int(leaf[0][0]))
            records.append(
                {
                    "n": ids.numel(),
                    "budget": engine.config.final_cache_len - affixes[0],
                    "leaves": leaves,
                    "word": unit_ids(tok, sample.document, "word"),
                    "sentence": unit_ids(tok, sample.document, "sentence"),
                    "facts": wanted,
                }
            )
        torch.save(records, out)
        print(f"recorded seed {seed}: {len(records)} compressions over {ids.numel()} tokens", flush=True)


def observe_leaves(engine) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """Lists the engine's next compressions fill with each leaf's (document indices, scores) and affix count."""
    leaves: list[tuple[torch.Tensor, torch.Tensor]] = []
    affixes: list[int] = []

    def observe(event) -> None:
        doc = event.origin[event.reducible]
        if doc.numel() and int(doc[-1] - doc[0]) + 1 == doc.numel() and event.scores.isfinite().all():
            leaves.append((doc.clone(), event.scores[event.reducible].clone()))
            affixes.append(int((~event.reducible).sum()))

    engine.tiers.prune_observer = observe
    return leaves, affixes


Rule = Callable[[dict], torch.Tensor]
"""A rule: recorded scores -> keep mask [n] over the document tokens."""


def maxpool(x: torch.Tensor, width: int) -> torch.Tensor:
    if width <= 1:
        return x
    return torch.nn.functional.max_pool1d(x[None, None], width, stride=1, padding=width // 2)[0, 0, : x.numel()]


def unit_mean(x: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """Each token's unit's mean score [n]."""
    _, inverse = torch.unique(units, return_inverse=True)
    total = torch.zeros(int(inverse.max()) + 1).scatter_add(0, inverse, x)
    count = torch.zeros_like(total).scatter_add(0, inverse, torch.ones_like(x))
    return (total / count)[inverse]


def leaf_scores(rec: dict, width: int, unit: str | None, bonus: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per leaf: (document indices, standardised scores after pooling, units and a sentence bonus)."""
    out = []
    everything = torch.ones(1, dtype=torch.bool)
    for doc, raw in rec["leaves"]:
        s = maxpool(raw.float(), width)
        if unit is not None:
            s = pool_words(s, everything.expand(s.numel()), rec[unit][doc])
        s = standardise(s, everything.expand(s.numel()))
        if bonus:
            s = s + bonus * standardise(unit_mean(raw.float(), rec["sentence"][doc]), everything.expand(s.numel()))
            s = standardise(s, everything.expand(s.numel()))  # as the flat root standardises its ranked scores
        out.append((doc, s))
    return out


def select(rec: dict, scored: list[tuple[torch.Tensor, torch.Tensor]], quota: bool) -> torch.Tensor:
    """Keep mask [n]: the best ``budget`` tokens of the document, or of each leaf in proportion to its size."""
    keep = torch.zeros(rec["n"], dtype=torch.bool)
    budget = rec["budget"]
    if quota:
        for doc, s in scored:
            k = round(budget * doc.numel() / rec["n"])
            keep[doc[s.topk(k).indices]] = True
    else:
        docs = torch.cat([d for d, _ in scored])
        scores = torch.cat([s for _, s in scored])
        keep[docs[scores.topk(budget).indices]] = True
    return keep


RULES: dict[str, Rule] = {
    "pool 3, word, global (the config's units; shared root before)": lambda r: select(
        r, leaf_scores(r, 3, "word"), quota=False
    ),
    "pool 3, word, leaf quota": lambda r: select(r, leaf_scores(r, 3, "word"), quota=True),
    "pool 1, word, global": lambda r: select(r, leaf_scores(r, 1, "word"), quota=False),
    "pool 5, word, global": lambda r: select(r, leaf_scores(r, 5, "word"), quota=False),
    "pool 9, word, global": lambda r: select(r, leaf_scores(r, 9, "word"), quota=False),
    "pool 9, word, leaf quota": lambda r: select(r, leaf_scores(r, 9, "word"), quota=True),
    "pool 1, sentence, global": lambda r: select(r, leaf_scores(r, 1, "sentence"), quota=False),
    "pool 3, word + 0.5 sentence mean, global": lambda r: select(r, leaf_scores(r, 3, "word", 0.5), quota=False),
    "pool 3, word + 1 sentence mean, global": lambda r: select(r, leaf_scores(r, 3, "word", 1.0), quota=False),
    "pool 3, word + 1 sentence mean, leaf quota": lambda r: select(r, leaf_scores(r, 3, "word", 1.0), quota=True),
    "pool 3, word + 2 sentence mean, global": lambda r: select(r, leaf_scores(r, 3, "word", 2.0), quota=False),
    "pool 1, word + 0.5 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, "word", 0.5), quota=False),
    "pool 1, word + 1 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, "word", 1.0), quota=False),
    "pool 1, word + 2 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, "word", 2.0), quota=False),
    "pool 1, token, global": lambda r: select(r, leaf_scores(r, 1, None), quota=False),
    "pool 1, token + 1 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, None, 1.0), quota=False),
    "pool 1, token + 2 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, None, 2.0), quota=False),
    "pool 1, token + 4 sentence mean, global (shared root now)": lambda r: select(
        r, leaf_scores(r, 1, None, 4.0), quota=False
    ),
    "pool 1, word + 4 sentence mean, global": lambda r: select(r, leaf_scores(r, 1, "word", 4.0), quota=False),
    "sentence mean only, global": lambda r: select(r, leaf_scores(r, 1, "word", 100.0), quota=False),
}

QUESTION_RULES: dict[str, Rule] = {
    # question-aware records only: the shared root's scores of the same document (``shared_scores``)
    "shared root's scores alone": lambda r: select(r, [(d, r["shared"][d]) for d, _ in r["leaves"]], quota=False),
    "pool 3, word + shared root's scores, global": lambda r: select(
        r, plus_shared(r, leaf_scores(r, 3, "word")), quota=False
    ),
}


def shared_scores(rec: dict) -> torch.Tensor:
    """The shared root's ranking of a document [n]: per-leaf standardised scores, the sentence bonus."""
    out = torch.zeros(rec["n"])
    for doc, s in leaf_scores(rec, 1, None, 4.0):
        out[doc] = s
    return out


def plus_shared(rec: dict, scored: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each leaf's question-aware scores plus the shared root's, standardised again per leaf."""
    return [(doc, standardise(s + rec["shared"][doc], torch.ones(s.numel(), dtype=torch.bool))) for doc, s in scored]


def simulate(args: argparse.Namespace) -> None:
    rows = []
    suffix = "_q" if args.question_aware else ""
    recs = []
    for seed in args.seeds:
        loaded = torch.load(SCORES / f"{args.tokens}_{seed}{suffix}.pt")
        if args.question_aware:
            shared = shared_scores(torch.load(SCORES / f"{args.tokens}_{seed}.pt")[0])
            loaded = [{**r, "shared": shared} for r in loaded]
        recs += loaded
    rules = {**RULES, **QUESTION_RULES} if args.question_aware else RULES
    for name, rule in rules.items():
        whole, sentence, facts = 0, 0.0, 0
        for rec in recs:
            keep = rule(rec)
            for fact in rec["facts"]:
                whole += bool(keep[fact["tokens"]].all())
                sentence += float(keep[fact["sentence"]].float().mean())
                facts += 1
        rows.append({"rule": name, "facts": facts, "value_whole": whole, "sentence_kept": sentence / facts})
        print(f"{name:45s} value whole {whole}/{facts}  sentence kept {sentence / facts:.2f}", flush=True)
        if args.verbose:
            for rec in recs:
                keep = rule(rec)
                print(
                    "   ",
                    [
                        (
                            f["value"],
                            int(keep[f["tokens"]].sum()),
                            len(f["tokens"]),
                            round(float(keep[f["sentence"]].float().mean()), 2),
                        )
                        for f in rec["facts"]
                    ],
                )
    out = RESULTS / f"selection_sim_{args.tokens}{suffix}.json"
    out.write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("record", "simulate"):
        p = sub.add_parser(name)
        p.add_argument("--tokens", type=int, default=16000)
        p.add_argument("--seeds", type=int, nargs="+", default=[3000, 3001, 3002])
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--verbose", action="store_true")
        p.add_argument("--question-aware", action="store_true", help="each question in the suffix (replay='flat')")
    args = parser.parse_args()
    {"record": record, "simulate": simulate}[args.command](args)


if __name__ == "__main__":
    main()
