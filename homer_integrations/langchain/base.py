"""What ``ChatHomer`` and ``HomerLLM`` share: settings, the engine, and one call's preparation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages.ai import UsageMetadata
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from homer_integrations.engine.model import AnswerStream, HomerModel
from homer_integrations.engine.pool import default_model_name, shared_engine
from homer_integrations.engine.prompt_split import PromptSplit, Renderer, split_prompt, start_answer
from homer_integrations.homer.config import Mode, check_mode
from homer_integrations.homer.decoding.generation import GenerationOptions
from homer_integrations.tool_calls import ToolCallFormat

CALL_OPTIONS = frozenset(
    {"document", "mode", "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "response_format"}
)
"""Per-call keyword arguments (``invoke(..., document=...)``, ``bind(mode=...)``); ``response_format``
constrains the answer (see ``homer_integrations.homer.decoding.constraints.ResponseFormat.of``)."""


@dataclass
class HomerCall:
    """One started call: its engine, how the prompt was split, and the answer stream."""

    engine: HomerModel
    split: PromptSplit
    stream: AnswerStream
    model_name: str
    tools: ToolCallFormat | None = None
    """The bound tools (``ChatHomer.bind_tools``) whose calls the answer may hold."""

    def usage(self) -> UsageMetadata:
        """LangChain usage of the finished answer, cache creation / read included (``AnswerInfo.usage``)."""
        return cast(UsageMetadata, self.stream.info.usage())

    def metadata(self) -> dict[str, Any]:
        """``model_name``, ``finish_reason`` and the HOMER statistics (``homer``) of the finished answer."""
        info = self.stream.info
        homer = {**info.metadata(), "document_found_by": self.split.found_by}
        return {"model_name": self.model_name, "finish_reason": info.finish_reason, "homer": homer}


class HomerSettings(BaseModel):
    """Settings and engine handling common to the LangChain models.

    The engine is ``engine=`` when given; otherwise the process-wide engine for ``model``
    (a local path, hub id or embedded name; default ``$HOMER_INTEGRATIONS_MODEL`` or the
    embedded default model), loaded on first use, so constructing a model is always cheap.
    """

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=(), arbitrary_types_allowed=True)

    def _convert_input(self, input: Any) -> Any:
        # LangChain reads bytes as a sequence of ints ("Unsupported message type: <class 'int'>")
        if isinstance(input, bytes | bytearray | memoryview):
            raise TypeError("the prompt must be text (str), not bytes: decode it first")
        return super()._convert_input(input)  # type: ignore[misc]

    engine: HomerModel | None = Field(default=None, exclude=True)
    """The ``HomerModel`` to run on; never serialized (a loaded model re-resolves by name)."""
    model_name: str = Field(default="", alias="model")
    """Model name or path; with ``engine=`` it defaults to the engine's name."""
    temperature: float = Field(default=0.0, ge=0.0)
    """0 decodes greedily."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most new tokens per answer; None: the engine's default (256)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    """Makes sampling repeatable."""
    stop: list[str] | None = None
    """Default stop strings (cut from the answer); a call's ``stop`` replaces them."""
    document: str | None = None
    """A document every call is about (compressed once); a call's ``document=`` replaces it."""
    long_prompt_tokens: int | None = Field(default=None, ge=1)
    """Prompts longer than this are searched for a document to compress (default:
    ``prompt_split.long_prompt_default``: 1,024 tokens or the engine's ``max_chunk_len``, the smaller). See
    ``homer_integrations.engine.prompt_split``."""
    mode: Mode | None = None
    """HOMER mode of a document's answers: ``auto`` (the engine's default: ``full`` for a document that fits
    the window, else ``query_aware``), ``query_aware`` (the question is compressed with the document, from its
    cached leaf tier), ``shared`` (one compressed cache serves
    every question) or ``full`` (kept uncompressed; must fit the window). None: the engine's configured
    mode; a call's ``mode=`` replaces it.
    ``response_metadata["homer"]["mode"]`` says which mode served."""
    store: str | None = None
    """Where compressed documents live, shared by every process with the same model and settings:
    a directory or a URL fsspec knows (``s3://bucket/prefix``). None: the engine's own cache."""

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """Serializable with ``langchain_core.load.dumpd``: the settings, never the engine (a loaded model
        re-resolves by ``model_name`` on first use)."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """Where ``langchain_core.load.load`` finds the class (pass ``valid_namespaces=["homer_integrations"]``)."""
        return ["homer_integrations", "langchain"]

    @field_validator("model_name", mode="before")
    @classmethod
    def _no_name(cls, value: Any) -> Any:
        return "" if value is None else value

    @model_validator(mode="after")
    def _name_the_model(self) -> HomerSettings:
        if not self.model_name:
            self.model_name = self.engine.model_name if self.engine is not None else default_model_name()
        return self

    def resolve_engine(self, model: str | None = None) -> HomerModel:
        """This model's engine, or the shared engine of ``model`` when a call overrides it."""
        if model and model != self.model_name:
            return shared_engine(model, self.store)
        if self.engine is None:
            self.engine = shared_engine(self.model_name, self.store)
        elif self.store is not None and self.engine.document_cache.location != self.store:
            self.engine = self.engine.with_store(self.store)
        return self.engine

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids from the model's own tokenizer (offline)."""
        return self.resolve_engine().token_ids(text)

    def generation_options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> GenerationOptions:
        """This model's settings with a call's overrides (``stop`` and ``kwargs``)."""
        settings = {"max_tokens": self.max_tokens, "stop": self.stop}
        settings |= {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        return GenerationOptions.merged(settings, {**kwargs, "stop": stop})

    def start_call(
        self,
        messages: list[dict[str, str]],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        render: Renderer | None = None,
    ) -> HomerCall:
        """Find the document in ``messages`` (role/content dicts) and start answering."""
        unknown = set(kwargs) - CALL_OPTIONS
        if unknown:
            raise TypeError(f"unsupported call options: {sorted(unknown)}; supported: {sorted(CALL_OPTIONS)}")
        mode = check_mode(kwargs.get("mode"))  # a bad mode fails before an engine loads
        engine = self.resolve_engine(kwargs.get("model"))
        split = split_prompt(
            engine,
            messages,
            document=kwargs.get("document", self.document),
            render=render,
            long_prompt_tokens=self.long_prompt_tokens,
            mode=engine.mode_for(mode, self.mode),
        )
        stream = start_answer(engine, split, self.generation_options(stop, kwargs))
        return HomerCall(engine, split, stream, kwargs.get("model") or self.model_name)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "mode": self.mode,
        }
