"""``homer-qa cache ls | info | clear | rm``: what the document cache holds, and removing it.

Labels and keys come from manifests anyone who can write the directory may have written: ``ls``
shows them through ``printable``. An entry the cache cannot use (a manifest over its size limit) is
listed with the reason, so that ``clear`` is seen to remove it. Files no entry needs (leaves no tier lists,
tensors files with no manifest: ``LocalStore.orphans``) are counted in one line by ``ls`` and removed by
``rm --orphans``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from homer_integrations.cli import loading, options
from homer_integrations.cli.common import EXIT_OK, CliError, human_bytes, printable

if TYPE_CHECKING:
    from homer_integrations.cache import DocumentCache
    from homer_integrations.cache.local import Orphan


def add_parser(commands: Any) -> None:
    cache = commands.add_parser("cache", help="list, describe, clear or remove from the document cache")
    cache.set_defaults(run=run)
    cache.add_argument("action", choices=("ls", "info", "clear", "rm"))
    cache.add_argument(
        "documents",
        nargs="*",
        metavar="KEY_OR_NAME",
        help="rm: the cached documents to remove, by their name or the start of their key, as `cache ls` shows them",
    )
    cache.add_argument(
        "--orphans",
        action="store_true",
        help="rm: instead of documents, remove the files no cached document needs (leaves no tier lists, tensors "
        "files with no manifest), as `cache ls` counts them; files a running process may still claim stay",
    )
    options.cache_options(cache, allow_no_disk=False)
    cache.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.orphans and (args.action != "rm" or args.documents):
        raise CliError("--orphans goes with `cache rm` alone: `homer-qa cache rm --orphans`")
    if args.action != "rm" and args.documents:
        raise CliError(f"cache {args.action} takes no documents")
    if args.action == "rm" and not (args.documents or args.orphans):
        raise CliError(
            "cache rm needs the documents to remove (a name or the start of a key, as `cache ls` shows them), "
            "or --orphans"
        )
    cache = loading.open_cache(args)
    try:
        if args.max_bytes is not None and cache.directory is not None:  # --store URLs refuse a budget in open_cache
            evicted = cache.trim()
            if evicted:
                print(f"homer-qa: evicted {evicted} cached document(s) over --max-bytes", file=sys.stderr)
        if args.action == "rm" and args.orphans:
            _rm_orphans(cache, args.json, sys.stdout)
        elif args.action == "rm":
            _rm(cache, args.documents, args.json, sys.stdout)
        else:
            show = {"clear": _clear, "info": _info, "ls": _ls}[args.action]
            show(cache, args.json, sys.stdout)
    except (CliError, BrokenPipeError):  # a reader that stopped reading (`| head`) ends it quietly, as for ask
        raise
    except OSError as exc:  # the cache directory's locks, a store that failed midway
        raise CliError(f"cache {args.action} {printable(str(cache.location))}: {exc}") from None
    return EXIT_OK


def _clear(cache: DocumentCache, as_json: bool, out: TextIO) -> None:
    leaves = sum(e.kind == "leaf" for e in cache.entries())  # a tier's leaves are parts of documents, not documents
    removed = max(0, cache.clear() - leaves)
    if as_json:
        json.dump({"directory": cache.location, "removed": removed, "leaves_removed": leaves}, out)
        out.write("\n")
    else:
        also = f" and {leaves} leaves" if leaves else ""
        out.write(f"removed {removed} cached document(s){also} from {printable(str(cache.location))}\n")


def _rm(cache: DocumentCache, names: list[str], as_json: bool, out: TextIO) -> None:
    """Remove the documents ``names`` name (a label, every entry of it; or the start of one key). A tier stored by its
    leaves takes along the leaves no other tier lists. Nothing is removed unless every name is found."""
    entries = [e for e in cache.entries() if e.kind != "leaf"]
    chosen: dict[str, None] = {}
    for name in names:
        found = [e for e in entries if e.label == name] or [e for e in entries if e.key.startswith(name.lower())]
        if not found:
            raise CliError(f"cache rm: no cached document is named {name!r} or has a key starting so (see `cache ls`)")
        if len(found) > 1 and found[0].label != name:
            keys = ", ".join(e.key[:12] for e in found)
            raise CliError(f"cache rm: {len(found)} cached documents have keys starting {name!r} ({keys}): give more")
        chosen.update(dict.fromkeys(e.key for e in found))
    removed, leaves = cache.discard_many(chosen)
    if cache.directory is not None:  # their lock files too, unless a process holds one (a build under way)
        from homer_integrations.cache.flight import remove_unheld_lock
        from homer_integrations.cache.store_base import entry_name

        for key in chosen:
            remove_unheld_lock(cache.directory / "locks" / f"{entry_name(key)}.lock")
    if as_json:
        json.dump({"directory": cache.location, "removed": removed, "leaves_removed": leaves}, out)
        out.write("\n")
    else:
        also = f" and {leaves} leaves no other document shares" if leaves else ""
        out.write(f"removed {removed} cached document(s){also} from {printable(str(cache.location))}\n")


def _rm_orphans(cache: DocumentCache, as_json: bool, out: TextIO) -> None:
    """Remove the files no entry needs (``DocumentCache.remove_orphans``) and say what that freed."""
    removed = cache.remove_orphans()
    where = printable(str(cache.location))
    if removed is None:
        raise CliError(f"cache rm --orphans: orphaned files are found in a local cache directory, not in {where}")
    freed = sum(orphan.nbytes for orphan in removed)
    if as_json:
        json.dump({"directory": cache.location, "orphans_removed": len(removed), "bytes_freed": freed}, out)
        out.write("\n")
    else:
        out.write(f"removed {len(removed)} orphaned file(s), {human_bytes(freed)}, from {where}\n")


def _info(cache: DocumentCache, as_json: bool, out: TextIO) -> None:
    info = cache.info()
    if as_json:
        json.dump(info, out, indent=2)
        out.write("\n")
        return
    out.write(
        f"directory: {info['store']}\nentries: {info['disk_entries']}\n"
        f"disk: {human_bytes(info['disk_bytes'])}\nformat version: {info['format_version']}\n"
    )
    if info["disk_budget_bytes"] is not None:
        out.write(f"disk budget: {human_bytes(info['disk_budget_bytes'])}\n")


def _ls(cache: DocumentCache, as_json: bool, out: TextIO) -> None:
    entries = cache.entries()
    if as_json:
        json.dump([asdict(e) for e in entries], out, indent=2)
        out.write("\n")
        return
    from homer_integrations.cache.store_base import entry_name

    orphans = cache.orphans() or []
    orphaned = {orphan.name for orphan in orphans}
    # leaves shared by the content-split tiers that list them (an orphan is one that no tier lists)
    leaves = [e for e in entries if e.kind == "leaf" and entry_name(e.key) not in orphaned]
    entries = [e for e in entries if e.kind != "leaf"]
    if not entries and not leaves:
        out.write(f"no cached documents in {printable(str(cache.location))}\n")
        _orphans_line(orphans, out)
        return
    rows = [("KEY", "DOCUMENT", "DOC TOKENS", "CACHE TOKENS", "SIZE", "CREATED")]
    for e in entries:
        created = datetime.fromtimestamp(e.created).strftime("%Y-%m-%d %H:%M")
        document = f"(unusable: {e.error})" if e.error else e.label or "-"
        counts = ("-", "-") if e.error else (f"{e.document_tokens:,}", f"{e.tokens:,}")
        cells = (e.key[:12], document, *counts, human_bytes(e.disk_bytes), created)
        rows.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n")
    total = human_bytes(sum(e.disk_bytes for e in entries + leaves))
    shared = f" and {len(leaves)} leaves their tiers share ({human_bytes(sum(e.disk_bytes for e in leaves))})"
    out.write(f"{len(entries)} document(s){shared if leaves else ''}, {total} in {printable(str(cache.location))}\n")
    _orphans_line(orphans, out)


def _orphans_line(orphans: list[Orphan], out: TextIO) -> None:
    """One line for the orphaned files, if there are any."""
    if orphans:
        freed = human_bytes(sum(orphan.nbytes for orphan in orphans))
        out.write(f"{len(orphans)} orphaned file(s) no document needs, {freed}: `cache rm --orphans` removes them\n")
