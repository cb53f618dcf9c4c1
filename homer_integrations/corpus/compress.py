"""``compress_corpus``: every document under some paths into one store, skipping what is stored."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tqdm.auto import tqdm

from homer_integrations.cache.store import open_store
from homer_integrations.corpus.ledger import CorpusLedger
from homer_integrations.corpus.report import CorpusReport, DocumentJob, DocumentOutcome
from homer_integrations.corpus.runners import InProcessRunner, RayRunner, ray_session
from homer_integrations.corpus.worker import CorpusWorker, WorkerSpec, engine_job_id
from homer_integrations.documents import DEFAULT_MAX_BYTES, DocumentError, iter_documents, read_document

if TYPE_CHECKING:
    from homer_integrations.engine.model import HomerModel
    from homer_integrations.homer.config import HomerConfig, Mode

logger = logging.getLogger(__name__)


def collect_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files named, with the supported files under each directory named (recursively, sorted)."""
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            found += [r.path for r in iter_documents(path, recursive=True) if r.path is not None]
        else:
            found.append(path)
    return list(dict.fromkeys(found))


def compress_corpus(
    paths: Iterable[str | Path],
    store: str | Path,
    *,
    model: str | HomerModel | None = None,
    config: HomerConfig | None = None,
    mode: Mode | None = None,
    dtype: str = "auto",
    device: str | None = None,
    ray_address: str | None = None,
    workers: int | None = None,
    threads: int | None = None,
    retries: int = 2,
    progress: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
    storage_options: dict[str, Any] | None = None,
    worker_class: type[CorpusWorker] = CorpusWorker,
) -> CorpusReport:
    """Compress every document under ``paths`` into ``store``; what is stored already is skipped.

    Args:
        paths: files and directories (searched recursively for supported files).
        store: a directory or a URL fsspec knows (``s3://bucket/prefix``); ``storage_options`` go to fsspec.
        model: an embedded name, local path or hub id (default: the embedded default model); in
            process also a loaded ``HomerModel`` (its settings apply; ``config``/``dtype``/``device`` not).
        mode: the entry stored (default ``config.mode``, ``auto``: per document ``full`` where it fits the
            window, else ``query_aware``): ``query_aware`` the leaf tier every question replays from, ``shared``
            or ``full`` the root.
        ray_address: None: in this process. Otherwise Ray: ``"local"`` starts Ray on this machine,
            ``"auto"`` joins this machine's cluster, ``"ray://host:10001"`` a remote one; a Ray this
            process already initialised is used as is.
        workers: Ray actors (default: one per GPU, else one per 4 CPUs); ``threads``: CPUs and torch
            threads per actor on CPU (default: the cluster's CPUs shared out).
        retries: restarts of a dead worker, each retrying its document.
        max_bytes: larger files are refused (reported failed) before they are read.
        worker_class: the worker (a subclass may prepare documents differently).

    Returns a ``CorpusReport``; failed documents are listed there, never raised.
    """
    started = time.perf_counter()
    storage_options = storage_options or {}
    if model is not None and not isinstance(model, str):
        if ray_address is not None:
            raise ValueError("Ray workers load the model themselves: pass its name or path, not a loaded HomerModel")
        engine: HomerModel | None = model
        spec = WorkerSpec(model=engine.model_name, store=str(store), mode=mode, storage_options=storage_options)
        job = engine_job_id(engine, engine.mode_for(mode))
    else:
        from homer_integrations.engine.loading import DEFAULT_MODEL

        engine = None
        spec = WorkerSpec(
            model=model or DEFAULT_MODEL,
            store=str(store),
            config=config,
            mode=mode,
            dtype=dtype,
            device=device,
            storage_options=storage_options,
        )
        _check_model(spec.model)
        job = spec.job_id()
    ledger = CorpusLedger(open_store(str(store), **storage_options))

    files = collect_files(paths)
    outcomes: dict[str, DocumentOutcome] = {}
    jobs: list[DocumentJob] = []
    for path in files:
        try:
            parsed = read_document(path, max_bytes=max_bytes)
        except DocumentError as exc:
            outcomes[str(path)] = DocumentOutcome(path=str(path), status="failed", error=str(exc))
            continue
        record = CorpusLedger.record_name(job, parsed.text)
        jobs.append(DocumentJob(path=str(path), label=parsed.name, text=parsed.text, record=record))
    done = ledger.stored(j.record for j in jobs)
    for j in jobs:
        if j.record in done:
            outcomes[j.path] = DocumentOutcome(path=j.path, status="skipped")
    todo = [j for j in jobs if j.record not in done]
    logger.info("%d documents: %d stored already, %d to compress", len(jobs), len(done), len(todo))

    backend: Literal["process", "ray"] = "process" if ray_address is None else "ray"
    n_workers = 1 if todo and backend == "process" else 0
    with tqdm(total=len(todo), desc="documents", unit="doc", disable=not (progress and todo)) as bar:
        if todo and backend == "ray":
            with ray_session(ray_address):
                runner = RayRunner(spec, job, worker_class, workers=workers, threads=threads, retries=retries)
                n_workers = min(runner.workers, len(todo))
                for outcome in runner.run(todo, bar):
                    outcomes[outcome.path] = outcome
        elif todo:
            for outcome in InProcessRunner(spec, job, engine, worker_class).run(todo, bar):
                outcomes[outcome.path] = outcome
    return CorpusReport(
        documents=[outcomes[str(p)] for p in files],
        seconds=time.perf_counter() - started,
        backend=backend,
        workers=n_workers,
    )


def _check_model(name: str) -> None:
    """Refuse a local model path that does not exist before any worker starts."""
    from homer_integrations.engine.loading import EMBEDDED_MODELS, resolve_model_path

    if name not in EMBEDDED_MODELS:
        resolve_model_path(name)
