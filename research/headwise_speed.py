"""Where the head-wise shared root's build time goes, and what an exact cut of its probe saves.

SmolLM2-135M compresses ~``--tokens`` tokens of Pride and Prejudice (chapter 1 on) in ``mode="shared"``
with the default root (``AutoRoot``, which picks ``HeadwiseRoot`` for this model), timing its three
steps from outside: step 1 ``select_candidates`` (of which ``reread_selected``, the plain prefill of the
candidates), step 2 ``score_candidates`` (the per-head reconstruction probe), step 3 the rest (the
survivors and the ragged cache). Two builds alternate ``--repeats`` times in one process:

* ``before``: ``log_max_attention`` as it was, restored by patching: every block of probe rows computed
  the logits and softmax of all keys and masked the causal part;
* ``after``: the package as it is: a block reads the keys up to its last row and masks its own triangle.

Both must keep the same (layer, head, token) triples and the same K/V (asserted). Reported in this
process's CPU seconds (``CLOCK``; wall seconds beside them) as medians per step, the after/before ratio
of the medians and each alternating pair's ratio; ``--profile`` adds a cProfile (CPU seconds) of one
build of each.
Prints only (nothing is written): the numbers are in ``docs/benchmarks/headwise_speed.md``.

    nice -n 19 .venv/bin/python research/headwise_speed.py --repeats 3
    nice -n 19 .venv/bin/python research/headwise_speed.py --repeats 1 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch

import homer_integrations.homer.scoring.headwise as selection
import homer_integrations.homer.scoring.scorers as scorers
import homer_integrations.homer.tree.flat as flat
import homer_integrations.homer.tree.headwise as root
from homer_integrations import HomerModel
from homer_integrations.homer.reading.strategies import AutoRoot, HeadwiseRoot, RootSpan
from homer_integrations.paths import bundled_text

MODEL = "smollm2-135m-instruct"
CLOCK = time.process_time
"""This process's CPU seconds: run at nice 19 behind a benchmark, the wall time measures the benchmark's
phases more than the build (one 2k-token prefill took 6 to 22 s wall in a row); with one thread
(``--threads``) no thread spins waiting for a descheduled one, so the CPU time is the build's work."""
STEPS = ("step 1 select", "  of which re-read", "step 2 score", "step 3 keep", "total")


def former_log_max_attention(
    x: scorers.ScoreInput, length: int, block: int = 256, per_head: bool = False
) -> torch.Tensor:
    """``log_max_attention`` as it was: each block's logits over all keys, the causal part masked."""
    rows, keys = x.queries.shape[2], x.keys.shape[2]
    heads, kv_heads = x.queries.shape[1], x.keys.shape[1]
    block = max(1, min(block, scorers.BLOCK_FLOATS // (heads * keys)))
    k = x.keys[0].float()
    best = torch.full((kv_heads, length) if per_head else (length,), float("-inf"), device=k.device)
    reduce = (1, 2) if per_head else (0, 1, 2)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        q = x.queries[0, :, start:stop].float().view(kv_heads, heads // kv_heads, stop - start, -1)
        logits = torch.einsum("hgrd,hkd->hgrk", q, k).mul_(x.scaling)
        row_pos = torch.arange(keys - rows + start, keys - rows + stop, device=k.device)
        unseen = torch.arange(keys, device=k.device)[None, :] > row_pos[:, None]
        probs = logits.masked_fill_(unseen, float("-inf")).softmax(-1)[..., :length]
        best = torch.maximum(best, probs.amax(dim=reduce))
    return best.clamp(min=1e-12).log()


@contextlib.contextmanager
def former_code():
    """The package as it was before the two cuts."""
    with (
        mock.patch.object(scorers, "log_max_attention", former_log_max_attention),
        mock.patch.object(selection, "log_max_attention", former_log_max_attention),
    ):
        yield


def timed(module: object, name: str, into: dict[str, float], label: str) -> contextlib.AbstractContextManager:
    """``module.name`` patched to add its CPU seconds (``CLOCK``) to ``into[label]``."""
    inner: Callable = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = CLOCK()
        try:
            return inner(*args, **kwargs)
        finally:
            into[label] = into.get(label, 0.0) + CLOCK() - start

    return mock.patch.object(module, name, wrapper)


def build(engine: HomerModel, encoded, former: bool) -> tuple[dict[str, float], object, torch.Tensor]:
    """One head-wise root: (seconds per step, the result, the surviving triples [L, Hkv, W])."""
    builder = engine.tiers.builder()
    compressor = builder.compressor(True, query_aware=False, encoded=encoded)
    span = RootSpan(encoded, encoded.units(builder.scoring.unit), builder.repeat_ids, True)
    seconds: dict[str, float] = {}
    kept: list[torch.Tensor] = []
    survivors = root.survivors
    with contextlib.ExitStack() as stack:
        if former:
            stack.enter_context(former_code())
        stack.enter_context(timed(root, "select_candidates", seconds, STEPS[0]))
        stack.enter_context(timed(flat, "reread_selected", seconds, STEPS[1]))
        stack.enter_context(timed(root, "score_candidates", seconds, STEPS[2]))
        stack.enter_context(mock.patch.object(root, "survivors", lambda *a: kept.append(survivors(*a)) or kept[-1]))
        start, wall = CLOCK(), time.perf_counter()
        result = HeadwiseRoot().build(compressor, span)
        seconds[STEPS[4]] = CLOCK() - start
        seconds["wall"] = time.perf_counter() - wall
    seconds[STEPS[3]] = seconds[STEPS[4]] - seconds[STEPS[0]] - seconds[STEPS[2]]
    return seconds, result, kept[0]


def same_root(a, alive_a: torch.Tensor, b, alive_b: torch.Tensor) -> None:
    """The same triples and positions, K/V within float tolerance."""
    assert torch.equal(alive_a, alive_b), "the kept (layer, head, token) triples differ"
    assert torch.equal(a.head_lengths, b.head_lengths) and torch.equal(a.position_ids, b.position_ids)
    assert torch.equal(a.origin, b.origin)
    for ka, kb, va, vb in zip(a.keys, b.keys, a.values, b.values, strict=True):
        torch.testing.assert_close(ka, kb, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(va, vb, atol=1e-3, rtol=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000, help="document tokens, about")
    parser.add_argument("--repeats", type=int, default=3, help="before/after pairs, alternating")
    parser.add_argument("--profile", action="store_true", help="cProfile one build of each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is clean at 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    engine = HomerModel.from_pretrained(MODEL, store=False, progress=False)
    tiers = engine.tiers
    assert isinstance(tiers.recipe.shared_root, AutoRoot), "the default shared root"
    novel = bundled_text("prideprejudice")
    novel = novel[novel.index("It is a truth universally acknowledged") :]
    sample = novel[:20000]
    text = novel[: len(sample) * args.tokens // tiers.prompting.documents.ids(sample)[0].numel()]
    layout = tiers.prompting.layout("", "shared")
    encoded = tiers.prompting.encode_document(layout.prefix, text, layout.suffix)
    builder = tiers.builder()
    compressor = builder.compressor(True, query_aware=False, encoded=encoded)
    span = RootSpan(encoded, None, builder.repeat_ids, True)
    assert isinstance(AutoRoot().choose(compressor, span), HeadwiseRoot), "AutoRoot picks the head-wise root"
    print(
        f"{MODEL} {engine.stack.dtype} on {engine.stack.device}, {torch.get_num_threads()} threads: "
        f"{encoded.document_ids.numel()} document tokens, budget {engine.config.final_cache_len}"
    )

    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    reference = None
    for repeat in range(args.repeats):
        for former in (True, False) if repeat % 2 == 0 else (False, True):
            seconds, result, alive = build(engine, encoded, former)
            runs[former].append(seconds)
            if reference is None:
                reference = (result, alive)
            else:
                same_root(*reference, result, alive)
            label = "before" if former else "after"
            print(
                f"repeat {repeat} {label:6s} " + "  ".join(f"{k.strip()} {seconds[k]:5.1f}s" for k in (*STEPS, "wall"))
            )
    print(f"\nCPU seconds, medians of {args.repeats} builds each, alternating (identical triples asserted)")
    print(f"{'':20s} {'before':>8s} {'after':>8s} {'after/before':>13s} {'paired ratios':>14s}")
    for step in (*STEPS, "wall"):
        old = statistics.median(r[step] for r in runs[True])
        new = statistics.median(r[step] for r in runs[False])
        paired = " ".join(f"{a[step] / b[step]:.2f}" for a, b in zip(runs[False], runs[True], strict=True))
        print(f"{step:20s} {old:7.1f}s {new:7.1f}s {new / old:13.2f}   {paired}")

    for former in (True, False) if args.profile else ():
        profiler = cProfile.Profile(CLOCK)  # CPU seconds, as the steps
        profiler.enable()
        build(engine, encoded, former)
        profiler.disable()
        print("\ncProfile of one build " + ("before" if former else "after"))
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
