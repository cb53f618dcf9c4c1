"""Options several ``homer-qa`` commands take (model, cache, HOMER settings) and their value types."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from homer_integrations.cli.common import (
    DEFAULT_MAX_DOCUMENT_TOKENS,
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MODEL,
    EXIT_USAGE,
    CliError,
)

if TYPE_CHECKING:
    from homer_integrations.homer.config import HomerConfig


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_empty(text: str) -> str:
    """An option's text that must name something (``--store ""`` silently meant the default store)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def non_empty_path(text: str) -> Path:
    return Path(non_empty(text))


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {value}")
    return value


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3}
_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tb": 1000**4, "tib": 1024**4}


def byte_size(text: str) -> int:
    """``500MB``, ``2GiB``, ``1.5G`` or a plain number of bytes."""
    number = text.strip().lower().rstrip("bgikmt")
    unit = text.strip().lower()[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500MB, 2GiB)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return int(value)


def model_options(parser: argparse.ArgumentParser, *, quantize: bool = True) -> None:
    """``--model``, ``--dtype``, ``--device`` and, for commands that load the model here, ``--quantize``."""
    parser.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help=f"embedded model name, local path or hub id (default: {DEFAULT_MODEL}; smollm2-135m-instruct: "
        "10x faster, answers far less)",
    )
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    parser.add_argument("--device", metavar="DEVICE", help="e.g. cpu, cuda, cuda:1 (default: where it loads)")
    if quantize:
        parser.add_argument(
            "--quantize", choices=("int8",), help="int8 linear layers on the CPU (float32 models): faster decoding"
        )


def homer_options(parser: argparse.ArgumentParser, *, warmup: bool = True, split: bool = True) -> None:
    """``--max-chunk-len``, ``--split`` (and ``--warmup-layers``): the HOMER settings a command may change
    (``config``). How the caches are built (``homer.reading.strategies.Recipe``) is for research, not the
    command line."""
    parser.add_argument("--max-chunk-len", type=positive_int, metavar="N", help="HOMER chunk length (tokens)")
    if split:
        parser.add_argument(
            "--split",
            choices=("even", "content"),
            help="how a document is cut into leaves: even (default, the paper's) or content (at statement ends "
            "chosen by the text itself, so a document you edit recomputes only the leaves around the edit)",
        )
    if warmup:
        parser.add_argument("--warmup-layers", type=non_negative_int, metavar="N", help="HOMER warm-up layers")


def max_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-file-mb",
        type=positive_int,
        default=DEFAULT_MAX_FILE_MB,
        metavar="N",
        help=f"refuse files over N MiB before reading them (default {DEFAULT_MAX_FILE_MB})",
    )


def max_document_tokens_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-document-tokens",
        type=positive_int,
        default=DEFAULT_MAX_DOCUMENT_TOKENS,
        metavar="N",
        help="refuse a document of over N tokens before compressing it, counting them a slice at a time "
        f"(default {DEFAULT_MAX_DOCUMENT_TOKENS:,})",
    )


def cache_options(parser: argparse.ArgumentParser, *, allow_no_disk: bool) -> None:
    parser.add_argument(
        "--cache-dir",
        type=non_empty_path,
        metavar="DIR",
        help="document cache directory (default: the platform cache dir, or $HOMER_INTEGRATIONS_CACHE/documents)",
    )
    parser.add_argument(
        "--store",
        type=non_empty,
        metavar="URL",
        help="instead of --cache-dir: a shared store any fsspec URL names (s3://bucket/prefix, file://..., "
        "memory://); credentials and endpoint from the environment (AWS_ENDPOINT_URL, ...)",
    )
    parser.add_argument(
        "--max-bytes",
        type=byte_size,
        metavar="SIZE",
        help="disk budget of the cache directory (e.g. 500MB, 2GiB): least recently used documents are "
        "evicted to stay within it" + ("; 'cache' applies it now" if not allow_no_disk else ""),
    )
    parser.add_argument(
        "--keyed",
        action="store_true",
        help="sign the entries written with a keyed checksum (HMAC-SHA256, secret in the cache root's cache.key, "
        "made on first use, mode 600) and use only entries signed with it: for a store others can write to; "
        "give every process that shares the store the same cache.key",
    )
    if allow_no_disk:
        parser.add_argument("--no-disk-cache", action="store_true", help="keep the compressed cache in memory only")


def config(args: argparse.Namespace) -> HomerConfig:
    """The ``HomerConfig`` of ``homer_options``' values (``--mode`` goes with each question, not here)."""
    from pydantic import ValidationError

    from homer_integrations.homer.config import HomerConfig

    fields = {
        "max_chunk_len": getattr(args, "max_chunk_len", None),
        "warmup_layers": getattr(args, "warmup_layers", None),
        "split": getattr(args, "split", None),
    }
    try:
        return HomerConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise CliError(f"invalid HOMER settings: {exc.errors()[0]['msg']}", EXIT_USAGE) from None
