"""Run a benchmark suite: ``python -m benchmarks list`` | ``run SUITE [--dry-run] [--only SCRIPT] [-- ARGS...]``.

    .venv/bin/python -m benchmarks list                     # every suite: what, how long, its commands
    .venv/bin/python -m benchmarks run quick                # what `make bench` runs
    .venv/bin/python -m benchmarks run speed --dry-run      # print the commands only
    .venv/bin/python -m benchmarks run speed --only decode_speed -- --model qwen2.5-coder-0.5b-instruct

A suite runs its scripts in order from the repository root, with this interpreter and
``OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false`` unless already set; it stops at the first
that fails. Arguments after ``--`` go to every step but the ``report`` ones; ``--only`` keeps the
steps of the named scripts (their stems). The suites: ``benchmarks/suites.py``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.suites import BENCH_ENV, SUITES, Suite

ROOT = Path(__file__).resolve().parent.parent


def _python() -> str:
    """This interpreter as a command would name it: relative to the repository root when inside it."""
    exe = os.path.abspath(sys.executable)  # not resolved: a venv's python is a symlink to the base one
    return os.path.relpath(exe, ROOT) if exe.startswith(str(ROOT) + os.sep) else exe


def commands(suite: Suite, extra: Sequence[str] = (), only: Sequence[str] = ()) -> list[list[str]]:
    """The suite's script calls (script path first), those of ``only``'s scripts when given."""
    return [step.argv(extra) for step in suite.steps if not only or step.name in only]


def list_suites() -> list[str]:
    """One line per suite: name, what it measures, rough time on 2 CPU cores, its commands."""
    width = max(map(len, SUITES))
    return [
        f"{s.name:<{width}}  {s.measures} [{s.cpu_time} on 2 CPU cores]: "
        + "; ".join(shlex.join(["python", *c]) for c in commands(s))
        for s in SUITES.values()
    ]


def run(suite: Suite, extra: Sequence[str], only: Sequence[str], dry_run: bool) -> int:
    """Run (or with ``dry_run`` print) the suite's commands in order; the first failure's exit code."""
    python = _python()
    env = {**BENCH_ENV, **os.environ}
    for argv in commands(suite, extra, only):
        print(("" if dry_run else "$ ") + shlex.join([python, *argv]), flush=True)
        if dry_run:
            continue
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env)
        if done.returncode:
            print(f"benchmarks: {suite.name}: {argv[0]} failed with exit code {done.returncode}", file=sys.stderr)
            return done.returncode
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code (2: a usage error, such as an unknown suite)."""
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every suite, one line each")
    r = sub.add_parser("run", help="run a suite's scripts in order (arguments after -- go to its steps)")
    r.add_argument("suite", help=", ".join(SUITES))
    r.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    r.add_argument("--only", action="append", default=[], metavar="SCRIPT", help="only this script's steps (a stem)")
    ns = parser.parse_args(args)
    if ns.command == "list":
        print("\n".join(list_suites()))
        return 0
    suite = SUITES.get(ns.suite)
    if suite is None:
        print(f"benchmarks: unknown suite {ns.suite!r}; known suites: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    names = list(dict.fromkeys(step.name for step in suite.steps))
    if unknown := [n for n in ns.only if n not in names]:
        print(
            f"benchmarks: {suite.name} has no step {unknown[0]!r}; its steps: {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    return run(suite, extra, ns.only, ns.dry_run)


if __name__ == "__main__":
    sys.exit(main())
