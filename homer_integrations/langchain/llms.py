"""``HomerLLM``: a LangChain text LLM that compresses each long document once (HOMER)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM, LangSmithParams
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from homer_integrations.engine.aio import iterate_in_thread
from homer_integrations.engine.prompt_split import render_plain_text
from homer_integrations.langchain.base import HomerCall, HomerSettings


class HomerLLM(HomerSettings, BaseLLM):
    """A local Hugging Face model as a LangChain text LLM, for documents beyond its window.

    Finds and compresses long documents in prompts exactly like ``ChatHomer`` (explicit
    ``document=``, a known document, or the long middle of a long prompt). Instruct models
    expect their chat format, so by default a prompt is sent as one user message through the
    chat template; ``apply_chat_template=False`` sends prompts as raw text. ``mode`` (per model,
    or per call: ``invoke(..., mode=...)``) picks the HOMER mode as in ``ChatHomer``.

    Each ``Generation.generation_info`` holds ``usage`` (input / output tokens with
    ``cache_creation`` and ``cache_read``), ``finish_reason`` and the HOMER statistics;
    ``LLMResult.llm_output`` holds ``model_name`` and the summed ``token_usage``.
    """

    apply_chat_template: bool = True
    """Wrap each prompt as a user message in the model's chat template."""

    @property
    def _llm_type(self) -> str:
        return "homer"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "homer"
        params["ls_model_name"] = kwargs.get("model") or self.model_name
        return params

    def _start(self, prompt: str, stop: list[str] | None, kwargs: dict[str, Any]) -> HomerCall:
        render = None if self.apply_chat_template else render_plain_text
        return self.start_call([{"role": "user", "content": prompt}], stop, kwargs, render)

    @staticmethod
    def _info(call: HomerCall) -> dict[str, Any]:
        return {"usage": dict(call.usage()), **call.metadata()}

    def _result(self, generations: list[Generation]) -> LLMResult:
        totals: dict[str, int] = {}
        for g in generations:
            usage = (g.generation_info or {}).get("usage", {})
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                totals[key] = totals.get(key, 0) + usage.get(key, 0)
            for key, n in usage.get("input_token_details", {}).items():
                totals[key] = totals.get(key, 0) + n
        return LLMResult(
            generations=[[g] for g in generations],
            llm_output={"model_name": self.model_name, "token_usage": totals},
        )

    def _generate_one(self, prompt: str, stop: list[str] | None, kwargs: dict[str, Any]) -> Generation:
        call = self._start(prompt, stop, kwargs)
        text = call.stream.text()
        return Generation(text=text, generation_info=self._info(call))

    @staticmethod
    def _chunks(call: HomerCall) -> Iterator[GenerationChunk]:
        for piece in call.stream:
            yield GenerationChunk(text=piece)
        yield GenerationChunk(text="", generation_info=HomerLLM._info(call))

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        return self._result([self._generate_one(p, stop, kwargs) for p in prompts])

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations = await asyncio.gather(*(asyncio.to_thread(self._generate_one, p, stop, kwargs) for p in prompts))
        return self._result(list(generations))

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        # unlike chat models, BaseLLM.stream leaves the token callbacks to _stream
        for chunk in self._chunks(self._start(prompt, stop, kwargs)):
            if run_manager is not None and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        async for chunk in iterate_in_thread(lambda: self._chunks(self._start(prompt, stop, kwargs))):
            if run_manager is not None and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
