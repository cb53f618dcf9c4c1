"""What became of each document of a corpus run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["compressed", "stored", "skipped", "unneeded", "failed"]
"""``compressed``: a worker compressed it now; ``stored``: a worker found its entry already stored;
``skipped``: the driver found it stored (no worker needed); ``unneeded``: it has no entry to store
(past the model's window a ``query_aware`` question reads the document's passages); ``failed``: see
``error``."""


@dataclass(frozen=True)
class DocumentJob:
    """One document to compress: its path, the label its entry gets (the file name, as ``homer-qa ask``
    gives), its text and the name of its ledger record."""

    path: str
    label: str
    text: str
    record: str


@dataclass(frozen=True)
class DocumentOutcome:
    """What became of one document; ``peak_rss_bytes`` is its worker's peak resident memory so far."""

    path: str
    status: Status
    key: str | None = None
    document_tokens: int = 0
    seconds: float = 0.0
    worker: str | None = None
    peak_rss_bytes: int = 0
    error: str | None = None


@dataclass
class CorpusReport:
    """The outcome of every document, in input order, and the run's wall time."""

    documents: list[DocumentOutcome]
    seconds: float
    backend: Literal["process", "ray"]
    workers: int = 0

    def count(self, status: Status) -> int:
        return sum(d.status == status for d in self.documents)

    @property
    def ok(self) -> bool:
        """Every document is in the store."""
        return self.count("failed") == 0

    def peak_rss_by_worker(self) -> dict[str, int]:
        """Peak resident bytes of each worker that handled a document."""
        peaks: dict[str, int] = {}
        for d in self.documents:
            if d.worker is not None:
                peaks[d.worker] = max(peaks.get(d.worker, 0), d.peak_rss_bytes)
        return peaks

    def to_dict(self) -> dict[str, Any]:
        counts = {status: self.count(status) for status in ("compressed", "stored", "skipped", "failed")}
        return {
            "backend": self.backend,
            "workers": self.workers,
            "seconds": round(self.seconds, 3),
            **counts,
            "peak_rss_bytes_by_worker": self.peak_rss_by_worker(),
            "documents": [asdict(d) for d in self.documents],
        }
