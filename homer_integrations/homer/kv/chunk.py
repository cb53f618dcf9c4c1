"""The state of one node of the merge tree while its layers run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache

from homer_integrations.homer.kv.dynamic import cache_from_tensors, layer_tensors, tensors_nbytes


@dataclass
class Chunk:
    """A chunk of T tokens: prefix (P) + document tokens + suffix (S), in sequence order.

    Attributes:
        hidden: [1, T, D] hidden states entering the next layer this node runs.
        position_ids: [T] RoPE positions; repeated and non-monotonic after merges.
        reducible: [T] True on document tokens (only those may be pruned).
        origin: [T] index of each token in the document, -1 on prefix and suffix tokens.
        memory: [T] best normalised score each token received at the nodes it passed (-inf before
            its first pruning); used when scores are remembered across levels.
        prefix_len, suffix_len: P and S.
        cache: ``DynamicCache`` whose layers 0..n-1 hold this chunk's rotated keys and values,
            [1, Hkv, T, d] each, for every layer computed so far (lower tree levels included).
    """

    hidden: torch.Tensor
    position_ids: torch.Tensor
    reducible: torch.Tensor
    origin: torch.Tensor
    memory: torch.Tensor
    prefix_len: int
    suffix_len: int
    cache: DynamicCache = field(default_factory=DynamicCache)

    @property
    def length(self) -> int:
        return self.position_ids.numel()

    @property
    def document(self) -> slice:
        return slice(self.prefix_len, self.length - self.suffix_len)

    @property
    def prefix(self) -> slice:
        return slice(0, self.prefix_len)

    @property
    def suffix(self) -> slice:
        return slice(self.length - self.suffix_len, self.length)

    @property
    def kv_bytes(self) -> int:
        keys, values = layer_tensors(self.cache)
        return tensors_nbytes(keys) + tensors_nbytes(values)

    def scores_only(self) -> Chunk:
        """This chunk without its states (hidden [1, T, 0], no cached layers): all that a selection
        which only ranks tokens needs to merge and prune, without copying K/V it will not use."""
        return replace(self, hidden=self.hidden[:, :, :0], cache=cache_from_tensors([], []))

    def keep(self, mask: torch.Tensor) -> None:
        """Propagative refinement: keep the tokens where ``mask`` [T] is True in EVERY cached layer.

        Hidden states, positions and the reducible mask are cut the same way, so all layers
        keep holding the same tokens in the same order.
        """
        index = mask.nonzero().squeeze(1)
        self.hidden = self.hidden.index_select(1, index.to(self.hidden.device))
        self.position_ids = self.position_ids[index]
        self.reducible = self.reducible[index]
        self.origin = self.origin[index]
        self.memory = self.memory[index]
        dev_index = index.to(self.hidden.device)
        keys, values = layer_tensors(self.cache)
        self.cache = cache_from_tensors(
            [k.index_select(2, dev_index) for k in keys], [v.index_select(2, dev_index) for v in values]
        )
