"""``ModuleWalk``: which package modules the orchestration layer enters during one call (traced).

A visit of a package module M is control entering a function written in M's file from a frame of another
``homer_integrations`` module (the nearest package frame below it: a decorator's or ``functools``'
frame between them is skipped) while no frame of M is on the stack already. Only visits made from the
orchestration layer (``orchestrates``) are counted: what a unit calls in its own loops is its business.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType

PACKAGE = "homer_integrations"


def orchestrates(module: str) -> bool:
    """Whether ``module`` sequences a compression: the package's top-level modules and ``engine``'s
    (``engine.model``, ``engine.tiers``, ``engine.prompting``, ``engine.builder``, and whichever the engine's
    calls are split into) and ``homer.reading.strategies``.
    ``homer.tree.compressor`` is not one: it only wires the passes over one ``Nodes`` (its frames are their
    constructors), and is counted as a module the builder enters."""
    inner = module.removeprefix(f"{PACKAGE}.")
    top = "." not in inner or inner.startswith("engine.")
    return inner != module and (top or inner == "homer.reading.strategies")


def _module(frame: FrameType) -> str:
    return frame.f_globals.get("__name__", "")


class ModuleWalk:
    """A profiler: ``with ModuleWalk() as walk: ...``, then ``walk.visits`` (module -> visits) and
    ``walk.edges`` ((caller, callee) -> visits), for visits from the orchestration layer."""

    def __init__(self) -> None:
        self.visits: Counter[str] = Counter()
        self.edges: Counter[tuple[str, str]] = Counter()

    def __enter__(self) -> ModuleWalk:
        self._previous = sys.getprofile()
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous)

    def _event(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = _module(frame)
        if not callee.startswith(PACKAGE) or not frame.f_code.co_filename.endswith(".py"):
            return  # outside the package, or code a dataclass or NamedTuple generated (its __init__)
        caller, back = None, frame.f_back
        while back is not None:
            name = _module(back)
            if name == callee:
                return  # M is on the stack already: the same visit
            if caller is None and name.startswith(PACKAGE):
                caller = name
            back = back.f_back
        if caller is not None and orchestrates(caller):
            self.visits[callee] += 1
            self.edges[caller, callee] += 1

    def twice(self) -> dict[str, int]:
        """The modules visited more than once."""
        return {name: n for name, n in self.visits.items() if n > 1}
