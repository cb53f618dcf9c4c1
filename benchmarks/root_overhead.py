"""Cost of building a shared root in row blocks of 1,024 against 8,192.

A decoder layer runs a leaf's rows in blocks (``homer/model/decoder.py``: ``ATTENTION_ROWS`` and
``MLP_ROWS`` on a CPU, ``ACCELERATOR_ROWS`` on a GPU); on a GPU each block is another round of kernel
launches (an H100 profile of a 64k root: 2,336 attention calls for 792 layer steps). This measures
both sizes on Qwen2.5-0.5B's 24 layers at tiny widths (``question_overhead.tiny_qwen``), where every
module call is the same and the arithmetic small. Each build uses a fresh engine (nothing cached);
the two block sizes alternate in one process and must keep the same tokens. On this CPU the larger
blocks were slower (1.16-1.19x: the explicit masks and attention maps grow with the block), on an
H100 faster (0.60-0.65x), which set the decoder's size per device.

    .venv/bin/python benchmarks/root_overhead.py            # a few minutes

Writes benchmarks/results/root_overhead.json and .md (``--device cuda``: root_overhead_cuda.*).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from question_overhead import RESULTS, tiny_qwen

POINTS = ((16384, 8), (32768, 16))
BLOCKS = (1024, 8192)


def one_point(tokens: int, ratio: int, repeats: int, device: str) -> dict:
    from ruler import chunk_length

    import homer_integrations.homer.model.decoder as decoder
    from homer_integrations import HomerConfig, HomerModel
    from homer_integrations.paths import bundled_excerpt

    model, tok = tiny_qwen(device)
    budget = tokens // ratio
    settings = HomerConfig(max_chunk_len=chunk_length(tokens, budget), final_cache_len=budget, mode="shared")
    document = bundled_excerpt(tok, tokens)
    saved = decoder.ATTENTION_ROWS, decoder.MLP_ROWS, decoder.ACCELERATOR_ROWS
    seconds: dict[int, list[float]] = {b: [] for b in BLOCKS}
    kept: dict[int, list[int]] = {}
    try:
        for i in range(repeats + 1):  # the first round warms up and is not timed
            for rows in BLOCKS if i % 2 == 0 else BLOCKS[::-1]:
                decoder.ATTENTION_ROWS = decoder.MLP_ROWS = decoder.ACCELERATOR_ROWS = rows
                engine = HomerModel(model, tok, settings, model_name="qwen2-shape-tiny", progress=False)
                lay = engine.prompting.layout("", mode="shared")
                start = time.perf_counter()
                doc = engine.compress_span(lay.prefix, document, lay.suffix, mode="shared").document
                if i:
                    seconds[rows].append(time.perf_counter() - start)
                kept[rows] = doc.origin.tolist()
    finally:
        decoder.ATTENTION_ROWS, decoder.MLP_ROWS, decoder.ACCELERATOR_ROWS = saved
    medians = {b: statistics.median(v) for b, v in seconds.items()}
    small, large = BLOCKS
    return {
        "tokens": tokens,
        "ratio": ratio,
        "max_chunk_len": settings.max_chunk_len,
        "builds": repeats,
        "seconds": {str(b): v for b, v in seconds.items()},
        "median": {str(b): m for b, m in medians.items()},
        "large_over_small": medians[large] / medians[small],
        "same_kept_tokens": kept[small] == kept[large],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=4, help="timed builds per block size and point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    started = time.time()
    rows = [one_point(tokens, ratio, args.repeats, args.device) for tokens, ratio in POINTS]
    small, large = BLOCKS
    lines = [
        "Host-side seconds to build a shared root (Qwen2.5-0.5B's 24 layers at tiny widths, random weights; "
        f"{args.device}, {args.threads} thread; median of {args.repeats} builds per block size, alternated).",
        "",
        f"| tokens | ratio | blocks of {small} s | blocks of {large} s | {large} / {small} | same kept tokens |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']:,} | {r['ratio']}x | {r['median'][str(small)]:.2f} | {r['median'][str(large)]:.2f} | "
            f"{r['large_over_small']:.2f} | {'yes' if r['same_kept_tokens'] else 'no'} |"
        )
    print("\n".join(lines))
    name = "root_overhead" if args.device == "cpu" else f"root_overhead_{args.device}"
    result = {"device": args.device, "threads": args.threads, "wall_seconds": round(time.time() - started, 1)}
    (RESULTS / f"{name}.json").write_text(json.dumps({**result, "points": rows}, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
