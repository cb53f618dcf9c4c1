"""Opening the document cache and loading the engine for a ``homer-qa`` command, failing as one line."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from homer_integrations.cli.common import EXIT_USAGE, CliError

if TYPE_CHECKING:  # the heavy imports (torch, transformers) wait until a command needs them
    from homer_integrations.cache import DocumentCache
    from homer_integrations.engine.model import HomerModel
    from homer_integrations.homer.config import HomerConfig


def open_cache(args: argparse.Namespace) -> DocumentCache:
    """The cache ``--cache-dir``, ``--store``, ``--max-bytes``, ``--keyed`` and ``--no-disk-cache`` name."""
    from homer_integrations.cache import DocumentCache

    given = [name for name, on in (("--cache-dir", args.cache_dir), ("--store", args.store)) if on is not None]
    if getattr(args, "no_disk_cache", False):
        given.append("--no-disk-cache")
    if len(given) > 1:
        raise CliError(f"{' and '.join(given)} name different caches: give one", EXIT_USAGE)
    if getattr(args, "no_disk_cache", False):
        if getattr(args, "keyed", False):
            raise CliError("--keyed signs the entries of a store; --no-disk-cache keeps none", EXIT_USAGE)
        return DocumentCache()
    from homer_integrations.cache.secret import CacheSecretError
    from homer_integrations.cache.store import DiskBudgetError

    where = args.store or (args.cache_dir if args.cache_dir is not None else True)
    named = f"--store {args.store}" if args.store else f"--cache-dir {args.cache_dir}" if args.cache_dir else "cache"
    try:
        cache = DocumentCache(where, disk_budget_bytes=args.max_bytes, keyed=getattr(args, "keyed", False))
        if cache.store is not None:
            cache.store.check()  # no credentials, no such bucket: said now, before a model loads
    except DiskBudgetError as exc:
        raise CliError(f"--max-bytes: {exc}", EXIT_USAGE) from None
    except CacheSecretError as exc:
        raise CliError(f"--keyed: {exc}") from None
    except ValueError as exc:  # a protocol fsspec does not know, a malformed URL
        raise CliError(f"{named}: {exc}", EXIT_USAGE) from None
    except (ImportError, OSError) as exc:  # an fsspec protocol whose package is missing, an unreachable store
        raise CliError(f"{named}: {exc}") from None
    return cache


@functools.lru_cache(maxsize=2)
def load_parts(name: str, dtype: str, device: str | None, quantize: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer), loaded once per process: ``main`` may be called many times (tests, notebooks)."""
    from homer_integrations.engine.loading import load_model

    return load_model(name, dtype=dtype, device=device, quantize=quantize)  # type: ignore[arg-type]


def engine(
    args: argparse.Namespace, config: HomerConfig, cache: DocumentCache | None, progress: bool | None
) -> HomerModel:
    """A ``HomerModel`` like ``HomerModel.from_pretrained`` builds, over weights loaded once per process."""
    from homer_integrations import HomerModel
    from homer_integrations.engine.loading import DEFAULT_MODEL
    from homer_integrations.homer.model.architectures import UnsupportedModelError

    name = args.model or DEFAULT_MODEL
    model, tokenizer = parts(args)
    limit = {"max_document_tokens": args.max_document_tokens} if hasattr(args, "max_document_tokens") else {}
    try:
        return HomerModel(model, tokenizer, config, model_name=name, document_cache=cache, progress=progress, **limit)
    except UnsupportedModelError as exc:
        raise CliError(f"model {name!r}: {exc}") from None
    except ValueError as exc:  # settings that do not fit the model
        raise CliError(f"model {name!r}: {exc}") from None


def parts(args: argparse.Namespace) -> tuple[Any, Any]:
    """(model, tokenizer) that ``--model``, ``--dtype``, ``--device`` and ``--quantize`` name; problems as one line."""
    from homer_integrations.engine.loading import DEFAULT_MODEL, ModelNotAvailableError

    name = args.model or DEFAULT_MODEL
    check_device(args.device)
    try:
        return load_parts(name, args.dtype, args.device, args.quantize)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    except (OSError, ValueError, ImportError) as exc:
        raise CliError(f"cannot load model {name!r}: {exc}") from None


def check_device(device: str | None) -> None:
    """Refuse a ``--device`` this torch cannot use before any weights load."""
    from homer_integrations.engine.loading import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise CliError(f"--device: {exc}", EXIT_USAGE) from None
