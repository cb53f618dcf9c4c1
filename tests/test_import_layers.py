"""The package's import graph: no module imports itself back through others, and the layers point down.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ... import`` of
``homer_integrations.*`` anywhere in a module, at module level, under ``if TYPE_CHECKING:`` or inside a
function (a circle hidden in a function-local import is still a circle), relative imports resolved.

Layers: ``homer/`` (the algorithm) imports nothing of the package outside ``homer/``; ``cache/`` imports
nothing of the front ends (``langchain/``, ``llama_index/``, ``cli/``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = "homer_integrations"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

FRONT_ENDS = ("langchain", "llama_index", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def owning_module(dotted: str) -> str | None:
    """The package module ``dotted`` names or lies in (``pkg.mod.Class`` -> ``pkg.mod``); None outside."""
    known = modules()
    while dotted:
        if dotted in known:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def imported_modules(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every package module ``path`` imports, with the import's line: ``import a.b`` and ``from a.b import c``
    give ``a.b`` (or ``a.b.c`` when ``c`` is a submodule); relative imports are resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [owning_module(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets = [owning_module(f"{source}.{alias.name}") for alias in node.names]
        else:
            continue
        for target in targets:
            if target is not None:
                yield target, node.lineno


@cache
def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {imported package module: line of its first import}, without self-imports."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules().items():
        edges = graph.setdefault(name, {})
        for target, line in imported_modules(name, path):
            if target != name:
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(component: frozenset[str]) -> str:
    graph = import_graph()
    return "; ".join(
        f"{source} -> {target} (line {line})"
        for source in sorted(component)
        for target, line in sorted(graph[source].items())
        if target in component
    )


def outside_imports(layer: str, forbidden: tuple[str, ...] | None = None) -> set[tuple[str, str]]:
    """(importer, imported) pairs where a module under ``layer`` imports a package module it must not:
    any outside ``layer`` (``forbidden`` None), or any under one of ``forbidden``'s subpackages."""
    prefix = f"{PACKAGE}.{layer}"
    found = set()
    for source, edges in import_graph().items():
        if source != prefix and not source.startswith(prefix + "."):
            continue
        for target in edges:
            inside = target == prefix or target.startswith(prefix + ".")
            if forbidden is None:
                bad = not inside
            else:
                bad = any(target == f"{PACKAGE}.{f}" or target.startswith(f"{PACKAGE}.{f}.") for f in forbidden)
            if bad:
                found.add((source, target))
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert len(modules()) > 50
    assert "homer_integrations.langchain.structured" in graph["homer_integrations.langchain.chat_models"]
    # function-local: cli/compress.py imports open_store inside a function
    assert "homer_integrations.cache.store" in graph["homer_integrations.cli.compress"]
    # under TYPE_CHECKING: the package's lazy exports
    assert "homer_integrations.engine.model" in graph["homer_integrations"]
    # ``from package import submodule``: the submodule
    assert "homer_integrations.cli.serve" in graph["homer_integrations.cli"]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [frozenset("abc")]


def test_relative_imports_resolve(tmp_path: Path) -> None:
    module = tmp_path / "local.py"
    module.write_text("from .entry import Entry\nfrom .. import paths\n\ndef f():\n    from ..homer import config\n")
    found = dict(imported_modules("homer_integrations.cache.local", module))
    assert found == {
        "homer_integrations.cache.entry": 1,
        "homer_integrations.paths": 2,
        "homer_integrations.homer.config": 5,
    }


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + " | ".join(describe(component) for component in found)


def test_homer_imports_only_homer() -> None:
    assert outside_imports("homer") == set()


def test_cache_imports_no_front_end() -> None:
    assert outside_imports("cache", FRONT_ENDS) == set()


STAGES = ("document", "scoring", "layers", "leaves", "tree", "reading", "decoding")
"""``homer/``'s stages in the order a document flows through them (``homer/__init__``)."""
SHARED = ("config", "model", "kv")
"""What every stage may import: the settings, the decoder, the K/V forms."""


def homer_part(module: str) -> str | None:
    """The stage or shared helper of ``homer/`` that ``module`` lies in (``homer.tree.flat`` -> ``tree``)."""
    prefix = f"{PACKAGE}.homer."
    return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None


def test_homer_is_its_stages_and_shared_helpers() -> None:
    parts = {homer_part(name) for name in modules()} - {None}
    assert parts == set(STAGES) | set(SHARED)
    for part in parts:
        inside = [n for n in modules() if homer_part(n) == part and not n.endswith("__init__")]
        assert len(inside) <= 12, f"homer/{part} holds {len(inside)} modules"


def test_each_stage_imports_only_earlier_stages() -> None:
    bad = []
    for source, edges in import_graph().items():
        stage = homer_part(source)
        for target in edges:
            used = homer_part(target)
            if stage is None or used is None or used == stage:
                continue
            if stage in SHARED:
                ok = (used in SHARED and SHARED.index(used) <= SHARED.index(stage)) or stage == "config"
            else:
                ok = used in SHARED or STAGES.index(used) < STAGES.index(stage)
            if not ok:
                bad.append(f"{source} -> {target}")
    assert not bad, "imports against the stage order: " + "; ".join(bad)
