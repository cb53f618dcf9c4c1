"""Probe: does a prefill with nothing cached run faster as one attention block than in 1,024-row blocks?

``DecoderStack.attention`` splits its rows into blocks (``ATTENTION_ROWS``, 1,024 on a CPU); every block
after the first attends to the rows before it under an explicit mask, and SDPA then computes the whole
rectangle [rows, past + rows], masked half included. Rows with nothing cached need no mask (SDPA's causal
flag), so since 2026-12-03 they run as one block of up to ``ACCELERATOR_ROWS``. Setting that constant to 0
brings the blocks back, which this probe does in turn with the new rule, on the same process and model:
four whole-book questions through the default per-question path (Northanger Abbey, a 2,048-token re-read,
Qwen2.5-Coder-1.5B in bfloat16, 2 threads), each with both rules in alternating order, and a ``full``
prefill of a 28,000-character stretch of the book after each (a different stretch each time: the
document cache would serve a repeat). Writes ``benchmarks/results/attention_blocks.json``.

    .venv/bin/python research/attention_blocks.py
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from homer_integrations import HomerModel
from homer_integrations.homer.model import decoder
from homer_integrations.homer.reading.budget import ReadBudget
from homer_integrations.homer.reading.strategies import AutoReplay, PassageReplay
from homer_integrations.paths import bundled_text

OUT = Path(__file__).parents[1] / "benchmarks" / "results" / "attention_blocks.json"
QUESTIONS = [
    "Who advanced Catherine the money for her journey home?",
    "How many children were there in the Morland family?",
    "What trees made the gloomy grove along Eleanor's favourite walk?",
    "From which town were the Light Dragoons called up?",
]
RULES = {"one block": 8192, "blocks": 0}  # decoder.ACCELERATOR_ROWS: 0 turns the one-block rule off


def main() -> None:
    torch.set_num_threads(2)
    engine = HomerModel.from_pretrained("qwen2.5-coder-1.5b-instruct", dtype="bfloat16", store=False)
    replay = AutoReplay(PassageReplay(budget=ReadBudget(tokens=2048)))
    engine.tiers.recipe = replace(engine.tiers.recipe, replay=replay)
    book = bundled_text("northangerabbey")
    ttft: dict[str, list[float]] = {name: [] for name in RULES}
    full: dict[str, list[float]] = {name: [] for name in RULES}
    answers: dict[str, list[str]] = {}
    for i, question in enumerate(QUESTIONS):
        order = list(RULES) if i % 2 == 0 else list(RULES)[::-1]
        for name in order:
            decoder.ACCELERATOR_ROWS = RULES[name]
            stream = engine.run(book, question, mode="query_aware", max_new_tokens=8)
            answers.setdefault(question, []).append(stream.text())
            ttft[name].append(round(stream.info.time_to_first_token or 0.0, 2))
            stretch = book[100_000 + i * 60_000 + (30_000 if name == "blocks" else 0) :][:28_000]
            started = time.perf_counter()
            engine.compress(stretch, mode="full")
            full[name].append(round(time.perf_counter() - started, 2))
            print(name, ttft[name][-1], full[name][-1], repr(answers[question][-1]), flush=True)
    result = {
        name: {"ttft_seconds": ttft[name], "ttft_median": statistics.median(ttft[name]), "full_seconds": full[name]}
        for name in RULES
    }
    result["same_answers"] = all(len(set(a)) == 1 for a in answers.values())
    OUT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
