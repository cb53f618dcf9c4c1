"""LangChain's standard chat-model suites for ``ChatHomer`` on the embedded SmolLM2 model.

The engine is loaded once per session (``smol_engine``) and handed to every model the suites
build, so construction stays cheap. The cache hooks (``invoke_with_cache_*_input``, for
``test_usage_metadata*``) check token accounting, not answers, so they run on a tiny random-weight
Llama with the real SmolLM2 tokenizer (``mode_engine``, ``max_chunk_len`` 128): each compresses a real
multi-leaf excerpt of the bundled novel (about 1,300 tokens, ten leaves) in about a second, where
SmolLM2's default head-wise root took 20.
"""

from __future__ import annotations

import itertools
import os
from typing import Any
from unittest import mock

import pytest
from langchain_core.load import dumpd, load
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from homer_integrations.engine.loading import SMOLLM2, converted_dir
from homer_integrations.engine.pool import MODEL_ENV
from homer_integrations.langchain import ChatHomer

_SHARED: dict[str, Any] = {}
_fresh_documents = itertools.count(1)


@pytest.fixture(scope="module", autouse=True)
def _session_engine(smol_engine, novel_excerpt, tokenizer, calibration) -> None:
    from tests.conftest import mode_engine

    _SHARED["engine"] = smol_engine
    _SHARED["excerpt"] = novel_excerpt
    _SHARED["cache_engine"] = mode_engine(tokenizer, calibration, mode="shared")


def _invoke(model: ChatHomer, messages: list, stream: bool, **kwargs: Any) -> AIMessage:
    if not stream:
        return model.invoke(messages, **kwargs)
    full: AIMessageChunk | None = None
    for chunk in model.stream(messages, **kwargs):
        full = chunk if full is None else full + chunk
    assert full is not None
    return full


class _Params:
    @property
    def chat_model_class(self) -> type[ChatHomer]:
        return ChatHomer

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"engine": _SHARED["engine"]}

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        both = ["cache_read_input", "cache_creation_input"]
        return {"invoke": both, "stream": both}


class TestChatHomerUnit(_Params, ChatModelUnitTests):
    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return {MODEL_ENV: "my-org/my-model"}, {}, {"model_name": "my-org/my-model"}

    @pytest.mark.xfail(
        strict=True,
        reason="the suite loads with allowed_objects='all', which admits only the classes in langchain-core's "
        "own mapping: no package outside it can pass as written ('Deserialization of (homer_integrations, "
        "langchain, ChatHomer) is not allowed'); test_serdes_allowing_chathomer runs the same round trip",
    )
    def test_serdes(self, model: ChatHomer, snapshot: Any) -> None:
        super().test_serdes(model, snapshot)

    def test_serdes_allowing_chathomer(self, model: ChatHomer, snapshot: Any) -> None:
        """The standard round trip with ``ChatHomer`` allowed by name, the way a user loads it."""
        env_params, _, _ = self.init_from_env_params
        with mock.patch.dict(os.environ, env_params):
            ser = dumpd(model)
            assert ser == snapshot(name="serialized")
            assert "engine" not in ser["kwargs"]  # a loaded model re-resolves by name
            loaded = load(ser, valid_namespaces=["homer_integrations"], allowed_objects=[ChatHomer])
            assert loaded.asdict() == model.asdict() and loaded.engine is None


class TestChatHomerIntegration(_Params, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # SmolLM2-135M never picks a tool by itself under tool_choice="auto" (measured: 0 of 4 prompts); the
        # agent-loop policy makes the suite's unforced calls (test_agent_loop) call first, then answer
        # max_tokens: the suite checks shapes, not lengths; SmolLM2 otherwise rambles to the 256-token
        # default in most of its ~40 calls (structured answers stay complete: free strings are bounded
        # to fit the budget)
        return {**super().chat_model_params, "default_tool_choice": "first", "max_tokens": 48}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def enable_vcr_tests(self) -> bool:
        # a local model makes no HTTP calls: VCR records nothing and test_stream_time streams for real
        return True

    @property
    def model_override_value(self) -> str:
        # the same weights through another loading path: a local transformers checkpoint
        return str(converted_dir(SMOLLM2))

    def invoke_with_cache_creation_input(self, *, stream: bool = False) -> AIMessage:
        """A document never seen before, passed explicitly: compressed on this call."""
        document = _SHARED["excerpt"](1300, skip=1500 * next(_fresh_documents))
        engine = _SHARED["cache_engine"]
        model = ChatHomer(engine=engine, max_tokens=12)
        before = engine.document_cache.stats().computations
        msg = _invoke(model, [HumanMessage("Who is mentioned first?")], stream, document=document)
        details = msg.usage_metadata["input_token_details"]
        assert engine.document_cache.stats().computations == before + 1
        assert details["cache_creation"] > 0.95 * engine.prompting.count_tokens(document) and details["cache_read"] == 0
        assert msg.response_metadata["homer"]["cache_source"] == "computed"
        return msg

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """An unchanged stuff prompt over a document compressed before: read from the cache."""
        document = _SHARED["excerpt"](1300)
        engine = _SHARED["cache_engine"]
        model = ChatHomer(engine=engine, max_tokens=12)
        prompt = "Answer from the text.\n\n{document}\n\nQuestion: {question}"
        # the first call may create the cache
        model.invoke([HumanMessage(prompt.format(document=document, question="Who is Mr. Bingley?"))])
        question = prompt.format(document=document, question="Who is Mrs. Bennet?")
        msg = _invoke(model, [HumanMessage(question)], stream)
        details = msg.usage_metadata["input_token_details"]
        assert details["cache_read"] > 0.95 * engine.prompting.count_tokens(document) and details["cache_creation"] == 0
        assert msg.response_metadata["homer"]["cache_source"] == "memory"
        return msg
