"""Llama, Mistral and Qwen2 (and Llama-3 RoPE scaling, which the model's rotary module applies)."""

from __future__ import annotations

from homer_integrations.homer.model.architectures.base import Family


class LlamaFamily(Family):
    """The base layout as is; sliding windows (Mistral, windowed Qwen2) come from the config."""

    model_types = ("llama", "mistral", "qwen2")
