"""One ``HomerModel`` per model name in a process, shared by every adapter object that names it.

Adapters built from a name (``ChatHomer(model=...)``, ``HomerLLM(model=...)``) get their engine
here on first use, so many adapter objects, per-call model overrides and both frameworks share
one loaded model and one document cache. ``HOMER_INTEGRATIONS_MODEL`` names the default model
(otherwise the embedded default).
"""

from __future__ import annotations

import os
import threading

from homer_integrations.engine.loading import DEFAULT_MODEL
from homer_integrations.engine.model import HomerModel

MODEL_ENV = "HOMER_INTEGRATIONS_MODEL"

_engines: dict[str, HomerModel] = {}
_lock = threading.Lock()


def default_model_name() -> str:
    """``$HOMER_INTEGRATIONS_MODEL`` or the embedded default model's name."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def shared_engine(model: str | None = None, store: str | None = None) -> HomerModel:
    """The process-wide engine for ``model`` (local path, hub id or embedded name), loaded once.

    ``store`` (a directory or fsspec URL): an engine over the same loaded model whose documents
    live there (``HomerModel.with_store``), one per store.
    """
    name = model or default_model_name()
    with _lock:
        engine = _engines.get(name)
        if engine is None:
            engine = _engines[name] = HomerModel.from_pretrained(name)
        if store is None:
            return engine
        stored = _engines.get(f"{name}\0{store}")
        if stored is None:
            stored = _engines[f"{name}\0{store}"] = engine.with_store(store)
        return stored


def register_engine(engine: HomerModel, name: str | None = None) -> None:
    """Make an engine built elsewhere the shared one for ``name`` (default: its ``model_name``)."""
    with _lock:
        _engines[name or engine.model_name] = engine
