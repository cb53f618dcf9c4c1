"""Cheap, stable identities for a model's weights and for document texts, used in calibration and
document-cache keys."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

import torch
from transformers import PreTrainedModel


def _rope_settings(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return {k: rope[k] for k in sorted(rope)} if isinstance(rope, dict) else {"rope": str(rope)}


def rope_settings(model: PreTrainedModel) -> dict:
    """The model's RoPE parameters (type, theta, scaling), sorted: part of every calibration key."""
    return _rope_settings(model.config)


@torch.inference_mode()
def weights_fingerprint(model: PreTrainedModel, sample: int = 2048) -> str:
    """sha256 over the architecture and samples of a few weight tensors (first/last ``sample`` values).

    Hashing every weight would take seconds for large models; the sampled tensors (embeddings,
    first attention, last MLP, final norm) change whenever a fine-tune or a conversion does.
    """
    c = model.config
    h = hashlib.sha256()
    arch = {
        "type": c.model_type,
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "vocab": c.vocab_size,
        "rope": _rope_settings(c),
    }
    if getattr(c, "homer_quantization", None):  # only then: float models keep their fingerprints
        arch["quantization"] = c.homer_quantization
    h.update(json.dumps(arch, sort_keys=True, default=str).encode())
    backbone = model.model
    tensors = [
        backbone.embed_tokens.weight,
        dense_weight(backbone.layers[0].self_attn.q_proj),
        dense_weight(backbone.layers[-1].mlp.down_proj),
        backbone.norm.weight,
    ]
    for t in tensors:
        flat = t.detach().reshape(-1)
        part = torch.cat([flat[:sample], flat[-sample:]]).float().cpu().contiguous()
        h.update(part.numpy().tobytes())
    return h.hexdigest()[:32]


def dense_weight(linear: torch.nn.Module) -> torch.Tensor:
    """A linear layer's weight as a float tensor, plain or dynamically quantized (``weight()``)."""
    weight = linear.weight
    return weight().dequantize() if callable(weight) else weight


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 over the tokenizer's vocabulary, special tokens and chat template."""
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    h.update(json.dumps([tokenizer.bos_token, tokenizer.eos_token, tokenizer.chat_template]).encode())
    return h.hexdigest()[:32]


class TextDigests:
    """sha256 of recent document texts, so each text is hashed once however many questions it gets.

    A dict keyed by the text itself finds it again with Python's own string hash (kept on the string
    object, far cheaper than sha256 for a new object) and one comparison; bounded, least recent out.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._digests: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> bytes:
        """The 32-byte sha256 of ``text`` (UTF-8; lone surrogates kept)."""
        with self._lock:
            digest = self._digests.get(text)
            if digest is not None:
                self._digests.move_to_end(text)
                return digest
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            self._digests[text] = digest
            while len(self._digests) > self._size:
                self._digests.popitem(last=False)
        return digest
