"""``store=`` on ``HomerLLM``: a later LLM (another engine) answers from what an earlier one stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from homer_integrations.llama_index import HomerLLM
from tests.conftest import mode_engine

QUESTION = "Who is Mr. Bingley?"


def test_a_second_llm_answers_from_the_shared_store(tokenizer: Any, calibration: Path, tmp_path: Path, text: str):
    url = (tmp_path / "shared").as_uri()
    writer = HomerLLM(engine=mode_engine(tokenizer, calibration), store=url, num_output=2)
    first = writer.complete(QUESTION, document=text)
    assert first.additional_kwargs["cache_source"] == "computed" and writer.engine.document_cache.location == url

    reader = HomerLLM(engine=mode_engine(tokenizer, calibration), store=url, num_output=2)
    again = reader.complete(QUESTION, document=text)
    assert again.additional_kwargs["cache_source"] == "disk" and again.text == first.text
    assert reader.engine.document_cache.stats().computations == 0
