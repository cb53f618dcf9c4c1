"""Our own loop over a decoder's modules, split at the point where HOMER prunes.

transformers' decoder layers run attention and MLP in one call; HOMER must prune between the
two (after attention + residual, before the MLP) and needs the last token's rotated query.
Calling the layer's own submodules in the same order keeps the model's numerics, every
attention backend (SDPA, flash-attn) and RoPE scaling, without patching any class. What differs
between architectures (norms, fused projections, per-layer RoPE tables and windows) lives in
one ``Family`` per architecture (``homer.model.architectures``).

Sliding-window layers (Gemma-3, Mistral, Phi-3 configs with a window) see the last ``window``
tokens in sequence order, in leaves and merged nodes alike: the same rule transformers' own mask
applies when it decodes after the compressed cache, so compression and decoding agree. Every
layer still caches every token, so all layers keep equal lengths (propagative refinement).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from homer_integrations.homer.model.architectures import CosSin, Family, family_for

MLP_ROWS = 1024
"""Rows the feed-forward half runs at once. It acts on each token alone, so blocks of rows give the
same rows (up to float rounding of the smaller matrix products) while its intermediate activations
(about 3 x [rows, intermediate_size]) stay one block's size instead of a whole leaf's."""

ATTENTION_ROWS = 1024
"""Query rows the attention half runs at once, each block appending its keys and values before the
next attends to them (a chunked prefill: the same rows up to float rounding). Rows after cached
tokens need an explicit mask [rows, past + rows] (see ``_layer_mask``), and transformers then
expands the keys and values to every query head; blocks keep both one block's size instead of a
whole leaf's (float32 mask of an 8k leaf: 256 MB, built twice). Measured on an 8k shared
compression of Qwen2.5-Coder-0.5B: 86 MB less peak RSS than whole leaves, a little faster (README)."""

ACCELERATOR_ROWS = 8192
"""Rows per block of either half on an accelerator (SDPA or flash-attn): there each block is another
round of kernel launches, which set the pace of a HOMER build, while a block's float mask after a
cache (rows x keys: 1 GB for 8,192 rows after 24k keys in fp32, in a 32k ``full`` prefill) fits.
Measured (``benchmarks/root_overhead.py``, 24 tiny-width layers): on an H100 the shared root built in
0.60-0.65 of the time of 1,024-row blocks, on a CPU 1.16-1.19x slower, hence a size per device. Eager
attention keeps the CPU sizes: it materialises every head's scores [H, R, past + R]."""

RopeTables = dict[str, CosSin]
"""cos, sin [1, T, d] per RoPE table the layers use (one for most models; Gemma-3: global and local)."""


class DecoderStack:
    """Layer-by-layer access to a supported ``*ForCausalLM`` model.

    Shapes: hidden states [1, T, D]; position ids [T]; cos/sin [1, T, d]; a layer's cached keys
    and values [1, Hkv, T, d]; queries [1, H, T, d].
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.family: Family = family_for(model)  # raises UnsupportedModelError first
        self.model = model
        self.backbone = model.model
        self.layers = self.backbone.layers
        self.num_layers = len(self.layers)
        attn = self.layers[0].self_attn
        self.head_dim: int = attn.head_dim
        self.scaling: float = attn.scaling
        self.num_heads: int = model.config.num_attention_heads
        self.num_kv_heads: int = model.config.num_key_value_heads

    @property
    def device(self) -> torch.device:
        return self.backbone.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.embed_tokens.weight.dtype

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised tensor of the model's dtype on its device."""
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [1, T, D] input embeddings (scaled where the model's embedding scales)."""
        return self.backbone.embed_tokens(input_ids.to(self.device)[None])

    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> RopeTables:
        """The RoPE tables for ``position_ids`` [T], with the config's RoPE scaling applied."""
        return self.family.rotary(hidden, position_ids.to(self.device)[None])

    def window(self, layer_idx: int) -> int | None:
        """Tokens a query of this layer sees, itself included (sliding window), or None for all."""
        return self.family.window(layer_idx)

    def turns(self, delta: torch.Tensor) -> RopeTables:
        """cos, sin [1, K, d] (float32) per RoPE table that turn keys ``delta`` [K] positions further (RoPE
        composes: R(p + q) = R(q) R(p)). A table's attention factor (YaRN) divides out: keys carry it already."""
        probe = torch.zeros(1, 1, 1, dtype=torch.float32, device=self.device)
        tables = self.family.rotary(probe, delta.to(self.device)[None])
        still = self.family.rotary(probe, torch.zeros(1, 1, dtype=torch.long, device=self.device))
        return {
            kind: (cos.float() / still[kind][0][0, 0, 0], sin.float() / still[kind][0][0, 0, 0])
            for kind, (cos, sin) in tables.items()
        }

    def turned_keys(self, keys: torch.Tensor, layer_idx: int, turns: RopeTables) -> torch.Tensor:
        """Layer ``layer_idx``'s cached keys [1, Hkv, K, d], rotated at their old positions, turned by ``turns``
        (``turns(delta)``, one for every layer); computed in float32, returned in the keys' dtype."""
        turned = self.family.rotate(keys.float(), turns[self.family.rope_kind(layer_idx)])
        return turned.to(keys.dtype)

    def attention(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        rope: RopeTables,
        cache: DynamicCache,
        query_rows: int = 0,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal self-attention of layer ``layer_idx`` with the residual added.

        The layer's rotated keys/values are appended to ``cache`` (layer ``layer_idx``); the new
        rows attend to the tokens already there and to each other, causally and within the
        layer's window. Returns the new hidden states [1, T, D] and, if ``query_rows`` > 0, the
        rotated queries [1, H, R, d] of the last R tokens exactly as the attention used them
        (pruning uses the last one, calibration several). Each layer's mask follows from the
        cache length and the layer's window. A batch of B sequences ([B, T, D], the cache [B, Hkv, K, d])
        may add ``key_mask`` [B, 1, 1, K + T] (0 or the dtype's minimum) to hide keys of some of them
        (not with flash-attn, whose layers take no mask).
        """
        cos_sin = rope[self.family.rope_kind(layer_idx)]
        window = self.family.window(layer_idx)
        total = hidden.shape[1]
        outputs, normed_tail = [], []
        block_rows = self._block_rows(ATTENTION_ROWS)
        empty = layer_idx >= len(cache.layers) or cache.layers[layer_idx].get_seq_length() == 0
        if empty and total <= ACCELERATOR_ROWS and self._causal_flag(window, 0, total, key_mask is not None):
            # Nothing cached and no mask to build: one block, whose causal flag lets SDPA skip the masked
            # half that blocks after the first compute under their masks (a whole book's 2k re-read on
            # two CPU cores: the first token 1.1 s sooner, research/attention_blocks.py).
            block_rows = total
        for start in range(0, total, block_rows):
            block = slice(start, start + block_rows)
            past = cache.layers[layer_idx].get_seq_length() if layer_idx < len(cache.layers) else 0
            rows = hidden[:, block]
            layer_mask = self._layer_mask(window, past, rows.shape[1], explicit=key_mask is not None)
            if key_mask is not None:
                seen = key_mask[..., : past + rows.shape[1]]
                layer_mask = seen if layer_mask is None else layer_mask + seen
            out, normed = self.family.attend(
                layer_idx, rows, (cos_sin[0][:, block], cos_sin[1][:, block]), cache, layer_mask
            )
            outputs.append(out)
            if start + rows.shape[1] > total - query_rows:  # a block holding some of the last R rows
                normed_tail.append(normed)
        hidden = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        query = None
        if query_rows:
            r = query_rows
            normed = torch.cat(normed_tail, dim=1)[:, -r:]
            query = self.queries(layer_idx, normed, (cos_sin[0][:, -r:], cos_sin[1][:, -r:]))
        return hidden, query

    @property
    def backend(self) -> str:
        """The model's attention implementation (``sdpa``, ``eager``, ``flash_attention_2``, ...), seen
        through a registered wrapper that names the one it calls in ``wraps`` (the head-wise attention,
        ``kv.headwise``, which calls it for every dense cache)."""
        name = str(self.model.config._attn_implementation)
        return getattr(ALL_ATTENTION_FUNCTIONS.get(name), "wraps", name)

    def _block_rows(self, cpu_rows: int) -> int:
        """Rows per block: ``cpu_rows`` on a CPU or with eager attention, else ``ACCELERATOR_ROWS``."""
        eager = self.backend == "eager"
        return cpu_rows if self.device.type == "cpu" or eager else ACCELERATOR_ROWS

    def _causal_flag(self, window: int | None, past: int, rows: int, explicit: bool = False) -> bool:
        """Whether R rows after ``past`` cached tokens need no mask: the backend's own causal flag is right
        (see ``_layer_mask``)."""
        windowed = window is not None and past + rows > window
        implicit = not explicit and not windowed and (past == 0 or rows == 1)
        return "flash" in self.backend or (self.backend == "sdpa" and implicit)

    def _layer_mask(self, window: int | None, past: int, rows: int, explicit: bool = False) -> torch.Tensor | None:
        """Additive mask [1, 1, R, past + R]: row i sees keys j with ``past + i - window < j <= past + i``.

        None where the backend's causal flag is right: SDPA's ``is_causal`` aligns the triangle
        top-left (and transformers then drops the cached keys), so rows after a cache need a mask;
        flash-attn aligns bottom-right and applies the module's own window by itself; eager
        attention has no causal flag and always needs the mask. ``explicit``: a key mask will be added
        to it, and SDPA drops ``is_causal`` once given any mask, so a causal mask is built for SDPA too.
        """
        if self._causal_flag(window, past, rows, explicit):
            return None
        windowed = window is not None and past + rows > window
        query_at = past + torch.arange(rows, device=self.device)[:, None]
        key_at = torch.arange(past + rows, device=self.device)[None, :]
        seen = key_at <= query_at
        if windowed:
            seen &= key_at > query_at - window
        mask = torch.zeros(rows, past + rows, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~seen, torch.finfo(self.dtype).min)[None, None]

    def queries(self, layer_idx: int, normed_rows: torch.Tensor, rope_rows: CosSin) -> torch.Tensor:
        """Rotated queries [1, H, R, d] of R tokens from their normed hidden states [1, R, D].

        ``rope_rows`` are those tokens' cos/sin [1, R, d] from the layer's RoPE table. The
        attention module does not expose its queries, so the family recomputes them from the
        module's own projection and query norm (R is 1 when pruning).
        """
        return self.family.rotate(self.family.query_states(layer_idx, normed_rows), rope_rows)

    def mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's MLP block with its residual (and norms): [1, T, D] -> [1, T, D], in blocks of
        ``MLP_ROWS`` rows (``ACCELERATOR_ROWS`` on an accelerator)."""
        block_rows = self._block_rows(MLP_ROWS)
        if hidden.shape[1] <= block_rows:
            return self.family.feed_forward(layer_idx, hidden)
        # not transformers' apply_chunking_to_forward: it refuses a T that is no multiple of the block
        blocks = [self.family.feed_forward(layer_idx, rows) for rows in hidden.split(block_rows, dim=1)]
        return torch.cat(blocks, dim=1)

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the last position only: [1, 1, D] -> [V] float32."""
        return self.family.logits(hidden_last)
