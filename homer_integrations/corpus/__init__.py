"""Corpus compression: many documents into one shared store, in this process or over Ray workers; and
questions across a corpus, answered with the documents (and character ranges) read (``questions``).

    report = compress_corpus(["contracts/"], "s3://bucket/homer", model="smollm2-135m-instruct")
    report = compress_corpus(paths, "/shared/homer", model="/models/qwen2", ray_address="auto", workers=8)

Each document is compressed once by one worker (one model per worker: one GPU per Ray worker where
the cluster has GPUs, CPU threads otherwise), which writes the entry to the store itself; any process
with the same model and settings then answers from it (``HomerModel(..., store=URL)``).

Resume without a model: a worker that stores a document also writes a small record under
``corpus/`` beside the entries, named by the job (model reference, dtype, settings, mode) and the
document's text, that says which entry holds it. The driver reads those records and the entries'
manifests, so a finished document is skipped before any model loads; an entry that was evicted or
removed since is compressed again. A worker that dies is restarted and its document retried
(``retries``); a document that still fails is reported, never lost: the next run does what is missing.

Questions across a corpus: ``ask_corpus(engine, Corpus.from_paths(["contracts/"]), question)`` answers
from the documents laid out as one text, its ``sources`` the (document, start, end) ranges kept.
"""

from __future__ import annotations

from homer_integrations.corpus.compress import collect_files, compress_corpus
from homer_integrations.corpus.ledger import CorpusLedger
from homer_integrations.corpus.questions import (
    Corpus,
    CorpusAnswer,
    CorpusStream,
    NamedText,
    Source,
    ask_corpus,
    document_name,
    stream_corpus,
)
from homer_integrations.corpus.report import CorpusReport, DocumentJob, DocumentOutcome, Status
from homer_integrations.corpus.runners import InProcessRunner, RayRunner
from homer_integrations.corpus.worker import CorpusWorker, WorkerSpec, peak_rss_bytes

__all__ = [
    "Corpus",
    "CorpusAnswer",
    "CorpusLedger",
    "CorpusReport",
    "CorpusStream",
    "CorpusWorker",
    "DocumentJob",
    "DocumentOutcome",
    "InProcessRunner",
    "NamedText",
    "RayRunner",
    "Source",
    "Status",
    "WorkerSpec",
    "ask_corpus",
    "collect_files",
    "compress_corpus",
    "document_name",
    "peak_rss_bytes",
    "stream_corpus",
]
