"""Decoding after a compressed cache: explicit positions, sampling, stop strings, streaming.

``model.generate`` derives position ids from the cache length (or the attention mask); after
HOMER the cache holds K tokens whose positions end at ``last_position`` != K - 1, so we run our
own short loop and pass positions explicitly. Sampling uses transformers' logits processors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import (
    DynamicCache,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

FinishReason = Literal["stop", "eos", "length"]


class GenerationOptions(BaseModel):
    """How to decode an answer. ``temperature == 0`` is greedy decoding.

    ``stop`` strings end the answer and are cut from it; ``seed`` makes sampling repeatable.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(default=256, ge=1, le=32_768)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def sampling(self) -> bool:
        return self.temperature > 0


@dataclass
class DecodeState:
    """What a finished (or running) decode produced; filled in while the stream is consumed."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    first_token_seconds: float | None = None


def _warpers(options: GenerationOptions) -> LogitsProcessorList:
    warpers = LogitsProcessorList()
    if options.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(options.temperature))
    if options.top_k > 0:
        warpers.append(TopKLogitsWarper(options.top_k))
    if options.top_p < 1.0:
        warpers.append(TopPLogitsWarper(options.top_p))
    return warpers


class StopStringFilter:
    """Streams text while holding back anything that could still become a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.emitted = 0

    def feed(self, text: str) -> tuple[str, bool]:
        """Given the whole answer so far, return (new text safe to emit, stopped)."""
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            piece = text[self.emitted : cut]
            self.emitted = max(self.emitted, cut)
            return piece, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        safe_end = max(self.emitted, len(text) - hold)
        piece = text[self.emitted : safe_end]
        self.emitted = safe_end
        return piece, False

    def flush(self, text: str) -> str:
        piece = text[self.emitted :]
        self.emitted = len(text)
        return piece


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Token ids that end an answer: the generation config's EOS ids, the tokenizer's, chat end tokens."""
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"):
        tid = tokenizer.convert_tokens_to_ids(name)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return ids


@torch.inference_mode()
def decode(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    start_position: int,
    options: GenerationOptions,
    state: DecodeState,
    first_logits: torch.Tensor | None = None,
) -> Iterator[str]:
    """Feed ``input_ids`` [n] at positions ``start_position..`` after ``cache``, then generate.

    Yields text pieces as they become final. With ``n == 0`` decoding starts from
    ``first_logits`` [V] (the compressed prompt already ended where the answer begins).
    ``cache`` is consumed (it grows); pass a fresh one per answer.
    """
    import time

    started = time.perf_counter()
    device = model.device
    eos = eos_token_ids(model, tokenizer)
    warpers = _warpers(options) if options.sampling else None
    generator = None
    if options.sampling:
        generator = torch.Generator(device=device)
        generator.manual_seed(options.seed if options.seed is not None else torch.seed())
    stops = StopStringFilter(options.stop)
    position = start_position
    if input_ids.numel():
        positions = torch.arange(position, position + input_ids.numel(), device=device)
        out = model(
            input_ids=input_ids.to(device)[None],
            position_ids=positions[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[0, -1].float()
        position += input_ids.numel()
    elif first_logits is not None:
        logits = first_logits.to(device).float()
    else:
        raise ValueError("nothing to decode from: no input tokens and no first logits")

    while True:
        if options.sampling:
            scores = warpers(None, logits[None])
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            token = int(logits.argmax())
        if state.first_token_seconds is None:
            state.first_token_seconds = time.perf_counter() - started
        if token in eos:
            state.finish_reason = "eos"
            break
        state.token_ids.append(token)
        text = tokenizer.decode(state.token_ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            piece, stopped = stops.feed(text)
            if piece:
                yield piece
            if stopped:
                state.finish_reason = "stop"
                return
        if len(state.token_ids) >= options.max_new_tokens:
            state.finish_reason = "length"
            break
        out = model(
            input_ids=torch.tensor([[token]], device=device),
            position_ids=torch.tensor([[position]], device=device),
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[0, -1].float()
        position += 1
    tail = stops.flush(tokenizer.decode(state.token_ids, skip_special_tokens=True).rstrip("\ufffd"))
    if tail:
        yield tail
