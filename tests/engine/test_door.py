"""One door into the engine: the front ends reach ``HomerModel`` through its public methods and properties only.

Read from the source with ``ast`` (nothing is imported). In the adapters, the corpus code, the CLI and the
modules they share, no attribute named after one of the engine's parts (``tiers``, ``answerer``,
``prompting``, ``stack``) is read, and every attribute read on an engine (an expression named ``engine``:
``engine``, ``self._engine``, ``llm.engine``, ``self.resolve_engine()``, ``shared_engine(name)``) is one
``HomerModel`` offers publicly: a method or property of its class, or a public attribute its ``__init__`` sets.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "homer_integrations"
SCANNED = ("langchain", "llama_index", "corpus", "cli", "routing.py", "engine/prompt_split.py", "engine/pool.py")
"""The front ends, and the modules they answer and find engines through."""
INTERNAL = frozenset({"tiers", "answerer", "prompting", "stack"})
"""The engine's parts: behind its door."""
_ENGINE = re.compile(r"(^|[._])engine$")


@cache
def engine_surface() -> frozenset[str]:
    """Public methods and properties of ``HomerModel``, and the public attributes its ``__init__`` sets,
    less its parts (``INTERNAL``)."""
    tree = ast.parse((PACKAGE / "engine" / "model.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HomerModel")
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    for node in ast.walk(init):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self":
            names.add(node.attr)
    return frozenset(n for n in names if not n.startswith("_") and n not in INTERNAL)


def is_engine(node: ast.expr) -> bool:
    """Whether ``node`` names an engine: ``engine``, ``x.engine``, ``x._engine``, or a call of ``*engine``."""
    if isinstance(node, ast.Call):
        node = node.func
    return _ENGINE.search(ast.unparse(node)) is not None


def violations(source: str, where: str = "<source>") -> list[str]:
    """Every reach past the engine's door in ``source``: ``where:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            value, attr = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            value, attr = node.args[0], node.args[1].value
        else:
            continue
        if attr in INTERNAL:
            found.append(f"{where}:{node.lineno}: .{attr} is one of the engine's parts ({ast.unparse(node)})")
        elif is_engine(value) and attr not in engine_surface():
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)} is not a public HomerModel member")
    return found


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = PACKAGE / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def test_the_front_ends_use_the_engines_public_door_only():
    files = scanned_files()
    assert len(files) > 20, "the scan lost its files"
    found = [v for path in files for v in violations(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))]
    assert not found, "reached past HomerModel's public methods and properties:\n" + "\n".join(found)


def test_the_scan_finds_a_reach_past_the_door():
    source = """
def f(self, engine, llm):
    engine.tiers.root("", "doc", "")
    self._engine.answerer.generate("hi")
    llm.engine._private()
    self.resolve_engine().stack
    getattr(engine, "_calibration")
    shared_engine("m").not_a_method()
    engine.prompting
    engine.count_tokens("fine") + engine.run_span("", "", "", "").info.usage()["fine"]
    self._own_attribute, engine.config.max_chunk_len, engine.document_cache.location
"""
    found = violations(source)
    assert sorted(int(v.split(":")[1]) for v in found) == [3, 4, 5, 6, 7, 8, 9], found


def test_the_surface_holds_the_door_and_not_the_parts():
    surface = engine_surface()
    assert {"run", "compress", "token_ids", "layout_prompt", "run_span", "mode_for", "config", "model_name"} <= surface
    assert not surface & INTERNAL and not any(name.startswith("_") for name in surface)
