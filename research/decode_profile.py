"""Probe: where a decoding step's time goes on a CPU, after a cache of ``--context`` tokens.

    .venv/bin/python research/decode_profile.py [--context 2048] [--attention sdpa eager]

Loads the converted Qwen2.5-Coder-1.5B in bfloat16 (the package's model cache; run the package once
first), prefills ``--context`` random tokens into a ``DynamicCache`` with SDPA, then times single-token
steps of ``model(...)`` (as ``homer.decoding.generation.decode`` calls it) with each attention implementation,
and profiles three SDPA steps by operator; ``package`` is the attention the engine registers
(``register_headwise_attention``). Also times one bfloat16 matrix-vector product per weight
shape, the rate that bounds a step that only read its weights.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from homer_integrations.homer.kv.headwise import register_headwise_attention
from homer_integrations.paths import cache_root


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--attention", nargs="+", default=["sdpa", "eager", "package"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = next((cache_root() / "models").glob("qwen2.5-coder-1.5b-instruct-*-bfloat16"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    ids = torch.randint(100, 20000, (1, args.context), generator=torch.Generator().manual_seed(0))
    for attention in args.attention:
        model.set_attn_implementation("sdpa")
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            if attention == "package":  # the engine's registered attention (eager for one-row steps on a CPU)
                register_headwise_attention(model)
            else:
                model.set_attn_implementation(attention)
            state = {"position": args.context, "token": int(out.logits[0, -1].argmax())}

            def step(state: dict = state, cache: DynamicCache = cache) -> None:
                o = model(
                    input_ids=torch.tensor([[state["token"]]]),
                    position_ids=torch.tensor([[state["position"]]]),
                    past_key_values=cache,
                    use_cache=True,
                )
                state["position"] += 1
                state["token"] = int(o.logits[0, -1].float().argmax())

            for _ in range(3):
                step()
            times = []
            for _ in range(12):
                started = time.perf_counter()
                step()
                times.append(time.perf_counter() - started)
            print(f"{attention}: a step after {args.context} tokens, median {statistics.median(times):.3f} s")
            if attention == "sdpa":
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(3):
                        step()
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    config = model.config
    shapes = [(config.hidden_size, config.intermediate_size), (config.intermediate_size, config.hidden_size)]
    shapes += [(config.hidden_size, config.hidden_size), (config.hidden_size, config.vocab_size)]
    for inner, outer in shapes:
        w = torch.randn(outer, inner, dtype=torch.bfloat16)
        x = torch.randn(1, inner, dtype=torch.bfloat16)
        times = []
        for _ in range(13):
            started = time.perf_counter()
            torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - started)
        seconds = statistics.median(times[3:])
        print(f"[1, {inner}] x [{inner}, {outer}]: {seconds * 1e3:.2f} ms, {w.numel() * 2 / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
