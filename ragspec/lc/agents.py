"""Agents on small models: LangChain's ``create_agent`` with a "call, then answer" middleware.

Under ``tool_choice="auto"`` the 135M default model answers in text instead of calling a tool
(``benchmarks/tool_choice_eval.py``: 0 of 6 requests that a bound tool answers get a call; 6 of 6
under ``"any"``). ``CallThenAnswer`` sets the choice of each model call in the agent loop: after a
user turn the answer must be tool calls (``"any"``), after tool results it must be text
(``"none"``), so the loop makes one round of calls and ends with an answer from the results::

    from langchain.agents import create_agent
    from ragspec.lc import ChatRagSpec
    from ragspec.lc.agents import CallThenAnswer

    agent = create_agent(ChatRagSpec(), tools, middleware=[CallThenAnswer()])
    agent.invoke({"messages": [("user", "What is the weather in Paris?")]})

It works for any chat model whose ``bind_tools`` takes ``tool_choice`` (``ChatRagSpec``,
``ChatOpenAI`` on ``ragspec serve``). Needs ``langchain`` 1.x (``pip install 'langchain>=1,<2'``):
``create_agent`` and its middleware live there, not in langchain-core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
except ImportError as e:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "ragspec.lc.agents needs LangChain's agents package: pip install 'langchain>=1,<2'"
    ) from e
from langchain_core.messages import BaseMessage, ToolMessage

__all__ = ["CallThenAnswer", "call_then_answer_choice"]


def call_then_answer_choice(messages: Sequence[BaseMessage]) -> str:
    """``"none"`` (answer in text) right after tool results, else ``"any"`` (call a tool)."""
    return "none" if messages and isinstance(messages[-1], ToolMessage) else "any"


class CallThenAnswer(AgentMiddleware):  # type: ignore[type-arg]
    """``create_agent`` middleware: a tool call after each user turn, a text answer after the results."""

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        return handler(self._chosen(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        return await handler(self._chosen(request))

    @staticmethod
    def _chosen(request: ModelRequest) -> ModelRequest:
        if not request.tools:  # nothing to call: the model answers as it is
            return request
        return request.override(tool_choice=call_then_answer_choice(request.messages))

    def __repr__(self) -> str:
        return "CallThenAnswer()"
