"""Where the workers run: one in this process, or Ray actors (with restarts and retries)."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from homer_integrations.corpus.report import DocumentJob, DocumentOutcome
from homer_integrations.corpus.worker import CorpusWorker, WorkerSpec

if TYPE_CHECKING:
    from homer_integrations.engine.model import HomerModel


class InProcessRunner:
    """Compresses the jobs one after another with one worker in this process (loaded on the first job)."""

    def __init__(self, spec: WorkerSpec, job: str, engine: HomerModel | None, worker_class: type[CorpusWorker]):
        self.spec, self.job, self.engine, self.worker_class = spec, job, engine, worker_class

    def run(self, jobs: list[DocumentJob], bar: tqdm) -> Iterator[DocumentOutcome]:
        worker: CorpusWorker | None = None
        for job in jobs:
            if worker is None:
                worker = self.worker_class(self.spec, self.job, self.engine)
            yield worker.compress(job)
            bar.update()


class RayRunner:
    """Spreads the jobs over Ray actors, at most one in flight per actor, so fast workers take more.

    Each actor loads one model (``num_gpus=1`` where the cluster has GPUs, else ``threads`` CPUs and
    as many torch threads). A dead actor is restarted and its document retried up to ``retries``
    times; after that the document is reported failed and the actor dropped.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        job: str,
        worker_class: type[CorpusWorker],
        *,
        workers: int | None,
        threads: int | None,
        retries: int,
    ) -> None:
        import ray

        self.ray = ray
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        self.use_gpu = gpus > 0
        self.workers = workers or (gpus if self.use_gpu else max(1, cpus // (threads or 4)))
        self.threads = threads or max(1, cpus // self.workers)
        device = "cuda" if self.use_gpu else spec.device
        self.spec = replace(spec, threads=self.threads, device=device)
        self.job, self.worker_class, self.retries = job, worker_class, retries

    def run(self, jobs: list[DocumentJob], bar: tqdm) -> Iterator[DocumentOutcome]:
        ray = self.ray
        actor_class = ray.remote(self.worker_class).options(
            num_cpus=0 if self.use_gpu else self.threads,
            num_gpus=1 if self.use_gpu else 0,
            max_restarts=self.retries,
            max_task_retries=self.retries,
        )
        actors = [actor_class.remote(self.spec, self.job) for _ in range(min(self.workers, len(jobs)))]
        idle, pending = list(actors), deque(jobs)
        running: dict[Any, tuple[Any, DocumentJob]] = {}
        try:
            while pending or running:
                while idle and pending:
                    actor, job = idle.pop(), pending.popleft()
                    running[actor.compress.remote(job)] = (actor, job)
                if not running:  # every actor is gone
                    for job in pending:
                        yield _failed(job, "no worker left: every worker died")
                        bar.update()
                    return
                (ref,), _ = ray.wait(list(running), num_returns=1)
                actor, job = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                    idle.append(actor)
                except ray.exceptions.RayActorError as exc:
                    outcome = _failed(job, f"its worker died {self.retries + 1} time(s): {_first_line(exc)}")
                except ray.exceptions.RayError as exc:
                    outcome = _failed(job, _first_line(exc))
                    idle.append(actor)
                bar.update()
                yield outcome
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)


def _failed(job: DocumentJob, error: str) -> DocumentOutcome:
    return DocumentOutcome(path=job.path, status="failed", error=error)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray connected for the block: the session this process has, else a new one (shut down after)."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("corpus compression on Ray needs ray: pip install 'homer-integrations[ray]'") from exc
    if ray.is_initialized():
        yield
        return
    ray.init(address=None if address in (None, "local") else address)
    try:
        yield
    finally:
        ray.shutdown()
