"""Where a fact's value ranks in its own leaf under ways of folding reconstruction attention.

    .venv/bin/python research/reconstruction_ranks.py 16000 2001
    # -> benchmarks/results/reconstruction_ranks_16000_2001.json

For each of a two_tier sample's three facts: the leaf holding its value runs the leaf layers, the
reconstruction probe (REPEAT_PROMPT + the piece) runs after it, and the value's best token gets a
percentile among the leaf's document tokens (1.0 = top; a leaf keeps about ``keep_frac`` of them)
under each fold: per leaf layer (max over rows and heads, without the copy rows' own source +-2,
mean over heads, per-head standardised ranks, mean attention), over all leaf layers, and for
reference the calibrated last-token score with the question / the shared suffix in the leaf.
A diagnostic for choosing the fold; it reads a two_tier sample (seeds 2000+, held out).
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # two_tier
from two_tier import engine_for, make_sample, value_tokens

from homer_integrations.engine.loading import load_model
from homer_integrations.homer.document.chunking import ChunkPlan
from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.kv.dynamic import cache_from_tensors
from homer_integrations.homer.scoring.probing import probe_scores
from homer_integrations.homer.scoring.pruning import standardise
from homer_integrations.homer.scoring.scorers import ReconstructionScorer, ScoreInput

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # results stay with the benchmarks

MODEL = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class RecordingProbe(ReconstructionScorer):
    """The package's probe, also recording per layer and head: best attention [H, T], best attention
    from rows other than the copy of the token itself (+-2), mean attention."""

    piece_len: int = 0
    records: list = field(default_factory=list, compare=False)

    def probe_scores(self, x: ScoreInput, length: int) -> torch.Tensor:
        rows, keys = x.queries.shape[2], x.keys.shape[2]
        heads, kv_heads = x.queries.shape[1], x.keys.shape[1]
        k = x.keys[0].float()
        prefix, prompt = length - self.piece_len, rows - self.piece_len
        best = torch.full((heads, length), float("-inf"))
        best_other, mean = best.clone(), torch.zeros(heads, length)
        for s in range(0, rows, 256):
            e = min(rows, s + 256)
            q = x.queries[0, :, s:e].float().view(kv_heads, heads // kv_heads, e - s, -1)
            logits = torch.einsum("hgrd,hkd->hgrk", q, k) * x.scaling
            future = torch.arange(keys)[None, :] > torch.arange(keys - rows + s, keys - rows + e)[:, None]
            p = logits.masked_fill(future, float("-inf")).softmax(-1)[..., :length].reshape(heads, e - s, length)
            best = torch.maximum(best, p.amax(1))
            mean += p.sum(1)
            source = prefix + torch.arange(s, e) - prompt  # the key each repeat row copies
            near = ((torch.arange(length)[None, :] - source[:, None]).abs() <= 2) & (torch.arange(s, e) >= prompt)[
                :, None
            ]
            best_other = torch.maximum(best_other, p.masked_fill(near[None], 0).amax(1))
        self.records.append((best, best_other, mean / rows))
        return best.amax(0).clamp(min=1e-12).log()


def percentile(score: torch.Tensor, value_rows: torch.Tensor, reducible: torch.Tensor) -> float:
    """Share of the leaf's document tokens scoring below the value's best token (1.0 = top)."""
    return round(float((score[reducible] < score[value_rows].max()).float().mean()), 3)


def main() -> None:
    tokens, seed = int(sys.argv[1]), int(sys.argv[2])
    torch.set_grad_enabled(False)
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    model, tok = load_model(MODEL)
    sample = make_sample(tok, tokens, seed)
    engine, _ = engine_for("shared_recon", model, tok, MODEL)
    layout = engine.prompting.layout("", "shared")
    prefix_ids, doc_ids, suffix_ids = engine.prompting.encode_span(layout.prefix, sample.document, layout.suffix)
    comp = engine.tiers.builder().compressor(True, query_aware=False)
    ask = engine.tiers.builder().compressor(True, query_aware=True)
    plan = ChunkPlan.build(prefix_ids.numel(), doc_ids.numel(), suffix_ids.numel(), comp.nodes.settings.max_chunk_len)
    layers = comp.nodes.schedule(plan).layers_at(0)
    prefix = comp.leaves.prefix_part(prefix_ids, layers)
    P, out = prefix_ids.numel(), []
    for question, value in zip(sample.questions, sample.answers, strict=True):
        need = value_tokens(tok, sample.document, value)
        leaf = next(i for i in range(plan.num_leaves) if plan.piece(i).start <= need[0] < plan.piece(i).stop)
        span = plan.piece(leaf)
        probe = RecordingProbe(
            engine.tiers.scoring.scorer.prompt_ids, every_layer=True, piece_len=span.stop - span.start
        )
        part = comp.leaves.leaf_part(prefix, doc_ids[span], span.start, layers)
        cache = cache_from_tensors(part.keys, part.values)
        probe_scores(comp.nodes.stack, probe, cache, part.position_ids, doc_ids[span], layers)
        rows, red = torch.tensor(need) - span.start + P, part.origin >= 0

        def pct(score: torch.Tensor, rows: torch.Tensor = rows, red: torch.Tensor = red) -> float:
            return percentile(score, rows, red)

        row = {
            "value": value,
            "leaf": leaf,
            "keep_frac": round(comp.nodes.settings.final_cache_len / doc_ids.numel(), 3),
        }
        for layer, (best, other, mean) in zip(layers, probe.records, strict=True):
            row[f"L{layer}"] = {
                "max_all": pct(best.amax(0)),
                "max_noncopy": pct(other.amax(0)),
                "headmean_max": pct(best.mean(0)),
                "head_rank_max": pct(torch.stack([standardise(b.log(), red) for b in best]).amax(0)),
                "mean_attn": pct(mean.amax(0)),
            }
        best_all = torch.stack([b for b, _, _ in probe.records])  # [Lw, H, T]
        row["all_layers_max"] = pct(best_all.amax((0, 1)))
        row["all_layers_mean_of_max"] = pct(best_all.amax(1).mean(0))
        row["all_layers_noncopy"] = pct(torch.stack([o for _, o, _ in probe.records]).amax((0, 1)))
        row["all_layers_logmean"] = pct(best_all.clamp(min=1e-9).log().mean((0, 1)))
        question_ids = encode(tok, engine.prompting.layout(question, "query_aware").suffix, formatted=True)
        _, asked = ask.leaves.replayed_leaf(part, question_ids, plan.with_suffix(question_ids.numel()), layers, 0)
        row["question_last_token"] = pct(asked[: part.origin.numel()])
        _, shared = ask.leaves.replayed_leaf(part, suffix_ids, plan, layers, 0)
        row["shared_last_token"] = pct(shared[: part.origin.numel()])
        print(json.dumps(row), flush=True)
        out.append(row)
    (RESULTS / f"reconstruction_ranks_{tokens}_{seed}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
