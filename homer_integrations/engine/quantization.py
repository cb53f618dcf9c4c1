"""Optional int8 weights for CPU inference: every linear layer quantized dynamically.

``torch.ao.quantization.quantize_dynamic`` stores each ``nn.Linear`` weight as int8 (per output
channel scales) and quantizes activations on the fly, using the fbgemm/onednn int8 kernels; the
embeddings, norms and the KV cache stay in the model's float dtype, so HOMER's compression and its
caches are unchanged in shape. torch marks these APIs deprecated in favour of torchao, whose CPU
int8 path needs a compiled kernel build we cannot rely on offline; this one ships inside torch.
Speed and accuracy against fp32: ``benchmarks/int8.py``.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from transformers import PreTrainedModel

Quantization = Literal["int8"]
QUANTIZATIONS: tuple[Quantization, ...] = ("int8",)


def quantize(model: PreTrainedModel, how: Quantization) -> PreTrainedModel:
    """``model`` with its linear layers in int8 (in place, returned); CPU float32 models only.

    Raises ``ValueError`` for another scheme, a model not on the CPU or not in float32.
    """
    if how not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {how!r}; supported: {', '.join(QUANTIZATIONS)}")
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(
            f"int8 weights are a CPU path for float32 models; this one is {weight.dtype} on {weight.device}"
        )
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from homer_integrations.homer.model.fingerprint import weights_fingerprint

    # Pruning calibration (the mean attention logit by distance) is a property of the float model
    # that int8 weights barely move, so the quantized model keeps using the float model's table.
    model.config.homer_calibration_fingerprint = weights_fingerprint(model)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # torch.ao's deprecation notices
        warnings.simplefilter("ignore", category=DeprecationWarning)
        quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    model.config.homer_quantization = how
    return model
