"""Passage echo: a question's own passages, already in a kept ``full`` prefill, appended again right before
it, without reading them again.

A ``full`` prefill holds every document token's K/V, each computed with everything before it. Far back in
a long cache the question's evidence is read less well than right before it. In the kept-forms suite
(``benchmarks/kept_forms.py``: *Northanger Abbey* excerpts of 4k-32k tokens, Qwen2.5-Coder-1.5B in
bfloat16, 96 questions over both splits) the prefill alone answered 67 and the prefill with the K/V of the
question's 512 tokens of BM25 passages copied after it 77 (+0.10 [+0.03, +0.18]): as many as a plain
re-read of those passages after the prefill (77), at 0.19-0.24 of its first-token time held out, since no
layer runs for them. Each copied key is turned by RoPE from its place in the document to its place after the
prefill (``DecoderStack.turned_keys``); values carry no position. A line after them points at them
(``ECHO_LINE``), then the question follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import DynamicCache

from homer_integrations.homer.kv.compressed import CompressedDocument
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.reading.passages import Passages, PassageSelection

ECHO_LINE = "(The passages of the document just before this line may help.)\n\n"
"""What precedes the question after echoed passages (the suite's wording)."""


@dataclass(frozen=True)
class PassageEcho:
    """Which passages a question echoes: ``selection``'s passages BM25 ranks best for it, at most ``tokens``
    tokens, in a document of at least ``min_document_tokens`` (the suite measured 4,096 and up; a short
    document lies near its question whole)."""

    selection: PassageSelection = field(default_factory=PassageSelection)
    tokens: int = 512
    min_document_tokens: int = 2048

    def __post_init__(self) -> None:
        if type(self.tokens) is not int or self.tokens < self.selection.tokens:
            raise ValueError(
                f"PassageEcho.tokens must be a whole number of at least one passage "
                f"({self.selection.tokens} tokens), not {self.tokens!r}"
            )
        if type(self.min_document_tokens) is not int or self.min_document_tokens < 0:
            raise ValueError(
                f"PassageEcho.min_document_tokens must be a whole number >= 0, not {self.min_document_tokens!r}"
            )

    def document_tokens(self, question: str, passages: Passages) -> torch.Tensor | None:
        """Ascending document token indices [M] of the passages ``question`` echoes; None where the document
        is too short or no passage shares a word with the question."""
        if int(passages.stops.max()) < self.min_document_tokens or not passages.index.search(question, 1):
            return None
        taken = self.selection.taken(question, None, passages, self.tokens)
        return torch.cat(taken).sort().values if taken else None


class Echo(NamedTuple):
    """Rows of a kept cache to append after it: ``rows`` [M] (ascending cache rows), and per layer their
    ``keys`` turned to the positions right after the cache and their ``values`` [1, Hkv, M, d]."""

    rows: torch.Tensor
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, stack: DecoderStack, doc: CompressedDocument, document_tokens: torch.Tensor) -> Echo | None:
        """The echo of ``doc``'s cached rows of ``document_tokens`` [M] (those it holds; None if none, or if
        ``doc`` is a head-wise root, whose heads keep different tokens)."""
        if doc.head_lengths is not None:
            return None
        origin = doc.origin.cpu()
        row_of = torch.full((int(origin.max()) + 1,), -1, dtype=torch.long)
        row_of[origin[origin >= 0]] = torch.nonzero(origin >= 0).flatten()
        rows = row_of[document_tokens[document_tokens < row_of.numel()]]
        rows = rows[rows >= 0]
        if rows.numel() == 0:
            return None
        delta = doc.last_position + 1 + torch.arange(rows.numel()) - doc.position_ids.cpu()[rows]
        at = rows.to(doc.keys[0].device)
        turns = stack.turns(delta)
        keys = tuple(stack.turned_keys(k[:, :, at], layer, turns) for layer, k in enumerate(doc.keys))
        return cls(rows, keys, tuple(v[:, :, at] for v in doc.values))

    @property
    def tokens(self) -> int:
        """M: the rows echoed."""
        return self.rows.numel()

    def write(self, cache: DynamicCache) -> None:
        """Append the rows to every layer of ``cache`` (made by ``doc.to_cache``: a ``KeptLayer``'s tail)."""
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            layer.update(keys, values)

    def fold(self, attended: torch.Tensor) -> torch.Tensor:
        """Attention summed over the cache and its echo [K + M] as attention over the cache alone [K]: each
        echoed row's share added to the row it copies."""
        cached = attended.numel() - self.tokens
        folded = attended[:cached].clone()
        folded.index_add_(0, self.rows.to(attended.device), attended[cached:])
        return folded
