"""``store=`` on ``ChatHomer`` and ``HomerLLM``: a later model (another engine) answers from the stored entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from homer_integrations.langchain import ChatHomer, HomerLLM
from tests.conftest import mode_engine

QUESTION = "Who is Mr. Bingley?"


def test_a_second_model_answers_from_the_shared_store(tokenizer: Any, calibration: Path, tmp_path: Path, text: str):
    url = (tmp_path / "shared").as_uri()
    writer = ChatHomer(engine=mode_engine(tokenizer, calibration), store=url, max_tokens=2)
    first = writer.invoke(QUESTION, document=text)
    assert first.response_metadata["homer"]["cache_source"] == "computed"
    assert writer.resolve_engine().document_cache.location == url

    reader = HomerLLM(engine=mode_engine(tokenizer, calibration), store=url, max_tokens=2)
    engine = reader.resolve_engine()
    assert engine.document_cache.location == url
    answer = reader.invoke(QUESTION, document=text)
    assert answer == first.content
    assert engine.document_cache.stats().computations == 0 and engine.document_cache.stats().hits_disk == 1
