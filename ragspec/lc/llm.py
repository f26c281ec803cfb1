"""``RagSpecLLM``: a LangChain text-completion LLM over the speculative generator."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LLM, LangSmithParams
from langchain_core.messages import BaseMessage, get_buffer_string
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from pydantic import ConfigDict, PrivateAttr

from ragspec.bridge import iterate_in_thread
from ragspec.chat_request import ChatRequest
from ragspec.engine.config import CallOptions
from ragspec.lc.base import LangChainModel, RagSpecParams, response_metadata, usage

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationResult, TextGenerator


class InstructModelWarning(UserWarning):
    """``RagSpecLLM`` continues its prompt as it is, but the model was tuned on chat turns (it has a chat template)."""


class RagSpecLLM(LangChainModel, LLM, RagSpecParams):
    """Text completion sped up by lossless speculative decoding; the prompt is never echoed.

    The prompt is sent as it is, as OpenAI's and LangChain's completion models do: no chat template is
    applied. A model that has one (the default SmolLM2-135M-Instruct does) was tuned on chat turns and
    often continues a bare prompt poorly or not at all (an empty answer), so the first call of each
    ``RagSpecLLM`` on such a model gives an ``InstructModelWarning`` that says to use ``ChatRagSpec``
    (which applies the template); filter it out where raw completion is meant. Pass
    passages as ``references=[...]`` to draft from each of them; without them the prompt is the
    reference. ``generation_info`` of each generation holds ``finish_reason``, ``model_name``,
    ``usage`` (input/output/total tokens) and the ``speculative`` stats; ``llm_output`` sums the
    usage as ``token_usage``.

    Example::

        llm = RagSpecLLM(max_tokens=64, stop=["\\n\\n"])
        llm.invoke("Passage: ...\\nQuestion: ...\\nAnswer:")
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    _warned: bool = PrivateAttr(default=False)

    @property
    def _llm_type(self) -> str:
        return "ragspec"

    # -- token counting (serialization and get_token_ids: LangChainModel) ----------------------
    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """Prompt tokens of ``messages`` as this LLM gets them: LangChain's one-string rendering
        (``get_buffer_string``), encoded as a prompt."""
        if tools:
            raise ValueError("RagSpecLLM has no tool calling, so it cannot count tool schemas; pass tools=None")
        return len(self.load().encode(get_buffer_string(messages), special_tokens=True))

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self.identifying_params

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(ls_model_type="llm", **self.ls_params(stop, kwargs))  # type: ignore[typeddict-item]

    def _events(self, prompt: str, options: CallOptions) -> Iterator[str | GenerationResult]:
        return self.events(options.model, lambda g: ChatRequest(self._checked(g, prompt), options.config, options.references))

    def _checked(self, generator: TextGenerator, prompt: str) -> str:
        """``prompt``, after an ``InstructModelWarning`` on this object's first call of a model with a chat template."""
        if not self._warned and getattr(generator.tokenizer, "chat_template", None):
            self._warned = True
            warnings.warn(
                f"{generator.model_name} has a chat template (an instruct model): RagSpecLLM completes the prompt as "
                "it is, which such a model often continues poorly or not at all; use ChatRagSpec for questions and "
                "instructions, RagSpecLLM for raw completion",
                InstructModelWarning,
                stacklevel=2,
            )
        return prompt

    @staticmethod
    def _info(event: GenerationResult) -> dict[str, Any]:
        return {**response_metadata(event), "usage": dict(usage(event))}

    @staticmethod
    def _llm_result(finished: list[GenerationResult]) -> LLMResult:
        total = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        for f in finished:
            for key, value in usage(f).items():
                total[key] += value  # type: ignore[operator]
        generations = [[Generation(text=f.text, generation_info=RagSpecLLM._info(f))] for f in finished]
        model = finished[0].model if finished else None
        return LLMResult(generations=generations, llm_output={"token_usage": total, "model_name": model})

    # -- LangChain hooks -----------------------------------------------------------------------
    def _call(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> str:
        return self._generate([prompt], stop, run_manager, **kwargs).generations[0][0].text

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        options = self.call_options(stop, kwargs)
        finished: list[GenerationResult] = []
        for prompt in prompts:
            for event in self._events(prompt, options):
                if not isinstance(event, str):
                    finished.append(event)
                elif run_manager is not None:
                    run_manager.on_llm_new_token(event)
        return self._llm_result(finished)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        options = self.call_options(stop, kwargs)
        finished: list[GenerationResult] = []
        for prompt in prompts:
            async for event in iterate_in_thread(lambda p=prompt: self._events(p, options)):
                if not isinstance(event, str):
                    finished.append(event)
                elif run_manager is not None:
                    await run_manager.on_llm_new_token(event)
        return self._llm_result(finished)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        options = self.call_options(stop, kwargs)
        for event in self._events(prompt, options):
            chunk = self._chunk(event)
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
        options = self.call_options(stop, kwargs)
        async for event in iterate_in_thread(lambda: self._events(prompt, options)):
            chunk = self._chunk(event)
            if run_manager is not None and chunk.text:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    @classmethod
    def _chunk(cls, event: str | GenerationResult) -> GenerationChunk:
        if isinstance(event, str):
            return GenerationChunk(text=event)
        return GenerationChunk(text="", generation_info=cls._info(event))
