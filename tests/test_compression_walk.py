"""One compression walks each module once: traced calls from the orchestration layer (``tests/walk.py``),
and the document tokenized once per call."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import mode_engine
from tests.walk import PACKAGE, ModuleWalk

VALUES = frozenset(
    f"{PACKAGE}.{name}"
    for name in (
        "homer.config",
        "homer.document.encoded",
        "homer.kv.compressed",
        "homer.document.chunking",
        "homer.leaves.leaf_tier",
        "homer.scoring.chain",
        "homer.model.decoder",
        "homer.scoring.calibration",
        "homer.document.prompt",
    )
)
"""Not bounded here: the values a call hands around (their accessors and properties: ``prompt_len``,
``units``, ``needs_calibration``, ``tier.nbytes``), the calibration table and ``homer.document.prompt``'s
tokenizer helpers, which ``prompting`` calls once for each text it encodes or renders."""

TWICE = {
    "shared": {
        # the engine's call lays the prompt out; tiers checks the document on every call, a cache hit
        # included, and encodes it on a miss only: a stored root needs no tokens
        "engine.prompting": 3,
        # the engine asks which kept form serves the mode, then the call has the form compress
        "engine.modes": 2,
        # AutoRoot asks whether the head-wise root is possible, then builds it
        "homer.tree.headwise": 2,
    },
    "query_aware": {
        "engine.prompting": 3,  # the engine's call lays the prompt out and checks the question; tiers encodes it
        "engine.modes": 2,  # the engine asks which kept form serves the mode, then the call has it compress
        # the leaf tier's passes (no bias, no budget: stored for every question) and the question's
        "homer.tree.compressor": 2,
    },
}
"""Modules a first compression still visits more than once, and why."""


def counting(tokenizer):
    """``tokenizer``, recording every text it is called on (``texts``)."""

    class Counting(type(tokenizer)):
        def __call__(self, text, *args, **kwargs):
            self.texts.append(text)
            return super().__call__(text, *args, **kwargs)

    observed = copy.copy(tokenizer)
    observed.__class__ = Counting
    observed.texts = []
    return observed


@pytest.fixture(scope="module")
def documents(novel: str) -> list[str]:
    """Three documents of ~750 tokens: one warms the engine in both modes, one for each mode's trace."""
    start = novel.index("It is a truth universally acknowledged")
    return [novel[start + i * 3000 : start + (i + 1) * 3000] for i in range(3)]


@pytest.fixture(scope="module")
def engine(tokenizer, calibration, documents):
    """A tiny engine over a counting tokenizer, calibrated and warmed (the shared suffix's length rendered)."""
    engine = mode_engine(counting(tokenizer), calibration)
    engine.calibrate()
    engine.compress(documents[0], mode="shared")
    engine.compress(documents[0], question="Who?", mode="query_aware")
    return engine


@pytest.mark.parametrize(("mode", "index"), [("shared", 1), ("query_aware", 2)])
def test_one_compression_enters_each_module_once_and_tokenizes_the_document_once(engine, documents, mode, index):
    document, texts = documents[index], engine.prompting.tokenizer.texts
    question = "Who is Mr. Bingley?" if mode == "query_aware" else None
    texts.clear()
    with ModuleWalk() as walk:
        engine.compress(document, question=question, mode=mode)
    visits = {name.removeprefix(f"{PACKAGE}."): n for name, n in walk.visits.items() if name not in VALUES}
    assert {name for name, n in visits.items() if n > 1} == set(TWICE[mode]), walk.edges
    for name, bound in TWICE[mode].items():
        assert visits[name] <= bound, (name, walk.edges)
    assert visits["engine.tiers"] == visits["engine.builder"] == visits["homer.reading.strategies"] == 1
    assert sum(document in text for text in texts if isinstance(text, str)) == 1, "tokenized once"

    if mode == "query_aware":  # the next question replays from the stored tier: one compressor, no tokenization
        texts.clear()
        with ModuleWalk() as walk:
            engine.compress(document, question="Where does Mr. Bingley live?", mode="query_aware")
        assert walk.visits[f"{PACKAGE}.homer.tree.compressor"] == 1
        assert not any(document in text for text in texts if isinstance(text, str))
