"""Probe: plain prefill with RoPE scaling (YaRN) over the first part of a novel, asked the whole-book questions.

    .venv/bin/python research/yarn_prefill_qa.py [--book northangerabbey] [--tokens 65536] [--split heldout]

Issue 65's baseline "plain prefill with RoPE scaling where it fits in memory and time". On this machine a
whole novel's prefill would take about two hours (``yarn_prefill_cost.py``), so this probe prefills the
first ``tokens`` tokens (twice Qwen2.5's 32k window at the default) of the book with its invented facts
inserted, once, into one ``DynamicCache`` with Qwen2.5-Coder-1.5B in bfloat16 and YaRN at factor 4, inside
the engine's own ``full``-mode message. Each question whose evidence lies in that part is then asked after
the cached document: the cache is cropped back to the document, the question's suffix runs, and up to
``max_new_tokens`` tokens are decoded greedily. Rows go to ``benchmarks/results/yarn_prefill_rows.jsonl``;
the summary compares them with ``whole_book.py``'s rows of the per-question path and the retrieval route
on the same questions (a different part of the book for those: the whole of it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from whole_book import ROWS, book_with_facts, peak_rss_mb

from homer_integrations import HomerModel
from homer_integrations.engine.loading import QWEN25_CODER_15B, converted_dir, load_embedded

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "yarn_prefill_rows.jsonl"


def yarn_model(factor: float = 4.0) -> AutoModelForCausalLM:
    """Qwen2.5-Coder-1.5B in bfloat16 with YaRN RoPE scaling by ``factor`` (static, as transformers applies it)."""
    path = converted_dir(QWEN25_CODER_15B, torch.bfloat16)
    config = AutoConfig.from_pretrained(path)
    window = config.max_position_embeddings
    config.rope_parameters = {
        **config.rope_parameters,
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": window,
    }
    config.max_position_embeddings = int(factor * window)
    return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.bfloat16).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="northangerabbey")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--split", default="heldout", choices=("tuning", "heldout", "all"))
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _, tokenizer = load_embedded(QWEN25_CODER_15B, torch.bfloat16)
    model = yarn_model()
    engine = HomerModel(model, tokenizer)  # only its message around a document (``layout``)
    text, items = book_with_facts(args.book)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    prefix_ids = tokenizer(engine.layout("", "full").prefix, add_special_tokens=False).input_ids
    kept = args.tokens - len(prefix_ids)
    document_ids = encoded.input_ids[:kept]
    covered = encoded.offset_mapping[len(document_ids) - 1][1]  # characters of the book in the cache
    asked = [i for i in items if (args.split == "all" or i.split == args.split) and i.depth * len(text) < covered - 500]
    print(f"{args.book}: {len(document_ids):,} of {len(encoded.input_ids):,} tokens ({covered / len(text):.0%} of the "
          f"text), {len(asked)} questions", file=sys.stderr)  # fmt: skip
    ids = torch.tensor([prefix_ids + document_ids])
    cache = DynamicCache()
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, ids.shape[1], args.chunk):
            model(ids[:, start : start + args.chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
            print(f"prefilled {start + args.chunk:,} tokens, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    prefill_seconds = time.perf_counter() - started
    length = cache.get_seq_length()
    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops])
    rows: Path = args.rows
    done = {(r["id"], r["tokens"]) for r in map(json.loads, rows.open())} if rows.exists() else set()
    for item in asked:
        if (item.id, int(ids.shape[1])) in done:
            continue
        layout = engine.layout(item.question, "full")
        suffix = torch.tensor([tokenizer(layout.suffix + layout.continuation, add_special_tokens=False).input_ids])
        if cache.get_seq_length() > length:
            cache.crop(length - cache.get_seq_length())  # a negative count: the tokens to drop from the end
        began = time.perf_counter()
        answer: list[int] = []
        with torch.inference_mode():
            logits = model(suffix, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            ttft = time.perf_counter() - began
            while len(answer) < args.max_new_tokens:
                token = int(logits[0, -1].argmax())
                if token in stops:
                    break
                answer.append(token)
                logits = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits
        text_answer = tokenizer.decode(answer, skip_special_tokens=True)
        row = {
            "model": QWEN25_CODER_15B.name,
            "book": args.book,
            "method": "prefill_yarn",
            "tokens": int(ids.shape[1]),
            "id": item.id,
            "kind": item.kind,
            "split": item.split,
            "depth": round(item.depth, 4),
            "question": item.question,
            "answer": text_answer,
            "correct": bool(item.check(text_answer)),
            "ttft_seconds": round(ttft, 2),
            "seconds": round(time.perf_counter() - began, 2),
            "prefill_seconds": round(prefill_seconds),
            "peak_rss_mb": round(peak_rss_mb()),
        }
        with rows.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{'ok' if row['correct'] else '--'} {item.id} ttft {ttft:.1f}s: {text_answer.strip()[:80]!r}",
            file=sys.stderr,
        )
    summarize(args.book, rows, int(ids.shape[1]))


def summarize(book: str, rows: Path, tokens: int) -> None:
    """Right answers of ``prefill_yarn`` and of the whole-book methods on the questions each shares with it."""
    mine = {r["id"]: r for r in map(json.loads, rows.open()) if r["book"] == book and r["tokens"] == tokens}
    others: dict[str, dict[str, bool]] = {}
    for r in map(json.loads, ROWS.open()):
        if r["book"] == book and r["id"] in mine and r.get("dtype") == "bfloat16" and r.get("budget") == 2048:
            others.setdefault(r["method"], {})[r["id"]] = r["correct"]
    for method, right in sorted(others.items()):
        shared = sorted(right)
        print(f"{method}: {sum(right.values())}/{len(shared)}; prefill_yarn on those: "
              f"{sum(mine[i]['correct'] for i in shared)}/{len(shared)}")  # fmt: skip
    print(f"prefill_yarn: {sum(r['correct'] for r in mine.values())}/{len(mine)}")


if __name__ == "__main__":
    main()
