"""``EncodedDocument``: one call's prompt around a document, tokenized once and handed to every unit."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from homer_integrations.homer.document.prompt import unit_ids, units_at


@dataclass(frozen=True, eq=False)
class EncodedDocument:
    """Token ids of prefix [P], document [N] and suffix [S] of one compression, and the document's text.

    ``units(unit)`` [N] (each document token's word, sentence or statement index) is computed on first
    ask and kept, so a call that needs one unit twice (the leaf tier's pruning units and a question's
    statements) splits the text once; from ``offsets`` [N, 2] (each document token's character span, given
    by the tokenizer call that gave the ids) without tokenizing the text again. The ids are never changed
    in place.
    """

    text: str
    prefix_ids: torch.Tensor
    document_ids: torch.Tensor
    suffix_ids: torch.Tensor
    tokenizer: PreTrainedTokenizerBase = field(repr=False)
    offsets: torch.Tensor | None = field(default=None, repr=False)
    _units: dict[str, torch.Tensor | None] = field(default_factory=dict, repr=False)

    @property
    def prompt_len(self) -> int:
        """P + N + S."""
        return self.prefix_ids.numel() + self.document_ids.numel() + self.suffix_ids.numel()

    @property
    def fixed_len(self) -> int:
        """P + S: the tokens around the document, which are never pruned."""
        return self.prefix_ids.numel() + self.suffix_ids.numel()

    def units(self, unit: str) -> torch.Tensor | None:
        """Unit index [N] of every document token for ``unit`` (a ``Scoring.unit``: ``token`` gives None),
        None too where the tokenizer's offsets do not line up with the ids (token scores then)."""
        if unit not in self._units:
            if self.offsets is None:
                found = unit_ids(self.tokenizer, self.text, unit)
            else:
                found = units_at(self.text, self.offsets, unit)
            self._units[unit] = None if found is None or found.numel() != self.document_ids.numel() else found
        return self._units[unit]
