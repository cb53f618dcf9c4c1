"""kvpress presses over saved RULER jobs; runs inside its own virtual environment (kvpress pins transformers < 5.3).

``benchmarks/ruler.py`` creates that environment on first use (``ensure_venv`` below, pinned versions)
and calls this file as a subprocess; nothing in the package imports it. Input: a JSONL of jobs
``{task, length, index, context, question, answer_prefix, max_new_tokens}``; output: one JSONL row
per job, press and ratio with the prediction and its costs (scoring is done by ``ruler.py``).

Each job is tokenized by kvpress's own pipeline (``preprocess``: chat template, question suffix,
answer prefix), compressed inside ``with press(model)`` as its pipeline does, and answered greedily
from the compressed cache with the question at positions after the ORIGINAL context length.
``--share-prefill`` runs the score-based presses (knorm, snapkv, expected_attention,
streaming_llm) off ONE prefill, and answers that prefill's whole cache too (``kvpress_full``, the
harness's control against ``ruler.py``'s plain prefill): kvpress presses prune each layer's cache
after its attention and never touch the hidden states, so every press sees the same layer inputs; a
fan-out press stores each press's pruned layer instead of pruning the shared cache. Their
``compress_seconds`` is then the shared prefill plus the press's own scoring time, and the process peak
RSS is the group's.

    benchmarks/.work/kvpress-venv/bin/python benchmarks/kvpress_runner.py --model DIR --jobs jobs.jsonl \
        --out rows.jsonl --presses knorm kvzip --ratios 4 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VENV = Path(__file__).parent / ".work" / "kvpress-venv"
PINS = ("kvpress==0.5.5", "torch==2.13.0", "transformers>=5.2,<5.3")
"""torch 2.13.0 installs from the local CPU wheel here; on a CUDA machine pass ``torch_spec``."""

PRESSES = ("knorm", "snapkv", "expected_attention", "streaming_llm", "kvzip", "snapkv_question")
SHARABLE = ("knorm", "snapkv", "expected_attention", "streaming_llm")
"""Score-based presses that can share one prefill (``--share-prefill``)."""
FULL = "kvpress_full"
"""Rows of the shared prefill's own uncompressed cache, answered by the same code as the presses: a
check that this harness's prompt and answering agree with ``ruler.py``'s plain prefill."""


def ensure_venv(venv: Path = VENV, torch_spec: str | None = None) -> Path:
    """The kvpress environment's python, creating the environment with the pinned versions on first use."""
    python = venv / "bin" / "python"
    marker = venv / ".pins"
    pins = [*PINS[:1], torch_spec or PINS[1], *PINS[2:]]
    if python.is_file() and marker.is_file() and marker.read_text() == "\n".join(pins):
        return python
    print(f"creating the kvpress environment in {venv} ({', '.join(pins)}); a few minutes", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    marker.write_text("\n".join(pins))
    return python


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_press(name: str, ratio: float) -> Any:
    """The kvpress press for ``name`` removing ``1 - 1/ratio`` of the context's KV pairs."""
    import kvpress

    removed = 1.0 - 1.0 / ratio
    build: dict[str, Callable[[], Any]] = {
        "knorm": lambda: kvpress.KnormPress(compression_ratio=removed),
        "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=removed),
        "snapkv_question": lambda: kvpress.SnapKVPress(compression_ratio=removed),
        "expected_attention": lambda: kvpress.ExpectedAttentionPress(compression_ratio=removed),
        "streaming_llm": lambda: kvpress.StreamingLLMPress(compression_ratio=removed),
        "kvzip": lambda: kvpress.KVzipPress(compression_ratio=removed),
    }
    return build[name]()


@dataclass
class FanOutPress:
    """Runs several score-based presses on each layer of ONE prefill and keeps each one's pruned layer.

    The shared cache is left whole (later layers attend to all tokens, as each press alone would
    see them before its own pruning of that layer: presses prune after the attention). ``kept[name][l]``
    is (keys, values) [1, kv_heads, kept, head_dim]; ``seconds[name]`` the press's own scoring time.
    """

    presses: dict[str, Any]
    kept: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def hook(self, module: Any, _input: Any, kwargs: dict, output: Any) -> Any:
        from kvpress.presses.base_press import is_prefilling
        from kvpress.utils import extract_keys_and_values

        hidden = kwargs["hidden_states"]
        if not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
            return output
        keys, values = extract_keys_and_values(kwargs["past_key_values"], module.layer_idx)
        for name, press in self.presses.items():
            start = time.perf_counter()
            pruned = press.compress(module, hidden, keys, values, output[1], kwargs)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.kept.setdefault(name, []).append(pruned)
        return output

    @contextlib.contextmanager
    def __call__(self, model: Any) -> Iterator[None]:
        for press in self.presses.values():
            press.post_init_from_model(model)
        hooks = []
        for layer in model.model.layers:
            layer.self_attn.rotary_emb = model.model.rotary_emb  # as kvpress's own ``BasePress.__call__`` does
            hooks.append(layer.self_attn.register_forward_hook(self.hook, with_kwargs=True))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()


class Answerer:
    """Greedy answers from a (compressed) cache, timed: seconds to the first token and in total."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        eos = model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])

    def __call__(self, cache: Any, question_ids: Any, context_length: int, max_new_tokens: int) -> dict:
        import torch

        start = time.perf_counter()
        positions = torch.arange(context_length, context_length + question_ids.shape[1], device=self.model.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=question_ids, past_key_values=cache, position_ids=positions[None], logits_to_keep=1
            )
            token = out.logits[0, -1].argmax()
            ttft = time.perf_counter() - start
            generated = [int(token)]
            position = int(positions[-1]) + 1
            while len(generated) < max_new_tokens and generated[-1] not in self.eos:
                out = self.model(
                    input_ids=token.view(1, 1),
                    past_key_values=cache,
                    position_ids=torch.tensor([[position]], device=self.model.device),
                )
                token = out.logits[0, -1].argmax()
                generated.append(int(token))
                position += 1
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        return {"prediction": text, "ttft": ttft, "question_seconds": time.perf_counter() - start}


def cache_from(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def run_job(job: dict, args: argparse.Namespace, model: Any, pipe: Any, answer: Answerer) -> Iterator[dict]:
    """Rows for one job: every requested press at every ratio."""
    import torch
    from transformers import DynamicCache

    device = model.device
    base = {k: job[k] for k in ("task", "length", "index")}
    sharable = [p for p in args.presses if p in SHARABLE] if args.share_prefill else []
    for name in args.presses:
        if name in sharable:
            continue
        for ratio in args.ratios:
            aware = name == "snapkv_question"
            # kvpress's question-aware mode: the question is part of the compressed context
            context = job["context"] + job["question"] if aware else job["context"]
            ids = pipe.preprocess(context, [("" if aware else job["question"])], job["answer_prefix"], 10**10)
            context_ids = ids["context_ids"].to(device)
            cache = DynamicCache()
            press = make_press(name, ratio)
            start = time.perf_counter()
            with torch.inference_mode(), press(model):
                model.model(input_ids=context_ids, past_key_values=cache)
            compress_seconds = time.perf_counter() - start
            cache_tokens = cache.get_seq_length()
            if name == "kvzip":  # KVzip masks evicted pairs (a budget over all layers) instead of removing them
                cache_tokens = round(context_ids.shape[1] / ratio)
            row = answer(cache, ids["questions_ids"][0].to(device), context_ids.shape[1], job["max_new_tokens"])
            yield {
                **base,
                "method": name,
                "ratio": ratio,
                "context_tokens": context_ids.shape[1],
                "budget": round(context_ids.shape[1] / ratio),
                "cache_tokens": cache_tokens,
                "compress_seconds": compress_seconds,
                "shared_prefill": False,
                **row,
            }
            del cache
    if sharable:
        ids = pipe.preprocess(job["context"], [job["question"]], job["answer_prefix"], 10**10)
        context_ids = ids["context_ids"].to(device)
        presses = {(n, r): make_press(n, r) for n in sharable for r in args.ratios}
        fan = FanOutPress({f"{n}@{r}": p for (n, r), p in presses.items()})
        cache = DynamicCache()
        start = time.perf_counter()
        with torch.inference_mode(), fan(model):
            model.model(input_ids=context_ids, past_key_values=cache)
        total = time.perf_counter() - start
        prefill = total - sum(fan.seconds.values())
        for (n, r), _ in presses.items():
            layers = fan.kept.pop(f"{n}@{r}")
            row = answer(
                cache_from(layers), ids["questions_ids"][0].to(device), context_ids.shape[1], job["max_new_tokens"]
            )
            yield {
                **base,
                "method": n,
                "ratio": r,
                "context_tokens": context_ids.shape[1],
                "budget": round(context_ids.shape[1] / r),
                "cache_tokens": layers[0][0].shape[2],
                "compress_seconds": prefill + fan.seconds[f"{n}@{r}"],
                "shared_prefill": True,
                **row,
            }
        # the control: the same prefill through kvpress's pipeline, nothing pruned (the hooks leave the
        # shared cache whole), answered like the presses; it should score as ``ruler.py``'s plain prefill
        row = answer(cache, ids["questions_ids"][0].to(device), context_ids.shape[1], job["max_new_tokens"])
        yield {
            **base,
            "method": FULL,
            "ratio": 1.0,
            "context_tokens": context_ids.shape[1],
            "budget": context_ids.shape[1],
            "cache_tokens": context_ids.shape[1],
            "compress_seconds": prefill,
            "shared_prefill": True,
            **row,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="directory of the converted transformers checkpoint")
    parser.add_argument("--jobs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--presses", nargs="+", choices=PRESSES, required=True)
    parser.add_argument("--ratios", type=float, nargs="+", default=[4.0, 8.0])
    parser.add_argument("--share-prefill", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import torch
    from kvpress.pipeline import KVPressTextGenerationPipeline
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
    model = model.to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=torch.device(args.device))
    answer = Answerer(model, tokenizer)
    loaded_rss = peak_rss_mb()
    jobs = [json.loads(line) for line in args.jobs.read_text().splitlines() if line.strip()]
    import kvpress

    for job in jobs:
        for row in run_job(job, args, model, pipe, answer):
            row.update(
                peak_rss_mb=peak_rss_mb(),
                model_rss_mb=loaded_rss,
                device=args.device,
                dtype=args.dtype,
                threads=torch.get_num_threads(),
                kvpress=kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
                transformers=__import__("transformers").__version__,
            )
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"{row['method']} x{row['ratio']:g} {row['task']} {row['length']} #{row['index']}: "
                f"{row['prediction'][:60]!r} ({row['compress_seconds']:.1f}s)",
                flush=True,
            )


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
