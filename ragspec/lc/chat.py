"""``ChatRagSpec``: a LangChain chat model over the speculative generator."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from pydantic import ConfigDict

from ragspec.bridge import iterate_in_thread
from ragspec.config import CallOptions
from ragspec.lc.base import LC_NAMESPACE, RagSpecParams, response_metadata, usage
from ragspec.lc.messages import messages_prompt_ids

if TYPE_CHECKING:
    from ragspec.generator import GenerationResult


class ChatRagSpec(BaseChatModel, RagSpecParams):
    """Chat model whose answers are sped up by lossless speculative decoding.

    Messages go through the model's chat template (a model without one gets a plain transcript
    and a ``NoChatTemplateWarning``; see ``ragspec.prompts.chat_prompt_ids``). Pass the retrieved
    passages as ``references=[...]`` (per call or with ``.bind``) to draft from each of them;
    without references the prompt itself is drafted from. Output is what the model alone would
    produce.

    Example::

        chat = ChatRagSpec(max_tokens=128)
        chat.invoke("What is the capital of France?")
        chat.invoke(messages, references=[doc.page_content for doc in passages])
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    streaming: bool = False
    """Stream internally in ``invoke`` (callbacks get chunks either way)."""

    @property
    def _llm_type(self) -> str:
        return "ragspec-chat"

    # -- serialization and token counting ------------------------------------------------------
    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return list(LC_NAMESPACE)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` by the model's own tokenizer (loads the model on first use)."""
        return self.model_token_ids(text)

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """Prompt tokens of ``messages``: the chat template's ids, generation prompt included, as the model gets them."""
        if tools:
            raise ValueError("ChatRagSpec has no tool calling, so it cannot count tool schemas; pass tools=None")
        return len(messages_prompt_ids(self.load().lm.tokenizer, messages))

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self.identifying_params

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(ls_model_type="chat", **self.ls_params(stop, kwargs))  # type: ignore[typeddict-item]

    # -- events -> chunks ----------------------------------------------------------------------
    def _events(self, messages: list[BaseMessage], options: CallOptions) -> Iterator[str | GenerationResult]:
        return self.events(options, lambda g: messages_prompt_ids(g.lm.tokenizer, messages))

    @staticmethod
    def _chunk(event: str | GenerationResult) -> ChatGenerationChunk:
        if isinstance(event, str):
            return ChatGenerationChunk(message=AIMessageChunk(content=event))
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="", usage_metadata=usage(event), response_metadata=response_metadata(event), chunk_position="last"
            )
        )

    @staticmethod
    def _result(event: GenerationResult) -> ChatResult:
        message = AIMessage(
            content=event.text, usage_metadata=usage(event), response_metadata=response_metadata(event)
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    # -- LangChain hooks -----------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        options = self.call_options(stop, kwargs)
        for event in self._events(messages, options):
            if not isinstance(event, str):
                return self._result(event)
            if run_manager is not None:
                run_manager.on_llm_new_token(event, chunk=self._chunk(event))
        raise AssertionError("generation ended without a result")  # pragma: no cover

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        options = self.call_options(stop, kwargs)
        async for event in iterate_in_thread(lambda: self._events(messages, options)):
            if not isinstance(event, str):
                return self._result(event)
            if run_manager is not None:
                await run_manager.on_llm_new_token(event, chunk=self._chunk(event))
        raise AssertionError("generation ended without a result")  # pragma: no cover

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        options = self.call_options(stop, kwargs)
        for event in self._events(messages, options):
            chunk = self._chunk(event)
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        options = self.call_options(stop, kwargs)
        async for event in iterate_in_thread(lambda: self._events(messages, options)):
            chunk = self._chunk(event)
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
