"""How many of niah_multikey_2's keys can any question-agnostic cache keep at a given budget?

    .venv/bin/python research/ruler_capacity.py

niah_multikey_2's haystack is nothing but needles ("One of the special magic numbers for <key> is:
<value>."), and the question asks for one of them, drawn at random. A cache compressed without the
question can answer it only if it holds that needle's key and value tokens. Keeping the cheapest
needles first, at most ``fit`` of the ``needles`` fit in ``budget`` tokens (the same budget as
``ruler.py``: the prompt's context tokens / ratio), so no token selection, HOMER's or a press's, answers
more than ``fit / needles`` of the samples on average. Tokens are counted with the benchmark model's
tokenizer on the committed samples (``benchmarks/results/ruler_samples``); context tokens come from the plain
prefill rows of ``benchmarks/results/ruler.jsonl``. Writes ``benchmarks/results/ruler_capacity.json`` and ``.md``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # ruler
import ruler

NEEDLE = re.compile(r"One of the special magic numbers for (\S+) is: (\d+)\.")
TASK = "niah_multikey_2"
RATIOS = (4, 8, 16)


def needle_costs(document: str, tokenizer: object) -> list[int]:
    """Key + value tokens of each needle of ``document`` (as the words read inside a sentence)."""
    return [
        len(tokenizer(" " + key, add_special_tokens=False)["input_ids"])
        + len(tokenizer(" " + value, add_special_tokens=False)["input_ids"])
        for key, value in NEEDLE.findall(document)
    ]


def fit(costs: list[int], budget: int) -> int:
    """The most needles whose key and value tokens fit in ``budget`` (cheapest first)."""
    count, used = 0, 0
    for cost in sorted(costs):
        if used + cost > budget:
            break
        count, used = count + 1, used + cost
    return count


def main() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ruler.model_dir()))
    plain = {(r["length"], r["index"]): r for r in ruler.load_rows() if r["method"] == "plain" and r["task"] == TASK}
    rows = []
    for sample in (s for length in (4096, 8192, 16384, 32768) for s in ruler.SAMPLES.load(TASK, length)):
        reference = plain.get((sample.length, sample.index))
        if reference is None:
            continue
        costs = needle_costs(sample.document, tokenizer)
        tokens = reference["context_tokens"]
        row = {"length": sample.length, "index": sample.index, "context_tokens": tokens, "needles": len(costs)}
        row["key_value_tokens"] = sum(costs)
        row["plain_score"] = reference["score"]
        for r in RATIOS:
            row[f"bound_{r}x"] = fit(costs, round(tokens / r)) / len(costs)
        rows.append(row)
    out = ruler.RESULTS / "ruler_capacity"
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| tokens | samples | needles | key + value tokens | share of context | plain | "
        + " | ".join(f"bound {r}x" for r in RATIOS)
        + " |",
        "|---" * (6 + len(RATIOS)) + "|",
    ]
    for length in sorted({r["length"] for r in rows}):
        rs = [r for r in rows if r["length"] == length]

        def mean(key: str, rs: list[dict] = rs) -> float:
            return sum(r[key] for r in rs) / len(rs)

        share = sum(r["key_value_tokens"] / r["context_tokens"] for r in rs) / len(rs)
        cells = [f"{mean(f'bound_{r}x'):.2f}" for r in RATIOS]
        lines.append(
            f"| {length} | {len(rs)} | {mean('needles'):.0f} | {mean('key_value_tokens'):.0f} | {share:.2f} | "
            f"{mean('plain_score'):.2f} | " + " | ".join(cells) + " |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
