"""The direct ``HomerModel`` baseline that adapter-overhead benchmarks compare against.

Framework-free: one compression then cached answers straight on the engine, on a fresh
document cache over an already loaded model; the excerpt, the options, the alternating rounds
and the JSON result. An adapter benchmark supplies only how its side answers the questions
(``compare_with_direct``).

Both sides answer from the document's shared root (``mode="shared"``: compressed once, every question
read from it) on SmolLM2-135M unless ``--model`` names another, as the committed results were measured
(those were the package's defaults then; its ``query_aware`` default would replay a selection per question).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.paths import bundled_excerpt

QUESTIONS = (
    "Who has taken Netherfield Park?",
    "What does Mrs. Bennet want for her daughters?",
    "Who is Mr. Darcy?",
    "What happens at the ball?",
    "Which sister is the most beautiful?",
)
"""The five questions every overhead benchmark asks, so their ratios compare."""
MODEL = "smollm2-135m-instruct"
"""The model of the committed overhead results."""
MODE = "shared"
"""The mode both sides answer in: the engine's configured mode, which the adapters follow too."""


def fresh_engine(base: HomerModel) -> HomerModel:
    """A new engine with an empty document cache over ``base``'s loaded model and settings."""
    return HomerModel(base.model, base.tokenizer, base.config, model_name=base.model_name, progress=False)


def warm_up(engine: HomerModel) -> None:
    """One tiny generation, so neither side pays first-call costs."""
    engine.answerer.generate(
        engine.prompting.chat_prompt([{"role": "user", "content": "Hello"}]), max_new_tokens=2
    ).text()


def ask_each(
    engine: HomerModel,
    questions: Sequence[str],
    ask: Callable[[str], tuple[str, dict[str, Any]]],
    seconds_key: str,
    *,
    started: float | None = None,
    before: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ask the questions in turn, timing each: one side's record of a round.

    ``ask(question)`` returns the answer and that question's extra fields. The record holds
    ``total_seconds`` (since ``started``, default now), the ``before`` fields, each question's
    seconds under ``seconds_key``, each extra field as a list, ``engine``'s compressions and the answers.
    """
    started = time.perf_counter() if started is None else started
    answers: list[str] = []
    seconds: list[float] = []
    extras: dict[str, list[Any]] = {}
    for question in questions:
        t = time.perf_counter()
        answer, fields = ask(question)
        seconds.append(time.perf_counter() - t)
        answers.append(answer)
        for name, value in fields.items():
            extras.setdefault(name, []).append(value)
    return {
        "total_seconds": time.perf_counter() - started,
        **(before or {}),
        seconds_key: seconds,
        **extras,
        "compressions": engine.document_cache.stats().computations,
        "answers": answers,
    }


def run_direct(base: HomerModel, text: str, questions: Sequence[str], max_new_tokens: int) -> dict[str, Any]:
    """Compress ``text`` once on a fresh engine, then answer each question from the compressed document."""
    engine = fresh_engine(base)
    started = time.perf_counter()
    doc = engine.compress(text)
    compress_seconds = time.perf_counter() - started

    def ask(question: str) -> tuple[str, dict[str, Any]]:
        stream = engine.run(doc, question, mode=MODE, max_new_tokens=max_new_tokens)
        return stream.text(), {"output_tokens": stream.info.output_tokens}

    before = {"compress_seconds": compress_seconds}
    return ask_each(engine, questions, ask, "answer_seconds", started=started, before=before)


def machine(engine: HomerModel) -> dict[str, Any]:
    """Where the numbers were measured."""
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "device": str(engine.model.device),
        "dtype": str(engine.model.dtype),
    }


def overhead_options(description: str, out: Path) -> argparse.Namespace:
    """The options every overhead benchmark takes (document length, model, answer length, rounds, output)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", type=int, default=16_000, help="document length in model tokens")
    parser.add_argument("--model", default=MODEL, help=f"local path, hub id or embedded name (default: {MODEL})")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per side; the fastest counts")
    parser.add_argument("--out", type=Path, default=out, help=f"where the JSON result goes (default {out})")
    return parser.parse_args()


AdapterRun = Callable[[HomerModel, str, int], dict[str, Any]]


def compare_with_direct(
    name: str,
    run_adapter: AdapterRun,
    questions: Sequence[str],
    options: argparse.Namespace,
    target: float,
    extra: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Alternate direct and adapter rounds on one loaded model; write and return the JSON result.

    ``run_adapter(base, text, max_new_tokens)`` answers ``questions`` through the adapter on its
    own fresh engine and returns at least ``total_seconds`` and ``compressions``. ``extra(rounds)``
    adds fields to the result (after the target), also printed in the summary line.
    """
    base = HomerModel.from_pretrained(options.model, config=HomerConfig(mode=MODE), progress=False)
    text = bundled_excerpt(base.tokenizer, options.tokens)
    warm_up(base)
    rounds: list[dict[str, Any]] = []
    for i in range(options.rounds):
        direct = run_direct(base, text, questions, options.max_new_tokens)
        adapter = run_adapter(base, text, options.max_new_tokens)
        rounds.append({"direct": direct, name: adapter})
        print(
            f"round {i + 1}: direct {direct['total_seconds']:.1f}s (compress {direct['compress_seconds']:.1f}s), "
            f"{name} {adapter['total_seconds']:.1f}s; compressions {direct['compressions']} / "
            f"{adapter['compressions']}",
            flush=True,
        )
    fastest = {side: min(r[side]["total_seconds"] for r in rounds) for side in ("direct", name)}
    ratio = fastest[name] / fastest["direct"]
    added = extra(rounds) if extra else {}
    result = {
        "benchmark": f"{name}_overhead",
        "model": base.model_name,
        "document_tokens": base.prompting.count_tokens(text),
        "max_chunk_len": base.config.max_chunk_len,
        "questions": len(questions),
        "max_new_tokens": options.max_new_tokens,
        "rounds": rounds,
        "direct_seconds": fastest["direct"],
        f"{name}_seconds": fastest[name],
        "ratio": ratio,
        "target_ratio": target,
        "meets_target": ratio <= target,
        **added,
        "machine": machine(base),
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    extras = "".join(f"; {key.replace('_', ' ')}: {value}" for key, value in added.items())
    print(
        f"{result['document_tokens']} tokens, {len(questions)} questions: direct {fastest['direct']:.1f}s, "
        f"{name} {fastest[name]:.1f}s, ratio {ratio:.2f} (target <= {target}){extras}; wrote {options.out}"
    )
    return result
