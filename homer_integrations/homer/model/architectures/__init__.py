"""Which decoder architectures the engine runs: one ``Family`` per architecture, one small module each.

Adding a family: subclass ``Family`` (base.py) in a new module, override the hooks where the
architecture differs from the Llama layout, and list the class in ``FAMILIES`` below.
"""

from __future__ import annotations

from transformers import PretrainedConfig, PreTrainedModel

from homer_integrations.homer.model.architectures.base import CosSin, Family, UnsupportedModelError
from homer_integrations.homer.model.architectures.gemma3 import Gemma3Family
from homer_integrations.homer.model.architectures.llama import LlamaFamily
from homer_integrations.homer.model.architectures.phi3 import Phi3Family
from homer_integrations.homer.model.architectures.qwen3 import Qwen3Family

FAMILIES: dict[str, type[Family]] = {
    model_type: family
    for family in (LlamaFamily, Qwen3Family, Gemma3Family, Phi3Family)
    for model_type in family.model_types
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)

__all__ = [
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "CosSin",
    "Family",
    "UnsupportedModelError",
    "check_supported",
    "family_for",
]


def check_supported(config: PretrainedConfig) -> None:
    """Raise ``UnsupportedModelError`` unless ``config`` is a decoder of a supported family and settings."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type or "")
    if family is None:
        hint = " (load the text-only Gemma3ForCausalLM)" if model_type == "gemma3" else ""
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported{hint}; HOMER runs RoPE decoders of these types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family.check(config)


def family_for(model: PreTrainedModel) -> Family:
    """The family unit that runs ``model``'s layers (checked first)."""
    check_supported(model.config)
    return FAMILIES[model.config.model_type](model)
