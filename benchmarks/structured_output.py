"""Structured extraction over compressed documents: schema-valid rate and the cost of the constraint.

SmolLM2-135M (the committed result's model; ``--model`` picks another) answers 5 schemas about each of
3 documents (excerpts of the bundled novels, each compressed once by HOMER into its shared root,
``mode="shared"``, which every answer reads). Every answer is decoded twice from the same cached
document, alternating the order: under the schema (``response_format``) and unconstrained (the same
prompt, with the same JSON instruction). It records whether the constrained answer validates
against its pydantic schema, and the decoding time per generated token of both (time after the first
token divided by the tokens after it), so the ratio compares like with like even when the two answers
differ in length.

    .venv/bin/python benchmarks/structured_output.py            # 5 x 3, 128 new tokens at most
    .venv/bin/python benchmarks/structured_output.py --quick    # 2 schemas x 1 document

Writes benchmarks/results/structured_output.json (``--quick``: structured_output_quick.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, ValidationError

from homer_integrations import HomerModel
from homer_integrations.homer.decoding.constraints import ResponseFormat
from homer_integrations.paths import bundled_text

RESULTS = Path(__file__).parent / "results"
MODEL = "smollm2-135m-instruct"
"""The model of the committed result (the package's default was SmolLM2 then)."""
MODE = "shared"
"""Every answer reads the document's one compressed root, as measured (the package's default,
``query_aware``, selects again for every question: another measurement)."""


class Character(BaseModel):
    name: str = Field(description="the most important character")
    gender: Literal["female", "male"]
    is_married: bool


class Setting(BaseModel):
    place: str = Field(description="where the scene happens")
    time_of_day: Literal["morning", "afternoon", "evening", "night", "unknown"]


class People(BaseModel):
    names: list[str] = Field(description="people named in the text", max_length=5)


class Event(BaseModel):
    who: str
    what: str = Field(description="what happens, in a few words")
    mood: Literal["happy", "sad", "tense", "neutral"]


class Facts(BaseModel):
    characters_named: int = Field(ge=0, le=100, description="how many characters are named")
    mentions_money: bool
    summary: str = Field(description="one sentence")


SCHEMAS: dict[str, type[BaseModel]] = {
    "character": Character,
    "setting": Setting,
    "people": People,
    "event": Event,
    "facts": Facts,
}
QUESTION = "Extract the {name} record from the text."


def documents(tokens: int, count: int, engine: HomerModel) -> list[tuple[str, str]]:
    """``count`` excerpts of about ``tokens`` tokens from the bundled novels, far apart."""
    texts = []
    for title, start in (("prideprejudice", 0.1), ("northangerabbey", 0.3), ("prideprejudice", 0.6))[:count]:
        book = bundled_text(title)
        offset = int(len(book) * start)
        piece = book[offset : offset + tokens * 6]
        ids = engine.prompting.token_ids(piece)[:tokens]
        texts.append((f"{title}@{start}", engine.tokenizer.decode(ids)))
    return texts


def per_token(info) -> float | None:
    """Seconds per generated token after the first (the decode loop's steady cost)."""
    if info.output_tokens < 2 or info.time_to_first_token is None:
        return None
    return (info.total_seconds - info.time_to_first_token) / (info.output_tokens - 1)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    engine = HomerModel.from_pretrained(args.model, progress=False, store=False)
    docs = documents(args.tokens, 1 if args.quick else 3, engine)
    schemas = dict(list(SCHEMAS.items())[: 2 if args.quick else 5])
    rows = []
    for doc_name, text in docs:
        engine.compress(text)  # once per document; every answer below reads it from memory
        for i, (name, schema) in enumerate(schemas.items()):
            fmt = ResponseFormat.of(schema)
            question = f"{QUESTION.format(name=name)}\n{fmt.instructions()}"
            runs = {}
            order = ("constrained", "free") if i % 2 == 0 else ("free", "constrained")
            for kind in order:
                extra = {"response_format": fmt} if kind == "constrained" else {}
                stream = engine.run(text, question, mode=MODE, max_new_tokens=args.max_new_tokens, **extra)
                answer = stream.text()
                runs[kind] = (answer, stream.info)
            answer, info = runs["constrained"]
            try:
                schema.model_validate_json(answer)
                valid, error = True, None
            except ValidationError as e:
                valid, error = False, str(e).splitlines()[0]
            free_answer, free_info = runs["free"]
            try:
                schema.model_validate_json(free_answer)
                free_valid = True
            except ValidationError:
                free_valid = False
            rows.append(
                {
                    "document": doc_name,
                    "schema": name,
                    "valid": valid,
                    "error": error,
                    "finish_reason": info.finish_reason,
                    "answer": answer,
                    "tokens": info.output_tokens,
                    "seconds_per_token": per_token(info),
                    "unconstrained_valid": free_valid,
                    "unconstrained_answer": free_answer[:300],
                    "unconstrained_tokens": free_info.output_tokens,
                    "unconstrained_seconds_per_token": per_token(free_info),
                    "cache_source": info.cache_source,
                }
            )
            print(f"{doc_name:24s} {name:10s} valid={valid} {answer[:90]!r}", flush=True)
    pairs = [r for r in rows if r["seconds_per_token"] and r["unconstrained_seconds_per_token"]]
    constrained = statistics.median(r["seconds_per_token"] for r in pairs)
    free = statistics.median(r["unconstrained_seconds_per_token"] for r in pairs)
    summary = {
        "answers": len(rows),
        "schema_valid": sum(r["valid"] for r in rows),
        "schema_valid_rate": sum(r["valid"] for r in rows) / len(rows),
        "unconstrained_schema_valid_rate": sum(r["unconstrained_valid"] for r in rows) / len(rows),
        "median_seconds_per_token_constrained": constrained,
        "median_seconds_per_token_unconstrained": free,
        "decode_time_ratio": constrained / free,
        "total_answer_seconds_ratio": sum(r["tokens"] * r["seconds_per_token"] for r in pairs)
        / sum(r["tokens"] * r["unconstrained_seconds_per_token"] for r in pairs),
    }
    return {
        "model": engine.model_name,
        "mode": MODE,
        "document_tokens": args.tokens,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "summary": summary,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help=f"embedded name, path or hub id (default: {MODEL})")
    parser.add_argument("--tokens", type=int, default=1500, help="tokens per document")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    result = run(args)
    result["wall_seconds"] = time.perf_counter() - started
    out = RESULTS / ("structured_output_quick.json" if args.quick else "structured_output.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
