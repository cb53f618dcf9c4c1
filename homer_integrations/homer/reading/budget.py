"""How many document tokens a question re-reads past the model's window: a budget that grows with the machine.

Past the window a question keeps the whole passages BM25 ranks best and re-reads them in one plain
prefill (``strategies.PassageReplay``). The more it keeps, the more often the answer is among them
(``research/book_budget.py``, Northanger Abbey's tuning split, answer kept at 1k / 2k / 4k / 8k / 16k
tokens: 25 / 28 / 28 / 32 / 35 of 36), but the 1.5B demo model does not turn more text into more
answers: 8-9 of 16 tuning questions at every budget from 512 to 8,192 tokens, and held out on both
novels 512 tokens answer as 2,048 do (``docs/benchmarks/whole_book.md``) while the first token comes
4-25x sooner. So the budget is what this machine re-reads with this model in about ``seconds`` (the
first token's target), at least ``least`` tokens (``across`` for a corpus), at most ``share`` of the
model's window (the question, the answer and the text around the document need the rest), never more
than the document: 512 tokens (about 1.5 s to the first token) for Qwen2.5-Coder-1.5B in bfloat16 on 2
CPU cores, several thousand on a GPU, where a larger model turns them into answers.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from homer_integrations.homer.model.decoder import DecoderStack


@dataclass(frozen=True)
class ReadBudget:
    """Kept document tokens for one question's re-read: ``tokens`` when set, else as many as this machine
    re-reads in ``seconds`` (``read_rate``), rounded down to a multiple of ``step``, between ``least``
    (None: the configured ``final_cache_len``) and ``share`` of the model's window."""

    tokens: int | None = None
    seconds: float = 1.0
    least: int | None = 512
    across: int = 2048
    """The least for a text of several documents (a corpus: passages under more than one ``Document:``
    heading): its questions find their document first and may need two (``ask_corpus`` held out, 40
    questions: 16 right at 512 tokens, 22 at 2,048, -0.15 [-0.30, +0.00]; ``docs/benchmarks/corpus_qa.md``)."""
    share: float = 0.5
    step: int = 512

    def __post_init__(self) -> None:
        if self.tokens is not None and self.tokens < 16:
            raise ValueError(f"ReadBudget.tokens must be at least 16, not {self.tokens}")
        if self.seconds < 0 or min(self.least or 16, self.across) < 16 or not 0 < self.share <= 1 or self.step < 1:
            raise ValueError(
                f"ReadBudget needs seconds >= 0, least and across >= 16, 0 < share <= 1 and step >= 1, not {self}"
            )

    def kept(self, floor: int, window: int, document_tokens: int, rate: float, documents: int = 1) -> int:
        """Document tokens to keep, given the configured ``floor`` (``final_cache_len``, where ``least`` is
        None), the model's ``window``, the document's length, ``rate`` (tokens re-read per second here)
        and the ``documents`` the text joins (``across`` is the least past one)."""
        if self.tokens is not None:
            return min(self.tokens, document_tokens)
        affordable = int(self.seconds * rate) // self.step * self.step
        least = floor if self.least is None else self.least
        least = max(least, self.across) if documents > 1 else least
        return min(max(least, min(affordable, int(window * self.share))), document_tokens)


def best_seconds(run: Callable[[], object], cuda: bool = False, repeats: int = 3) -> float:
    """Best wall time of ``run()`` over ``repeats`` calls after a warm-up call (kernels are built on first
    use), waiting for a CUDA device to finish each call where ``cuda``."""
    run()
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def linear_seconds(x: torch.Tensor, w: torch.Tensor, repeats: int = 3) -> float:
    """Best wall time of ``linear(x, w)`` over ``repeats`` runs after a warm-up (oneDNN builds its kernel on
    first use)."""
    return best_seconds(lambda: torch.nn.functional.linear(x, w), x.device.type == "cuda", repeats)


_RATES: weakref.WeakKeyDictionary[DecoderStack, float] = weakref.WeakKeyDictionary()


def read_rate(stack: DecoderStack, tokens: int = 512) -> float:
    """Tokens per second a plain prefill of ``tokens`` tokens through ``stack`` reaches here, measured once
    per model (``measure_rate``) and kept while the model lives."""
    if stack not in _RATES:
        _RATES[stack] = measure_rate(stack, tokens)
    return _RATES[stack]


def measure_rate(stack: DecoderStack, tokens: int = 512, repeats: int = 2) -> float:
    """Tokens per second a plain prefill of ``tokens`` tokens through ``stack`` reaches here: one decoder
    layer's attention and feed-forward halves, as a re-read runs them, timed on [1, tokens, D] hidden
    states (best of ``repeats`` after a warm-up), times the number of layers: about a 28th of a re-read
    for the demo model (40 ms a run on 2 CPU cores). It replaced an estimate from one matrix product's FLOP/s
    at two FLOPs per weight per token, which was about twice what a re-read reaches on 2 CPU cores
    (937 tokens/s estimated, 430 measured): attention, norms and the smaller products cost the rest."""
    from transformers import DynamicCache

    index = stack.num_layers // 2
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, tokens, stack.backbone.config.hidden_size, generator=generator).to(stack.dtype)
    hidden = hidden.to(stack.device)
    rope = stack.rotary(hidden, torch.arange(tokens))

    def layer() -> None:
        out, _ = stack.attention(index, hidden, rope, DynamicCache())
        stack.mlp(index, out)

    with torch.inference_mode():
        best = best_seconds(layer, stack.device.type == "cuda", repeats)
    return tokens / (best * stack.num_layers)
