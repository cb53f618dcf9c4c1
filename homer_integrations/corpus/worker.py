"""One corpus worker: a model over the shared store, compressing one document at a time."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homer_integrations.corpus.ledger import CorpusLedger
from homer_integrations.corpus.report import DocumentJob, DocumentOutcome, Status

if TYPE_CHECKING:
    from homer_integrations.engine.model import HomerModel
    from homer_integrations.homer.config import HomerConfig, Mode


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker loads (plain values: they travel to Ray workers).

    ``model``: an embedded name, local path or hub id; ``store``: a directory or fsspec URL;
    ``mode``: which entry is stored (``shared``/``full``: the compressed root; ``query_aware``: the
    leaf tier every question replays from; default ``config.mode``, ``auto``: per document, the whole prefill
    where it fits the window, else the leaf tier); ``threads``: torch CPU
    threads.
    """

    model: str
    store: str
    config: HomerConfig | None = None
    mode: Mode | None = None
    dtype: str = "auto"
    device: str | None = None
    threads: int | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def job_id(self) -> str:
        """Names what decides a document's cache key except its text, without loading the model.

        A local model directory is named by its files' names, sizes and modification times; a hub id
        by the id (pin a revision, or use a local path, if the weights behind it may change).
        """
        from homer_integrations.engine.model import ALGORITHM_VERSION
        from homer_integrations.homer.config import HomerConfig, first_mode

        config = self.config.model_dump(mode="json") if self.config is not None else None
        # the mode the workers will resolve, so a record made under another default is not taken for this one
        mode = first_mode(self.mode) or (self.config or HomerConfig()).mode
        parts = [self.model, _model_files(self.model), self.dtype, config, mode, ALGORITHM_VERSION]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _model_files(model: str) -> list[tuple[str, int, int]]:
    path = Path(model).expanduser()
    if not path.is_dir():
        return []
    return sorted((p.name, (s := p.stat()).st_size, s.st_mtime_ns) for p in path.iterdir() if p.is_file())


def engine_job_id(engine: HomerModel, mode: Mode) -> str:
    """``WorkerSpec.job_id`` for a loaded engine: the key a fixed probe document gets names its model,
    tokenizer, dtype, settings and calibration exactly."""
    return "engine-" + CorpusWorker.entry_key(engine, mode, "homer corpus probe")[:32]


class CorpusWorker:
    """One model over the shared store: compresses documents one at a time (a Ray actor, or in process).

    Args:
        spec: what to load; ``engine``: an engine already loaded in this process (its model and
            settings are used, over the spec's store).
        job: the ledger job id records are written under.
    """

    def __init__(self, spec: WorkerSpec, job: str, engine: HomerModel | None = None) -> None:
        import torch

        from homer_integrations.cache import DocumentCache

        if spec.threads:
            torch.set_num_threads(spec.threads)
        cache = DocumentCache(spec.store, memory_budget_bytes=0, **spec.storage_options)
        # a loaded engine keeps its model and settings, over this store, keeping nothing in memory
        self.engine = engine = self._load(spec, cache) if engine is None else engine.with_store(cache)
        self.mode: Mode = engine.mode_for(spec.mode)
        assert cache.store is not None
        self.store = cache.store
        self.ledger = CorpusLedger(cache.store)
        self.job = job
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    @staticmethod
    def _load(spec: WorkerSpec, cache: Any) -> HomerModel:
        from homer_integrations.engine.loading import load_model
        from homer_integrations.engine.model import HomerModel

        model, tokenizer = load_model(spec.model, dtype=spec.dtype, device=spec.device)
        return HomerModel(model, tokenizer, spec.config, model_name=spec.model, document_cache=cache, progress=False)

    @staticmethod
    def entry_key(engine: HomerModel, mode: Mode, text: str) -> str:
        """The cache key of ``text``'s stored entry in ``mode`` (the leaf tier's in ``query_aware``)."""
        return engine.entry_key(text, mode)

    def compress(self, job: DocumentJob) -> DocumentOutcome:
        """Store ``job``'s entry unless it is stored; a document the model refuses comes back ``failed``."""
        started = time.perf_counter()
        key = self.entry_key(self.engine, self.mode, job.text)
        tokens = 0
        status: Status = "stored"
        try:
            if self.store.read_manifest(key) is None:
                tokens, status = self._compress(job)
        except (ValueError, OSError) as exc:
            return self._outcome(job, "failed", started, key, error=" ".join(str(exc).split()))
        if status != "unneeded":
            self.ledger.write(job.record, key, job.label)
        return self._outcome(job, status, started, key, tokens)

    def _compress(self, job: DocumentJob) -> tuple[int, Status]:
        """(document tokens, status): ``stored`` when another worker wrote the entry meanwhile (the
        store's single flight made this one wait for it, then load it)."""
        with self.engine.document_cache.labelled(job.label):
            tokens, source, _ = self.engine.cache_document(job.text, self.mode)
        if source is None:
            return tokens, "unneeded"
        return tokens, "compressed" if source == "computed" else "stored"

    def _outcome(
        self, job: DocumentJob, status: Status, started: float, key: str, tokens: int = 0, error: str | None = None
    ) -> DocumentOutcome:
        return DocumentOutcome(
            path=job.path,
            status=status,
            key=key,
            document_tokens=tokens,
            seconds=time.perf_counter() - started,
            worker=self.name,
            peak_rss_bytes=peak_rss_bytes(),
            error=error,
        )


def peak_rss_bytes() -> int:
    """This process's peak resident memory in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
