"""Passkey retrieval over a real novel: sample generation, methods, diagnostics.

A 5-digit key sits at an evenly spread depth in a haystack cut from Pride and Prejudice (a
random start per sample). Methods: ``plain`` (one full prefill, however long), ``query_aware``
and ``shared`` (HOMER). For HOMER samples we also record whether every token of the key
survived pruning into the final cache, and the answer of a plain prefill over exactly the
retained tokens (an upper bound for what merging can give).
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import asdict, dataclass

import torch
from ablations import ablation, recipe_of, split_switches
from transformers import DynamicCache

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.homer.decoding.generation import DecodeState, GenerationOptions, decode
from homer_integrations.homer.document.prompt import encode, render_layout
from homer_integrations.paths import bundled_text

INSTRUCTION = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it."
)
QUESTION = "What is the pass key? Answer with the number only."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
ANSWER_OPTIONS = GenerationOptions(max_new_tokens=12)


@dataclass
class Sample:
    document: str
    key: str
    depth: float
    tokens: int
    seed: int


def make_sample(tokenizer, tokens: int, depth: float, seed: int, haystack: str | None = None) -> Sample:
    """A document of about ``tokens`` tokens with the needle at ``depth`` (0 = start, 1 = end)."""
    rng = random.Random(seed)
    text = haystack or bundled_text("prideprejudice")
    key = str(rng.randint(10000, 99999))
    needle = NEEDLE.format(key=key)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    body = tokens - len(tokenizer(needle, add_special_tokens=False)["input_ids"])
    start_tok = rng.randint(0, len(offsets) - body - 1)
    start, end = offsets[start_tok][0], offsets[start_tok + body][0]
    hay = text[start:end]
    cut = int(len(hay) * depth)
    # Put the needle at a sentence boundary near the requested depth.
    boundary = hay.rfind(". ", 0, cut)
    cut = boundary + 1 if boundary > 0 and cut - boundary < 400 else cut
    return Sample(hay[:cut] + needle + hay[cut:], key, depth, tokens, seed)


def parse_key(answer: str) -> str | None:
    m = re.search(r"\d{5}", answer)
    return m.group(0) if m else None


def key_token_indices(tokenizer, document: str, key: str) -> list[int]:
    """Document token indices covering the first occurrence of the key in the needle."""
    enc = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
    start = document.index(f"pass key is {key}") + len("pass key is ")
    end = start + len(key)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end and b > start]


@torch.inference_mode()
def plain_answer(engine: HomerModel, prefix: str, document_ids: torch.Tensor, suffix: str, continuation: str) -> str:
    """Greedy answer of one full prefill of prefix + document + suffix + continuation."""
    ids = torch.cat(
        [
            encode(engine.tokenizer, prefix, first=True),
            document_ids,
            encode(engine.tokenizer, suffix),
            encode(engine.tokenizer, continuation),
        ]
    )
    state = DecodeState()
    return "".join(decode(engine.model, engine.tokenizer, DynamicCache(), ids, 0, ANSWER_OPTIONS, state))


def run_sample(engine: HomerModel, method: str, sample: Sample, diagnostics: bool = True) -> dict:
    """Answer one sample with ``method`` (plain / query_aware / shared) and score it."""
    tok = engine.tokenizer
    t0 = time.perf_counter()
    row = {"method": method, "tokens": sample.tokens, "depth": sample.depth, "seed": sample.seed, "key": sample.key}
    if method == "plain":
        lay = render_layout(tok, QUESTION, engine.config.document_suffix, False, engine.config.system_prompt)
        answer = plain_answer(engine, lay.prefix, encode(tok, sample.document), lay.suffix, lay.continuation)
    else:
        stream = engine.run(sample.document, QUESTION, **ANSWER_OPTIONS.model_dump())
        answer = stream.text()
        if diagnostics:
            lay = engine.prompting.layout(QUESTION)
            doc, *_ = engine.compress_span(
                lay.prefix, sample.document, lay.suffix, question=QUESTION if method == "query_aware" else None
            )
            kept = set(doc.origin.tolist())
            needed = key_token_indices(tok, sample.document, sample.key)
            row["key_survived"] = all(i in kept for i in needed)
            row["cache_tokens"] = doc.num_tokens
            doc_ids = encode(tok, sample.document)
            retained = doc_ids[doc.origin[doc.origin >= 0].sort().values]
            ub = plain_answer(engine, lay.prefix, retained, lay.suffix, lay.continuation)
            row["retained_plain_correct"] = parse_key(ub) == sample.key
    row["seconds"] = time.perf_counter() - t0
    row["answer"] = answer
    row["correct"] = parse_key(answer) == sample.key
    return row


def engine_for(model, tokenizer, name: str, mode: str, scoring: str | None = None, **settings) -> HomerModel:
    """An engine for one variant: ``settings`` (``HomerConfig`` fields, and research switches by their old
    names, ``ablations.recipe_of``) and, optionally, a named scoring ablation."""
    fields, switches = split_switches(settings)
    cfg = HomerConfig(mode=mode, system_prompt=INSTRUCTION, **fields)
    ablated = None if scoring is None else ablation(scoring)
    recipe = recipe_of(ablated, **switches)
    return HomerModel(model, tokenizer, cfg, model_name=name, progress=False, recipe=recipe)


__all__ = ["Sample", "asdict", "engine_for", "make_sample", "run_sample"]
