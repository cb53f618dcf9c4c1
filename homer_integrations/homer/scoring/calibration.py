"""Calibration of pruning scores: the expected last-token logit per layer and distance (paper, section 4).

Last-token attention prefers nearby tokens; without removing that preference pruning keeps only
the end of each chunk. ``bias[l, d]`` is the mean over calibration text of the max-over-heads
raw logit from a query to the key ``d`` positions before it, at layer ``l``. It depends on the
model, its RoPE settings, the chunk length and the dtype, so it is stored under a key of all four.

The paper averages the last query row of ~100 segments. We also average the last
``query_rows`` rows of each segment (each row contributes the distances it can see), which
estimates the same expectation with far less text: 48 segments x 16 rows of a 1k-token window
take a few minutes on a laptop CPU instead of half an hour.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import DynamicCache

from homer_integrations.homer.document.prompt import encode
from homer_integrations.homer.model.decoder import DecoderStack
from homer_integrations.homer.model.fingerprint import rope_settings, weights_fingerprint
from homer_integrations.homer.scoring.scorers import attention_logits

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1

SEGMENTS = 48
"""Segments of ``max_chunk_len`` tokens a computed table averages by default (``Calibration``'s ``segments``;
an engine takes it from ``strategies.Recipe.calibration_segments``)."""


@dataclass(frozen=True)
class CalibrationKey:
    """What a calibration table depends on."""

    model_fingerprint: str
    rope: str
    max_chunk_len: int
    dtype: str

    @classmethod
    def for_stack(cls, stack: DecoderStack, max_chunk_len: int) -> CalibrationKey:
        return cls(
            # a quantized model is calibrated as the float model it came from (``quantization.quantize``)
            model_fingerprint=getattr(stack.model.config, "homer_calibration_fingerprint", None)
            or weights_fingerprint(stack.model),
            rope=json.dumps(rope_settings(stack.model), sort_keys=True, default=str),
            max_chunk_len=max_chunk_len,
            dtype=str(stack.dtype).removeprefix("torch."),
        )

    @property
    def id(self) -> str:
        blob = json.dumps([FORMAT_VERSION, *self.__dict__.values()], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


@torch.inference_mode()
def compute_bias(
    stack: DecoderStack,
    token_ids: torch.Tensor,
    max_chunk_len: int,
    segments: int,
    query_rows: int = 16,
    progress: bool = True,
) -> torch.Tensor:
    """Bias table [num_layers, max_chunk_len] from ``segments`` windows of ``token_ids`` [N].

    Windows are spread evenly over the text; each runs a plain causal forward of all layers.
    """
    n = token_ids.numel()
    if n < max_chunk_len:
        raise ValueError(f"calibration text has {n} tokens, fewer than max_chunk_len={max_chunk_len}")
    starts = torch.linspace(0, n - max_chunk_len, segments).long().tolist()
    rows = min(query_rows, max_chunk_len)
    total = torch.zeros(stack.num_layers, max_chunk_len, dtype=torch.float64)
    count = torch.zeros(max_chunk_len, dtype=torch.float64)
    positions = torch.arange(max_chunk_len)
    query_pos = positions[-rows:]
    # distance[r, j] from query row r to key j; negative (future) entries are masked out.
    distance = query_pos[:, None] - positions[None, :]
    valid = distance >= 0
    flat_distance = distance.clamp(min=0)[valid]
    count.index_add_(0, flat_distance, torch.ones_like(flat_distance, dtype=torch.float64) * segments)
    for start in tqdm(starts, desc="HOMER calibration", unit="segment", disable=not progress):
        hidden = stack.embed(token_ids[start : start + max_chunk_len])
        rope = stack.rotary(hidden, positions)
        cache = DynamicCache()
        for layer_idx in range(stack.num_layers):
            hidden, queries = stack.attention(layer_idx, hidden, rope, cache, query_rows=rows)
            keys = cache.layers[layer_idx].keys
            logits = torch.stack(
                [attention_logits(queries[:, :, r : r + 1], keys, stack.scaling).amax(0) for r in range(rows)]
            )  # [rows, T]
            total[layer_idx].index_add_(0, flat_distance, logits[valid].double().cpu())
            hidden = stack.mlp(layer_idx, hidden)
    return (total / count).float()


class CalibrationStore:
    """Finds a bias table by key in the bundled directory, then the user's; computes and saves it otherwise."""

    def __init__(self, user_dir: Path, bundled_dir: Path | None = None) -> None:
        self.user_dir = Path(user_dir)
        self.bundled_dir = bundled_dir

    def path_for(self, key: CalibrationKey) -> Path:
        return self.user_dir / f"{key.id}.safetensors"

    def locate(self, key: CalibrationKey) -> Path | None:
        """The first readable table file for ``key``: bundled, then the user's."""
        for directory in (self.bundled_dir, self.user_dir):
            if directory is None:
                continue
            path = Path(directory) / f"{key.id}.safetensors"
            if path.is_file() and self._load(path, key) is not None:
                return path
        return None

    def find(self, key: CalibrationKey) -> torch.Tensor | None:
        path = self.locate(key)
        return None if path is None else self._load(path, key)

    def _load(self, path: Path, key: CalibrationKey) -> torch.Tensor | None:
        try:
            bias = load_file(str(path))["bias"]
        except (SafetensorError, KeyError, OSError) as exc:
            logger.warning("ignoring unreadable calibration file %s (%s)", path, exc)
            return None
        if tuple(bias.shape)[1:] != (key.max_chunk_len,) or not torch.isfinite(bias).all():
            logger.warning("ignoring calibration file %s: wrong shape or non-finite values", path)
            return None
        return bias

    def save(self, key: CalibrationKey, bias: torch.Tensor, segments: int) -> Path:
        self.user_dir.mkdir(parents=True, exist_ok=True)
        path = self.path_for(key)
        tmp = path.with_suffix(".tmp")
        meta = {
            **{k: str(v) for k, v in key.__dict__.items()},
            "segments": str(segments),
            "format_version": str(FORMAT_VERSION),
        }
        save_file({"bias": bias.contiguous()}, str(tmp), metadata=meta)
        tmp.replace(path)
        return path

    def get_or_compute(
        self,
        stack: DecoderStack,
        key: CalibrationKey,
        text: str,
        tokenizer,
        segments: int,
        progress: bool = True,
    ) -> torch.Tensor:
        bias = self.find(key)
        if bias is not None:
            return bias
        logger.info(
            "calibrating HOMER pruning for this model (max_chunk_len=%d, %d segments); done once and cached in %s",
            key.max_chunk_len,
            segments,
            self.user_dir,
        )
        ids = encode(tokenizer, text)  # plain text, under the tokenizer lock ``encode`` shares
        bias = compute_bias(stack, ids, key.max_chunk_len, segments, progress=progress)
        self.save(key, bias, segments)
        return bias


class Calibration:
    """One engine's bias table: found in ``store`` (bundled or the user's) or computed once, on first need,
    over ``text()`` (the engine passes a bundled novel).

    ``needed`` False (a scorer that reads no bias): ``bias()`` and ``path()`` are None, nothing is
    computed, and ``id`` is ``"none"``. Thread-safe: concurrent first callers compute it once.
    """

    def __init__(
        self,
        store: CalibrationStore,
        stack: DecoderStack,
        max_chunk_len: int,
        segments: int,
        tokenizer,
        needed: bool,
        text: Callable[[], str],
    ) -> None:
        self.store, self.stack, self.segments, self.tokenizer = store, stack, segments, tokenizer
        self.text = text
        self.key = CalibrationKey.for_stack(stack, max_chunk_len) if needed else None
        self._bias: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        """What a document-cache key records of the calibration."""
        return "none" if self.key is None else self.key.id

    def bias(self, progress: bool = True) -> torch.Tensor | None:
        """The table [num_layers, max_chunk_len]; calibrates on ``text()`` the first time (minutes)."""
        if self.key is None:
            return None
        with self._lock:
            if self._bias is None:
                self._bias = self.store.get_or_compute(
                    self.stack, self.key, self.text(), self.tokenizer, self.segments, progress=progress
                )
            return self._bias

    def path(self) -> Path | None:
        """Where the table is read from (bundled or user cache); None if not computed yet or not needed."""
        return None if self.key is None else self.store.locate(self.key)
