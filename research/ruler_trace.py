"""Where the per-question path loses a RULER key: is the asked line kept, and what is answered?

    .venv/bin/python research/ruler_trace.py --task niah_multikey_2 --indices 10 11 \
        --variants flat:last tree:last flat:qattn flat:qattn_sent flat

Samples 10 and up are never reported by ``ruler.py`` (it runs indices 0..n-1 for n <= 10): they
are the tuning split. Each variant is ``replay[:scoring]``: ``replay`` is ``flat`` or ``tree`` (or ``shared``: the
package's question-agnostic root, no question while compressing);
``scoring`` is the package's question recipe (empty: question attention, sentence bonus over
``statement`` units, which a colon does not end), ``last`` (ablation ``question_last_token``: the
paper's last token with max-pooled word units, the package's recipe before 2026-11-25), ``last_sent``
(its scores with the sentence bonus), ``qattn`` (ablation ``question_attention`` with the recipe's
word units) or ``qattn_sent`` (question attention, sentence bonus over ``sentence`` units, which
end at a colon). One JSON line per
sample and variant: the budget, how many cached tokens are prompt (prefix and suffix, never pruned)
and how many document, each reference value's tokens and its line's (its sentence in an essay) kept
in the cache, and the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # ruler, ruler_tasks, ablations
import ruler
import ruler_tasks
from ablations import ABLATIONS, recipe_of

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.homer.scoring.chain import Scoring
from homer_integrations.homer.scoring.units import ScoreMemory, SentenceBonus


def scoring_for(name: str) -> Scoring | None:
    if not name:
        return None
    base = Scoring.default()
    if name == "last_sent":
        return replace(base, units=(SentenceBonus(), ScoreMemory()))
    ablation = {
        "last": "question_last_token",
        "qattn": "question_attention",
        "qattn_sent": "question_attention_sentences",
    }
    return ABLATIONS[ablation[name]](base)


def token_span(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (a, b) in enumerate(offsets) if a < end and b > start]


def value_and_line(text: str, offsets: list[tuple[int, int]], value: str) -> tuple[list[int], list[int]]:
    """The tokens of ``value``'s first occurrence in ``text`` and of its line (its sentence where the
    line is an essay paragraph: text between the sentence ends around it)."""
    start = text.index(value)
    line_start = max(text.rfind("\n", 0, start) + 1, text.rfind(". ", 0, start) + 2)
    ends = [i for i in (text.find("\n", start), text.find(". ", start)) if i >= 0]
    line_end = min(ends) + 1 if ends else len(text)
    return token_span(offsets, start, start + len(value)), token_span(offsets, line_start, line_end)


def answer_after(engine: HomerModel, doc: Any, prompt: ruler.Prompt, sample: Any) -> str:
    """The greedy answer to ``sample`` read from the compressed ``doc`` (the prompt's continuation fed first)."""
    options = GenerationOptions(max_new_tokens=sample.max_new_tokens)
    return engine.answerer.continue_from(doc, prompt.continuation, options).text()


def row_head(args: argparse.Namespace, sample: Any, variant: str, budget: int) -> dict[str, Any]:
    """The fields every diagnostic row of one sample and variant starts with."""
    return {
        "task": args.task,
        "length": args.length,
        "ratio": args.ratio,
        "index": sample.index,
        "variant": variant,
        "budget": budget,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="niah_multikey_2")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--indices", type=int, nargs="+", default=[10, 11])
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--variants", nargs="+", default=["flat:last", "tree:last", "flat"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(ruler.MODEL)
    generated = ruler_tasks.make_samples(args.task, args.length, max(args.indices) + 1, str(ruler.model_dir()))
    for sample in (s for s in generated if s.index in args.indices):
        probe = HomerModel(model, tok, HomerConfig(), model_name=ruler.MODEL, progress=False)
        budget = ruler.sample_config(probe, sample, args.ratio).final_cache_len
        text = sample.document
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        spans = [value_and_line(text, offsets, value) for value in sample.outputs]
        for variant in args.variants:
            replay, _, name = variant.partition(":")
            mode = "shared" if replay == "shared" else "query_aware"
            config = ruler.sample_config(probe, sample, args.ratio, mode=mode)
            recipe = recipe_of(scoring_for(name), **({} if mode == "shared" else {"replay": replay}))
            engine = HomerModel(model, tok, config, model_name=ruler.MODEL, progress=False, recipe=recipe)
            prompt = ruler.homer_prompt(engine, sample, mode)
            question = sample.question.lstrip() if mode == "query_aware" else None
            doc = engine.compress_span(prompt.prefix, text, prompt.suffix, question=question, mode=mode).document
            origin = doc.origin.tolist()
            kept = set(origin)
            answer = answer_after(engine, doc, prompt, sample)
            row = {
                **row_head(args, sample, variant, budget),
                # what the budget held: the never-pruned prompt (prefix and suffix) and the document's share
                "prompt_kept": sum(i < 0 for i in origin),
                "document_kept": sum(i >= 0 for i in origin),
                "value_kept": [f"{sum(i in kept for i in v)}/{len(v)}" for v, _ in spans],
                "line_kept": [f"{sum(i in kept for i in line)}/{len(line)}" for _, line in spans],
                "answer": answer,
                "expected": sample.outputs,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
