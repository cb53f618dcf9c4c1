"""Which decoder architectures the engine runs, and a clear error for the others."""

from __future__ import annotations

from transformers import PretrainedConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class UnsupportedModelError(ValueError):
    """The model cannot run HOMER (architecture, attention layout or settings)."""


def check_supported(config: PretrainedConfig) -> None:
    """Raise ``UnsupportedModelError`` unless ``config`` is a full-attention Llama-family RoPE decoder."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported; HOMER runs Llama-family RoPE decoders with full "
            f"attention: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        kinds = sorted(set(layer_types))
        raise UnsupportedModelError(
            f"{model_type} model with layer types {kinds} is not supported: HOMER needs full attention in "
            f"every layer (sliding-window layers would drop merged tokens); supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} with full attention"
        )
    if getattr(config, "num_hidden_layers", 0) < 2:
        raise UnsupportedModelError("HOMER needs a model with at least 2 decoder layers")
