"""Does head-wise selection (KVzip's) rescue a question-agnostic HOMER cache? RULER samples, one line each.

    .venv/bin/python research/headwise_probe.py --task niah_multikey_2 --indices 0 1 2 \
        --variants homer:4:global prefill:4:global prefill:2:global
    .venv/bin/python research/headwise_probe.py report     # benchmarks/results/headwise_probe.md

Each variant is ``base:candidates:selection``. ``base`` builds a cache of ``candidates`` x the budget's
document tokens: ``homer`` is the package's shared flat root (each leaf scores its tokens by
reconstruction, the best survive, the upper layers run over them as one node; tokens keep their leaf
positions), ``prefill`` re-reads that same selection by one plain prefill (positions 0..K-1, every
layer; with candidates >= the ratio this is a plain prefill of the whole prompt, KVzip's own input),
``prefillword`` re-reads every word that selection touched, whole (no number loses digits),
``prefillclose`` as ``prefillword`` and every statement of at most ``--close-longest`` tokens that holds
one of the ``--close-top`` share of best-scored kept tokens, whole (``close_statements``; lost:
``benchmarks/ruler_notes.md``),
``chunks`` (``chunks:W:...``, W document tokens a piece) runs each piece through every layer alone
after the prefix, at its document positions, and scores it by reconstruction of its own text (a
memory-bounded whole read; it lost: ``benchmarks/ruler_notes.md``). ``selection`` then
cuts that cache to the budget with ``homer.scoring.headwise``'s reconstruction scores per layer and head:
``uniform`` (the same count in every head), ``global`` (KVzip's one budget over all heads and layers;
the answer hides each head's padding slots from attention through a wrapped SDPA), ``globalword``
(``global`` over scores pooled per word: each head keeps a word whole or not at all),
``globalstatement`` (the same per statement: a key line whole or not at all), or ``none`` (the
candidates' cache as built, no cut). Prefix and suffix stay in every head. Reported: the answer and
RULER's score, and in how many (layer, head) pairs all of a reference value's tokens survive
(``value_cover``) and what share of them are candidates (``value_candidates``; of its line:
``line_candidates``). ``--root-unit statement`` gives the candidates' selection the sentence bonus
over statements; ``word``: each token its word's best score, no bonus; ``common`` (``--common-weight``):
the sentence bonus, then each token lowered by its word's standardised log count in the document
(``CommonWords``; lost: ``benchmarks/ruler_notes.md``); ``best``: each sentence ranked whole by its best
token plus 4x its mean (``UnitBestAndMean``, the question recipe's ranking, over sentences).
Indices 10-19 are the tuning split (``ruler_tasks.TUNING``), which ``ruler.py`` never reports; the
report keeps them apart from the reported samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # ruler, ruler_tasks, ablations
import ruler
import ruler_tasks
from ablations import RECONSTRUCTION_ABLATIONS
from ruler_trace import answer_after, row_head, value_and_line

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.builder import compressed_document
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.kv.chunk import Chunk
from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors
from homer_integrations.homer.layers.nodes import CompressionResult, Nodes
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.scoring.headwise import head_scores, keep_global, keep_per_head
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.scoring.units import ScoreUnit, pool_words
from homer_integrations.homer.tree import flat
from homer_integrations.homer.tree.compressor import HomerCompressor
from homer_integrations.homer.tree.headwise import score_candidates, select_candidates
from homer_integrations.homer.tree.recompute import prefill_kept, whole_units

OUT = ruler.RESULTS / "headwise_probe.jsonl"
REPORT = ruler.RESULTS / "headwise_probe.md"
REFERENCES = ("plain", "homer_shared", "kvzip")
"""``ruler.py``'s rows of the same samples, at the same ratio (plain: 1x), shown beside each variant."""


@contextlib.contextmanager
def hidden_slots(hidden: list[torch.Tensor] | None) -> Iterator[None]:
    """While inside, SDPA hides the cache slots ``hidden[layer]`` [Hkv, W] (True) of each layer's heads
    from every query (kvpress does the same for its KVzip with fake keys; an additive mask is exact)."""
    if hidden is None:
        yield
        return
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def masked(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        **kw: object,
    ) -> object:
        slots = hidden[module.layer_idx]
        rows, keys, heads = query.shape[2], key.shape[2], query.shape[1]
        lowest = torch.finfo(query.dtype).min
        extra = torch.zeros(1, heads, rows, keys, dtype=query.dtype, device=query.device)
        if mask is not None:  # transformers' SDPA masks are boolean (True: attend) or additive
            mask = mask[:, :, :, :keys]
            extra = extra.masked_fill(~mask, lowest) if mask.dtype == torch.bool else extra + mask
        elif rows > 1:
            causal = torch.ones(rows, keys, dtype=torch.bool, device=query.device).tril(keys - rows)
            extra = extra.masked_fill(~causal, lowest)
        per_head = slots.repeat_interleave(heads // slots.shape[0], 0).to(query.device)  # [H, W]
        width = per_head.shape[1]
        extra[0, :, :, :width] = extra[0, :, :, :width].masked_fill(per_head[:, None, :], lowest)
        return sdpa(module, query, key, value, extra, **kw)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = masked
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa


@torch.inference_mode()
def _prefill(stack: DecoderStack, ids: torch.Tensor, positions: torch.Tensor) -> tuple[list, list]:
    """Every layer over ``ids`` [T] at ``positions`` [T]: per layer keys and values [1, Hkv, T, d]."""
    cache = cache_from_tensors([], [])
    hidden = stack.embed(ids)
    rope = stack.rotary(hidden, positions)
    for layer in range(stack.num_layers):
        hidden, _ = stack.attention(layer, hidden, rope, cache)
        if layer != stack.num_layers - 1:
            hidden = stack.mlp(layer, hidden)
    return layer_tensors(cache)


def encode_chunks(
    compressor: HomerCompressor,
    prefix_ids: torch.Tensor,
    document_ids: torch.Tensor,
    suffix_ids: torch.Tensor,
    chunk_len: int,
) -> tuple[CompressionResult, torch.Tensor]:
    """The ``chunks`` base: each piece of ``chunk_len`` document tokens runs through every layer alone
    after the prefix, at its document positions (prefix [P] at 0..P-1, piece tokens at P + their
    document index; the suffix follows the last piece), and is scored by reconstruction of its own
    text after its own cache. Returns the whole dense cache and the scores [L, Hkv, T]."""
    stack, start = compressor.nodes.stack, time.perf_counter()
    P, N, S = prefix_ids.numel(), document_ids.numel(), suffix_ids.numel()
    keys: list[list[torch.Tensor]] = [[] for _ in range(stack.num_layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(stack.num_layers)]
    scores = []
    probe = prompt_ids(compressor)
    for first in range(0, N, chunk_len):
        piece = document_ids[first : first + chunk_len]
        last = first + chunk_len >= N
        tail = suffix_ids if last else suffix_ids[:0]
        ids = torch.cat([prefix_ids, piece, tail])
        positions = torch.cat([torch.arange(P), P + first + torch.arange(piece.numel() + tail.numel())])
        k, v = _prefill(stack, ids, positions)
        own = P + torch.arange(piece.numel())
        s = head_scores(stack, k, v, positions, probe, piece, own)
        keep = slice(0 if first == 0 else P, None)
        for layer in range(stack.num_layers):
            keys[layer].append(k[layer][:, :, keep])
            values[layer].append(v[layer][:, :, keep])
        scores.append(s[:, :, keep])
    positions = torch.cat([torch.arange(P + N), P + N + torch.arange(S)])
    origin = torch.cat([torch.full((P,), -1), torch.arange(N), torch.full((S,), -1)])
    plan = ChunkPlan.build(P, N, S, compressor.nodes.settings.max_chunk_len)
    result = CompressionResult(
        keys=[torch.cat(k, dim=2) for k in keys],
        values=[torch.cat(v, dim=2) for v in values],
        position_ids=positions,
        origin=origin,
        next_token_logits=None,
        plan=plan,
        schedule=compressor.nodes.schedule(plan),
        peak_kv_bytes=0,
        seconds=time.perf_counter() - start,
    )
    return result, torch.cat(scores, dim=2)


def select(
    compressor: HomerCompressor,
    built: CompressionResult,
    document_ids: torch.Tensor,
    selection: str,
    budget: int,
    scores: torch.Tensor | None = None,
    words: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """``built``'s cache cut to ``budget`` slots a head by ``selection``: keys, values, the kept slots
    [L, Hkv, W] and the padding attention must not see [L, Hkv, W] (``global`` only). ``scores``
    [L, Hkv, T]: the base's own (``chunks``) or the reconstruction probe's over ``built``.
    ``globalword`` pools them over ``words`` [T] (the word of each slot, negative on prefix and
    suffix) first, so in each head a word survives or goes whole; ``globalstatement`` over the
    statement of each slot, so a key stays in the heads that keep its value."""
    if selection == "none":
        heads = built.keys[0].shape[1]
        return built.keys, built.values, torch.arange(built.origin.numel()).expand(len(built.keys), heads, -1), None
    fixed = built.origin < 0
    if selection in ("globalword", "globalstatement"):
        scores = pool_words(scores, words >= 0, words)
    if selection in ("global", "globalword", "globalstatement"):
        return keep_global(built.keys, built.values, scores, fixed, budget)
    return (*keep_per_head(built.keys, built.values, scores, fixed, budget), None)


@dataclass(frozen=True, eq=False)
class CommonWords(ScoreUnit):
    """Lower each document token's score by ``weight`` x its word's standardised log count in the document
    (``penalty`` [N]), so the words every line shares ("One of the special magic numbers for") rank below
    the key and value they frame."""

    penalty: torch.Tensor
    weight: float

    def __call__(self, scores: torch.Tensor, chunk: Chunk, words: torch.Tensor | None) -> torch.Tensor:
        doc = chunk.reducible & (chunk.origin >= 0)
        lowered = scores.cpu().float().clone()
        lowered[doc] -= self.weight * self.penalty[chunk.origin[doc]]
        return lowered


def close_statements(
    kept: torch.Tensor, memory: torch.Tensor, statements: torch.Tensor, top: float, longest: int
) -> torch.Tensor:
    """``kept`` [K] (ascending document indices) and the whole of every statement of at most ``longest``
    tokens holding one of the ``top`` share of kept tokens by selection score ``memory`` [K]; ``statements``
    [N]: each document token's statement. The idea: a fact's value ranks high and the words naming it do
    not; on RULER the values were not among the best-scored (``benchmarks/ruler_notes.md``)."""
    cut = torch.quantile(memory[memory.isfinite()].float(), 1.0 - top)
    units = statements - statements.min()
    sizes = torch.bincount(units)
    closed = torch.zeros(sizes.numel(), dtype=torch.bool)
    closed[units[kept[memory >= cut]]] = True
    mask = (closed & (sizes <= longest))[units]
    mask[kept] = True
    return mask.nonzero()[:, 0]


@contextlib.contextmanager
def statement_closure(statements: torch.Tensor | None, top: float, longest: int) -> Iterator[dict]:
    """While inside, the flat selection's re-read (``homer.tree.flat.reread_selected``) also takes whole the
    short statements of its best-scored tokens (``close_statements``); the dict counts the tokens added."""
    added = {"tokens": 0}
    if statements is None:
        yield added
        return
    original = flat.reread_selected

    def reread_closed(
        nodes: Nodes,
        selected: Chunk,
        prefix_ids: torch.Tensor,
        document_ids: torch.Tensor,
        suffix_ids: torch.Tensor,
        plan: ChunkPlan,
        start: float,
        whole: torch.Tensor | None = None,
        extra: torch.Tensor | None = None,
    ) -> CompressionResult:
        doc = selected.origin >= 0
        order = selected.origin[doc].argsort()
        kept, memory = selected.origin[doc][order], selected.memory[doc][order]
        if whole is not None:
            kept = whole_units(kept, whole)
            memory = torch.full((kept.numel(),), float("-inf"))
            memory[torch.isin(kept, selected.origin[doc][order])] = selected.memory[doc][order]
        closed = close_statements(kept, memory, statements, top, longest)
        if extra is not None and extra.numel():
            closed = torch.cat([closed, extra.to(closed.device)]).unique()
        added["tokens"] += closed.numel() - kept.numel()
        result = prefill_kept(nodes.stack, nodes.settings, prefix_ids, document_ids, closed, suffix_ids)
        return replace(result, plan=plan, seconds=time.perf_counter() - start)

    flat.reread_selected = reread_closed
    try:
        yield added
    finally:
        flat.reread_selected = original


def word_counts(document_ids: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """How often each document token's word (its token ids) occurs in the document [N]."""
    spelled: dict[int, list[int]] = defaultdict(list)
    for token, word in zip(document_ids.tolist(), words.tolist(), strict=True):
        spelled[word].append(token)
    counts = Counter(tuple(spelling) for spelling in spelled.values())
    return torch.tensor([counts[tuple(spelled[w])] for w in words.tolist()], dtype=torch.float)


ROOT_ABLATIONS = {
    "statement": "reconstruction_statements",
    "word": "reconstruction_word_best",
    "best": "reconstruction_sentence_best_and_mean",
}
"""``--root-unit``: the ablation of the candidates' selection each value names."""


def share(tokens: list[int], candidates: torch.Tensor) -> float:
    """The share of ``tokens`` (document positions) that are among ``candidates`` [W]."""
    return round(float(torch.isin(torch.tensor(tokens), candidates).float().mean()), 3) if tokens else 0.0


def probe_samples(task: str, length: int, indices: list[int]) -> list[ruler_tasks.RulerSample]:
    """The stored samples of ``indices``, and fresh ones of those past the stored ones (the generators
    are seeded: the same index is the same sample either way)."""
    stored = {s.index: s for s in ruler.SAMPLES.load(task, length)}
    if any(i not in stored for i in indices):
        fresh = ruler_tasks.make_samples(task, length, max(indices) + 1, str(ruler.model_dir()))
        stored = {s.index: s for s in fresh} | stored
    return [stored[i] for i in sorted(set(indices))]


def prompt_ids(compressor: HomerCompressor) -> torch.Tensor:
    return torch.tensor(compressor.nodes.scoring.scorer.prompt_ids, dtype=torch.long)


def value_cover(
    origin: torch.Tensor, kept: torch.Tensor, hidden: torch.Tensor | None, values: list[list[int]]
) -> list[float]:
    """Per reference value (its document token indices), the share of (layer, head) pairs in which
    every one of its tokens survives (kept and not hidden)."""
    seen = torch.zeros((*kept.shape[:2], origin.numel()), dtype=torch.bool)
    seen.scatter_(2, kept, torch.ones_like(kept, dtype=torch.bool) if hidden is None else ~hidden)
    cover = []
    for tokens in values:
        slots = (origin[None] == torch.tensor(tokens)[:, None]).nonzero()[:, 1]
        whole = slots.numel() == len(tokens) and len(tokens) > 0
        cover.append(round(float(seen[:, :, slots].all(-1).float().mean()), 3) if whole else 0.0)
    return cover


def split(row: dict) -> str:
    return "tuning" if row["index"] in ruler_tasks.TUNING else "reported"


def report() -> str:
    """Markdown: per variant and task (and all its samples), its mean score and the references' on
    exactly its samples (count)."""
    rows = [json.loads(line) for line in OUT.read_text().splitlines() if line.strip()]
    reference = {
        (r["task"], r["length"], r["index"], r["method"], r["ratio"]): r["score"]
        for r in ruler.load_rows()
        if r["method"] in REFERENCES
    }
    lines = [
        "| split | tokens | ratio | variant | task | samples | variant | "
        + " | ".join(REFERENCES)
        + " | cache width / budget |",
        "|---|---|---|---|---|---|---|" + "---|" * len(REFERENCES) + "---|",
    ]
    groups = {(split(r), r["length"], r["ratio"], r["variant"], task) for r in rows for task in (r["task"], "all")}
    for key in sorted(groups, key=lambda k: (k[:4], k[4] == "all", k[4])):
        mine = [
            r
            for r in rows
            if (split(r), r["length"], r["ratio"], r["variant"]) == key[:4] and key[4] in (r["task"], "all")
        ]
        cells = []
        for method in REFERENCES:
            ratio = 1.0 if method == "plain" else key[2]
            found = [reference.get((r["task"], r["length"], r["index"], method, ratio)) for r in mine]
            known = [x for x in found if x is not None]
            cells.append(f"{sum(known) / len(known):.2f} ({len(known)})" if known else "-")
        width = sum(r["width"] / r["budget"] for r in mine) / len(mine)
        score = sum(r["score"] for r in mine) / len(mine)
        task = "**all**" if key[4] == "all" else key[4].removeprefix("niah_")
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]:g}x | {key[3]} | {task} | {len(mine)} | {score:.2f} | "
            + " | ".join(cells)
            + f" | {width:.2f} |"
        )
    return "\n".join(lines) + (
        "\n\nMean RULER score over the variant's samples (reported: `ruler.py`'s samples, 0-9 and 20 on; 4k "
        "indices 0-2 chose `prefill:2:global`, 8k index 0 was held out; tuning: indices "
        f"{ruler_tasks.TUNING.start}-{ruler_tasks.TUNING.stop - 1}, which no reported number uses); the references "
        "are `ruler.py`'s rows of the same samples (their count in brackets). Cache width / budget: the "
        "slots a head holds over the budget (``global`` pads every head to the widest head of any layer).\n"
    )


def main() -> None:
    if sys.argv[1:] == ["report"]:
        REPORT.write_text(report())
        print(REPORT.read_text())
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="niah_multikey_2")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--indices", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=["homer:4:global", "prefill:4:global"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--close-top", type=float, default=0.02, help="prefillclose: the share of best tokens")
    parser.add_argument("--close-longest", type=int, default=48, help="prefillclose: the longest statement closed")
    parser.add_argument("--common-weight", type=float, default=4.0, help="--root-unit common: the penalty's weight")
    parser.add_argument(
        "--root-unit",
        default="sentence",
        choices=["sentence", "statement", "word", "common", "best"],
        help="the unit the candidates' selection ranks (the recipe: sentence); rows of another are named VARIANT@UNIT",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(ruler.MODEL)
    samples = probe_samples(args.task, args.length, args.indices)
    suffix = "" if args.root_unit == "sentence" else f"@{args.root_unit}"
    if args.root_unit == "common":
        suffix += f"{args.common_weight:g}"
    for sample in samples:
        probe = HomerModel(model, tok, HomerConfig(), model_name=ruler.MODEL, progress=False)
        config = ruler.sample_config(probe, sample, args.ratio, mode="shared")
        engine = HomerModel(model, tok, config, model_name=ruler.MODEL, progress=False)
        prompt = ruler.homer_prompt(engine, sample, "shared")
        offsets = tok(sample.document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        values, lines = zip(*(value_and_line(sample.document, offsets, v) for v in sample.outputs), strict=True)
        tiers = engine.tiers
        if args.root_unit in ROOT_ABLATIONS:
            tiers.scoring = RECONSTRUCTION_ABLATIONS[ROOT_ABLATIONS[args.root_unit]](tiers.scoring)
        ids = tiers.prompting.encode_span(prompt.prefix, sample.document, prompt.suffix)
        word_units = tiers.unit_ids(sample.document, ids[1], "word")
        if args.root_unit == "common":  # the sentence bonus, then words shared across the document lowered
            doc = torch.ones(ids[1].numel(), dtype=torch.bool)
            penalty = standardise(word_counts(ids[1], word_units).log(), doc)
            units = (*tiers.scoring.units[:-1], CommonWords(penalty, args.common_weight), tiers.scoring.units[-1])
            tiers.scoring = replace(tiers.scoring, units=units)
        compressor = tiers.builder().compressor(True, query_aware=False)
        words = tiers.unit_ids(sample.document, ids[1], tiers.scoring.unit)
        statements = tiers.unit_ids(sample.document, ids[1], "statement")
        budget = compressor.nodes.settings.final_cache_len
        builds: dict[str, tuple[CompressionResult, torch.Tensor, float]] = {}
        for variant in args.variants:
            base, factor, selection = variant.split(":")
            if f"{base}:{factor}" not in builds:  # variants of one base share its build and scores
                builds.clear()
                started = time.perf_counter()
                added = {"tokens": 0}  # what a prefillclose base's closure adds
                if base == "chunks":
                    built, scores = encode_chunks(compressor, *ids, int(factor))
                else:
                    closing = statements if base == "prefillclose" else None
                    with statement_closure(closing, args.close_top, args.close_longest) as added:
                        built = select_candidates(
                            compressor,
                            *ids,
                            prompt_ids(compressor),
                            None,
                            words,
                            float(factor),
                            recompute=base != "homer",
                            whole=word_units if base in ("prefillword", "prefillclose") else None,
                        )
                    scores = None  # a base whose every variant keeps all candidates needs no scores
                    if any(v.startswith(f"{base}:{factor}:") and not v.endswith(":none") for v in args.variants):
                        scores = score_candidates(compressor.nodes.stack, built, ids[1], prompt_ids(compressor))
                builds[f"{base}:{factor}"] = (built, scores, time.perf_counter() - started, added["tokens"])
            built, scores, build_s, closure = builds[f"{base}:{factor}"]
            started = time.perf_counter()
            closed = f"/{args.close_top:g}/{args.close_longest}" if base == "prefillclose" else ""
            pooled = statements if selection == "globalstatement" else word_units
            slot_words = torch.where(built.origin >= 0, pooled[built.origin.clamp(min=0)], -1)
            keys, vals, kept, hidden = select(compressor, built, ids[1], selection, budget, scores, slot_words)
            select_s = time.perf_counter() - started
            cover = value_cover(built.origin, kept, hidden, values)
            candidate_share = [share(v, built.origin) for v in values]
            first = kept[0, 0]
            result = replace(
                built, keys=keys, values=vals, position_ids=built.position_ids[first], origin=built.origin[first]
            )
            doc = compressed_document("headwise", result, sum(t.numel() for t in ids), None)
            with hidden_slots(None if hidden is None else list(hidden)):
                answer = answer_after(engine, doc, prompt, sample)
            row = {
                **row_head(args, sample, variant + closed + suffix, budget),
                "closure_added": closure,
                "candidates": built.origin.numel(),
                "width": keys[0].shape[2],
                "value_cover": cover,
                "value_candidates": candidate_share,
                "line_candidates": [share(line, built.origin) for line in lines],
                "answer": answer,
                "expected": sample.outputs,
                "score": ruler_tasks.score(sample, answer),
                "build_s": round(build_s, 1),
                "select_s": round(select_s, 1),
                "threads": args.threads,
            }
            print(json.dumps(row), flush=True)
            with OUT.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
