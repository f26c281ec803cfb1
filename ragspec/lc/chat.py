"""``ChatRagSpec``: a LangChain chat model over the speculative generator."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.runnables import Runnable
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from pydantic import ConfigDict

from ragspec.bridge import iterate_in_thread
from ragspec.chat_request import ChatRequest, ToolUse, chat_prompt
from ragspec.lc.base import LangChainModel, RagSpecParams, response_metadata, usage
from ragspec.lc.messages import to_chat
from ragspec.lc.tools import answer_message, bound_tools, openai_tools, piece_message, structured_output, to_tool
from ragspec.engine.tool_calls import CallStream, ToolError

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationResult


class ChatRagSpec(LangChainModel, BaseChatModel, RagSpecParams):
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

    # -- token counting (serialization and get_token_ids: LangChainModel) ----------------------
    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """Prompt tokens of ``messages``: the chat template's ids, generation prompt included, as the model
        gets them (with ``tools``, their listing in the system turn too)."""
        listed = ToolUse(tuple(to_tool(t) for t in tools)) if tools else None
        return len(chat_prompt(self.load().tokenizer, to_chat(messages), listed))

    # -- tools and structured output (ragspec.lc.tools) -----------------------------------------------
    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | bool | dict[str, Any] | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the model may call; answers are constrained to well-formed calls (see ``ragspec.lc.tools``).

        ``tool_choice``: ``"auto"`` (default), ``"any"``/``"required"``, ``"none"``, or a tool's name;
        ``parallel_tool_calls=False`` allows one call per answer. ``strict`` (OpenAI's flag) is
        accepted and changes nothing: the grammar always holds arguments to the tool's schema.
        """
        strict = kwargs.pop("strict", None)
        if strict not in (None, True, False):
            raise ToolError(f"strict must be True, False or None, got {strict!r}")
        formatted = openai_tools(tools)
        checks = {"tools": formatted, "tool_choice": tool_choice}
        if "parallel_tool_calls" in kwargs:
            checks["parallel_tool_calls"] = kwargs["parallel_tool_calls"]
        bound_tools(checks)  # an unknown tool_choice or a bad flag fails here, not at the call
        return self.bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: str = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """Answers parsed into ``schema`` (Pydantic class, TypedDict or JSON Schema dict), generated under
        its grammar; ``method``: ``"json_schema"``, ``"json_mode"`` or ``"function_calling"``. The
        grammar always enforces the schema, so ``strict`` (OpenAI's option) changes nothing."""
        return structured_output(self, schema, method, include_raw, **kwargs)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return self.identifying_params

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return LangSmithParams(ls_model_type="chat", **self.ls_params(stop, kwargs))  # type: ignore[typeddict-item]

    # -- events -> chunks ----------------------------------------------------------------------
    def _events(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[Iterator[str | GenerationResult], CallStream | None]:
        """The generation's events (checked before anything runs) and, when tools are bound, the
        ``CallStream`` that reads the calls in its text."""
        tools = bound_tools(kwargs)
        options = self.call_options(stop, kwargs)
        config = options.config
        if tools is not None:
            if config.constraint is not None:
                raise ValueError("a call cannot have both tools and a response_format; bind one of them")
            config = config.merged(constraint=tools.constraint())
        turns = to_chat(messages)
        events = self.events(options.model, lambda g: ChatRequest(chat_prompt(g.tokenizer, turns, tools), config, options.references))
        return events, CallStream() if tools is not None else None

    @staticmethod
    def _chunks(event: str | GenerationResult, calls: CallStream | None) -> list[ChatGenerationChunk]:
        if isinstance(event, str):
            if calls is None:
                return [ChatGenerationChunk(message=AIMessageChunk(content=event))]
            return [ChatGenerationChunk(message=piece_message(p)) for p in calls.add(event)]
        held = [ChatGenerationChunk(message=piece_message(p)) for p in (calls.flush() if calls else [])]
        return [*held, ChatGenerationChunk(
            message=AIMessageChunk(
                content="", usage_metadata=usage(event), response_metadata=response_metadata(event), chunk_position="last"
            )
        )]

    @staticmethod
    def _result(event: GenerationResult, calls: CallStream | None) -> ChatResult:
        fields = {"usage_metadata": usage(event), "response_metadata": response_metadata(event)}
        message = answer_message(event.text, **fields) if calls is not None else AIMessage(content=event.text, **fields)
        return ChatResult(generations=[ChatGeneration(message=message)])

    # -- LangChain hooks -----------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        events, calls = self._events(messages, stop, kwargs)
        for event in events:
            if run_manager is not None:  # the same chunks as streaming gives (the last one carries no text)
                for chunk in self._chunks(event, calls)[: None if isinstance(event, str) else -1]:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            if not isinstance(event, str):
                return self._result(event, calls)
        raise AssertionError("generation ended without a result")  # pragma: no cover

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        events, calls = self._events(messages, stop, kwargs)
        async for event in iterate_in_thread(lambda: events):
            if run_manager is not None:
                for chunk in self._chunks(event, calls)[: None if isinstance(event, str) else -1]:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            if not isinstance(event, str):
                return self._result(event, calls)
        raise AssertionError("generation ended without a result")  # pragma: no cover

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        events, calls = self._events(messages, stop, kwargs)
        for event in events:
            for chunk in self._chunks(event, calls):
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
        events, calls = self._events(messages, stop, kwargs)
        async for event in iterate_in_thread(lambda: events):
            for chunk in self._chunks(event, calls):
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
