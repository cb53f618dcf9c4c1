"""Which float type a model runs in: ``dtype="auto"`` picks bfloat16 on a CPU that computes it faster.

CPUs differ: where oneDNN has bfloat16 kernels (AVX512_BF16, AMX) a bfloat16 linear layer runs
2.5-4.5x faster than a float32 one; on AVX2-only CPUs it is slower. CPU flags alone do not say
which (torch's build decides which kernels it uses), so the choice is a short timed probe
(about 0.1 s, once per process) of the shape that dominates prefill: a [512, 1536] x [1536, 1536]
linear layer in both types. On CUDA, ``auto`` is bfloat16 where the device supports it, else
float16. ``$HOMER_INTEGRATIONS_DTYPE`` overrides ``auto`` everywhere (CLI, API, adapters by name).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from homer_integrations.homer.reading.budget import linear_seconds

logger = logging.getLogger(__name__)

DTYPE_ENV = "HOMER_INTEGRATIONS_DTYPE"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16_MIN_SPEEDUP = 1.3
"""bfloat16 must beat float32 by this factor on the probe before ``auto`` takes it on a CPU: the
answers move slightly with the dtype (``benchmarks/results/dtype_parity.json``), so a tie keeps float32."""


@functools.cache
def cpu_bf16_speedup() -> float:
    """float32 seconds over bfloat16 seconds for a prefill-shaped linear layer on this CPU (cached)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1536, generator=generator)
    w = torch.randn(1536, 1536, generator=generator)
    fp32 = linear_seconds(x, w)
    bf16 = linear_seconds(x.bfloat16(), w.bfloat16())
    return fp32 / bf16


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    """A ``torch.dtype`` for a dtype or its name (``"bfloat16"``, ``"torch.float32"``), or ``"auto"``."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_dtype(dtype: torch.dtype | str, device: torch.device | None) -> torch.dtype:
    """The float type to load in: ``dtype`` itself, or for ``"auto"`` ``$HOMER_INTEGRATIONS_DTYPE``
    or the fast one for ``device`` (None: the CPU). Logs the automatic choice and why."""
    dtype = parse_dtype(dtype)
    if dtype == "auto" and os.environ.get(DTYPE_ENV, "auto") != "auto":
        dtype = parse_dtype(os.environ[DTYPE_ENV])
    if isinstance(dtype, torch.dtype):
        return dtype
    if device is not None and device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device is not None and device.type != "cpu":
        return torch.float32
    return _cpu_auto()


@functools.cache
def _cpu_auto() -> torch.dtype:
    speedup = cpu_bf16_speedup()
    chosen = torch.bfloat16 if speedup >= BF16_MIN_SPEEDUP else torch.float32
    logger.info(
        "dtype=auto: %s on this CPU (bfloat16 runs a linear layer %.1fx as fast as float32; %s=float32 overrides)",
        str(chosen).removeprefix("torch."),
        speedup,
        DTYPE_ENV,
    )
    return chosen
