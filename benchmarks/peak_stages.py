"""Where a compression's peak RSS comes from: the resident memory it adds, by the step it was in.

    .venv/bin/python benchmarks/peak_stages.py --tokens 8000
    MALLOC_MMAP_THRESHOLD_=131072 .venv/bin/python benchmarks/peak_stages.py --tokens 8000

A thread samples the process's RSS every millisecond while one shared compression runs (the
model's weights are paged in first). Each time the RSS passes its highest value so far, the rise
is booked to the decoder step running then (``attention`` with its new rows and cached keys,
``mlp``, ``queries``, ``embed``, the scorer's ``log_max_attention``) or to the compression's own
code between them. The rises sum to the peak above the start. RSS also holds memory the allocator
kept after an earlier step freed it, so a step is booked what it touched first, not all it
allocated: compare runs with glibc's dynamic mmap threshold fixed (the second command) to see how
much of a peak is the allocator's. Prints one line per step, largest first.
"""

from __future__ import annotations

import argparse
import functools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from homer_integrations import HomerConfig, HomerModel
from homer_integrations.engine.loading import load_model
from homer_integrations.homer.scoring import scorers
from homer_integrations.paths import bundled_text

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class StageRss:
    """Books every rise of the process's highest RSS to the innermost step named in ``stack``."""

    def __init__(self) -> None:
        self.stack = ["compression"]
        self.rises: dict[str, int] = defaultdict(int)
        self.start = self.high = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            now = rss()
            if now > self.high:
                self.rises[self.stack[-1]] += now - self.high
                self.high = now
            time.sleep(0.001)

    def wrap(self, owner: Any, name: str, label: Callable[..., str] | None = None) -> None:
        """Name ``owner.name``'s calls as a step (``label(*args)`` adds what they ran on)."""
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(label(*args) if label else name)
            try:
                return inner(*args, **kwargs)
            finally:
                self.stack.pop()

        setattr(owner, name, step)

    def __enter__(self) -> StageRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def attention_label(layer_idx: int, hidden: torch.Tensor, rope: Any, cache: Any, *rest: Any) -> str:
    """``DecoderStack.attention``'s call named by its new rows and the keys already cached."""
    past = cache.layers[layer_idx].get_seq_length() if layer_idx < len(cache.layers) else 0
    return f"attention (rows {hidden.shape[1]}, cached {past})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    engine = HomerModel(model, tok, HomerConfig(mode="shared"), model_name=args.model, progress=False)
    engine.tiers.calibration.bias()
    ids = tok(bundled_text("prideprejudice"), add_special_tokens=False)["input_ids"][: args.tokens]
    document, layout = tok.decode(ids), engine.prompting.layout("", "shared")  # the shared root's texts
    with torch.inference_mode():
        model(torch.tensor([ids[:16]]))  # page the weights in before the start is read
    stack = engine.tiers.stack
    profile = StageRss()
    profile.wrap(stack, "attention", attention_label)
    for name in ("mlp", "queries", "embed"):
        profile.wrap(stack, name)
    profile.wrap(scorers, "log_max_attention")  # a module global: the scorers look it up per call
    with profile:
        engine.compress_span(layout.prefix, document, layout.suffix)
    print(f"start {profile.start / 2**20:.0f} MB, peak {profile.high / 2**20:.0f} MB ({args.tokens} tokens)")
    for step, rise in sorted(profile.rises.items(), key=lambda kv: -kv[1]):
        print(f"  +{rise / 2**20:6.0f} MB  {step}")


if __name__ == "__main__":
    main()
