"""Decoding after a compressed cache: explicit positions, sampling, stop strings, streaming.

``model.generate`` derives position ids from the cache length (or the attention mask); after
HOMER the cache holds K tokens whose positions end at ``last_position`` != K - 1, so we run our
own short loop and pass positions explicitly. Sampling uses transformers' logits processors; a
``response_format`` masks the logits to a grammar first (``constraints.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator
from transformers import (
    DynamicCache,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from homer_integrations.homer.decoding.constraints import ResponseFormat, TokenMask, ll_tokenizer
from homer_integrations.homer.kv.headwise import HeadwiseLayer, headwise_ready
from homer_integrations.homer.kv.kept import KeptLayer

FinishReason = Literal["stop", "eos", "length"]


class GenerationOptions(BaseModel):
    """How to decode an answer. ``temperature == 0`` is greedy decoding.

    ``stop`` strings end the answer and are cut from it; ``seed`` makes sampling repeatable.
    ``response_format`` constrains the answer (see ``ResponseFormat.of``: a JSON schema dict, a
    pydantic model class or TypedDict, a compiled regex, a list of choices); the answer ends as
    soon as the format is complete.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    max_new_tokens: int = Field(default=256, ge=1, le=32_768)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    response_format: ResponseFormat | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        # one string is one stop, not its characters; a list (LangChain's, LlamaIndex's) is a tuple here
        return (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list | tuple) else value

    @field_validator("response_format", mode="before")
    @classmethod
    def _compile(cls, value: Any) -> ResponseFormat | None:
        return None if value is None else ResponseFormat.of(value)

    @field_serializer("response_format")
    def _keep(self, value: ResponseFormat | None) -> ResponseFormat | None:
        # model_dump() feeds GenerationOptions(**...) again: keep the compiled format (and its target type)
        return value

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @classmethod
    def merged(cls, *layers: Mapping[str, Any]) -> GenerationOptions:
        """Options from ``layers`` (a model's settings, then a call's overrides), later layers winning.

        ``None`` values are unset (they do not override), ``max_tokens`` (the frameworks' name)
        means ``max_new_tokens`` unless that is given too, and keys that are not options are ignored:
        the adapters' one way to turn their settings and call keywords into options.
        """
        values: dict[str, Any] = {}
        for layer in layers:
            given = {k: v for k, v in layer.items() if v is not None}
            if "max_tokens" in given:
                given.setdefault("max_new_tokens", given.pop("max_tokens"))
            values.update((k, v) for k, v in given.items() if k in cls.model_fields)
        return cls(**values)


@dataclass
class DecodeState:
    """What a finished (or running) decode produced; filled in while the stream is consumed."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    first_token_seconds: float | None = None


def token_mask(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, options: GenerationOptions, eos: set[int]
) -> TokenMask | None:
    """The grammar walker of ``options.response_format`` for one answer, or None without a format."""
    if options.response_format is None:
        return None
    vocab = model.get_output_embeddings().out_features
    fmt = options.response_format.within(options.max_new_tokens)
    return TokenMask(fmt, ll_tokenizer(tokenizer, vocab, eos))


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
    if cache.layers and isinstance(cache.layers[0], HeadwiseLayer | KeptLayer) and not headwise_ready(model):
        # registered once when the engine is built, never here: a model may be answering other questions
        raise ValueError(
            "a head-wise or kept cache needs the model's registered attention: register_headwise_attention(model)"
        )
    device = model.device
    eos = eos_token_ids(model, tokenizer)
    warpers = _warpers(options) if options.sampling else None
    mask = token_mask(model, tokenizer, options, eos)
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
            cache=cache,
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
        if mask is not None:
            mask.apply(logits)
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
        if mask is not None:
            mask.advance(token)
        state.token_ids.append(token)
        text = tokenizer.decode(state.token_ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            piece, stopped = stops.feed(text)
            if piece:
                yield piece
            if stopped:
                state.finish_reason = "stop"
                return
        if mask is not None and mask.finished:
            state.finish_reason = "stop"
            break
        if len(state.token_ids) >= options.max_new_tokens:
            state.finish_reason = "length"
            break
        out = model(
            input_ids=torch.tensor([[token]], device=device),
            position_ids=torch.tensor([[position]], device=device),
            cache=cache,
            use_cache=True,
        )
        logits = out.logits[0, -1].float()
        position += 1
    tail = stops.flush(tokenizer.decode(state.token_ids, skip_special_tokens=True).rstrip("\ufffd"))
    if tail:
        yield tail
