"""Fixtures for the LlamaIndex adapter tests: a ``HomerLLM`` over the session's SmolLM2 engine,
an instrumentation event recorder, and a multi-chunk excerpt of the bundled novel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index_instrumentation.base import BaseEvent


class EventRecorder(BaseEventHandler):
    """Keeps every instrumentation event the root dispatcher sees."""

    events: list[BaseEvent] = Field(default_factory=list)

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def names(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


@pytest.fixture
def events() -> Iterator[EventRecorder]:
    recorder = EventRecorder(events=[])
    root = get_dispatcher()
    root.add_event_handler(recorder)
    try:
        yield recorder
    finally:
        root.event_handlers.remove(recorder)


@pytest.fixture(scope="session")
def homer_llm(smol_engine):
    from homer_integrations.llama_index import HomerLLM

    return HomerLLM(engine=smol_engine, num_output=12)


@pytest.fixture(scope="session")
def excerpt(smol_engine, novel) -> str:
    """About 2,400 tokens of chapters 1-2 of Pride and Prejudice: three leaves at max_chunk_len 1024."""
    start = novel.index("It is a truth universally acknowledged")
    ids = smol_engine.prompting.token_ids(novel[start:])[:2400]
    return smol_engine.tokenizer.decode(ids)
