"""Agents on ragspec models with LangChain's ``create_agent``: the ``CallThenAnswer`` middleware makes
the loop call a tool after the user's turn and answer in text after the results, on a tiny random
model offline, through the async path, and on the default model."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from ragspec.lc import ChatRagSpec

agents = pytest.importorskip("langchain.agents")
from ragspec.lc.agents import CallThenAnswer, call_then_answer_choice  # noqa: E402

QUESTION = {"messages": [("user", "What is the weather in Paris?")]}
LIMIT = {"recursion_limit": 8}


@tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Get the current weather in a city."""
    return f"Sunny, 21 C in {city}"


def make_agent(chat: Any) -> Any:
    return agents.create_agent(chat, [get_weather], middleware=[CallThenAnswer()])


def check_one_round(messages: list[Any]) -> AIMessage:
    """user, a call, its result, a text answer: the loop ended by itself, with the result in hand."""
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage], messages
    (call,) = messages[1].tool_calls
    assert call["name"] == "get_weather" and messages[2].content.startswith("Sunny, 21 C in ")
    final = messages[3]
    assert not final.tool_calls and isinstance(final.content, str) and not final.content.lstrip().startswith("<")
    return final


@pytest.mark.timeout(300)
def test_the_agent_calls_once_then_answers_on_a_tiny_model(lc_tiny_generator: Any) -> None:
    check_one_round(make_agent(ChatRagSpec(generator=lc_tiny_generator, max_tokens=120)).invoke(QUESTION, LIMIT)["messages"])


@pytest.mark.timeout(300)
async def test_the_agent_streams_asynchronously(lc_tiny_generator: Any) -> None:
    agent = make_agent(ChatRagSpec(generator=lc_tiny_generator, max_tokens=120))
    tokens: list[Any] = []
    async for chunk, meta in agent.astream(QUESTION, LIMIT, stream_mode="messages"):
        if meta["langgraph_node"] == "model":
            tokens.append(chunk)
    final = check_one_round((await agent.ainvoke(QUESTION, LIMIT))["messages"])
    assert len(tokens) > 2  # the call's and the answer's chunks, as the model streamed them
    assert "".join(t.content for t in tokens).endswith(final.content)


def test_without_the_middleware_the_default_choice_is_left_to_the_model(lc_tiny_generator: Any) -> None:
    seen: list[Any] = []

    class Recording(ChatRagSpec):
        def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
            seen.append(tool_choice)
            return super().bind_tools(tools, tool_choice=tool_choice, **kwargs)

    chat = Recording(generator=lc_tiny_generator, max_tokens=120)
    agents.create_agent(chat, [get_weather]).invoke(QUESTION, LIMIT)
    assert seen[0] is None  # "auto": the 135M model may answer in text (README, "agents")
    seen.clear()
    make_agent(chat).invoke(QUESTION, LIMIT)
    assert seen == ["any", "none"]


def test_the_choice_follows_the_last_message() -> None:
    assert call_then_answer_choice([HumanMessage("hi")]) == "any"
    assert call_then_answer_choice([HumanMessage("hi"), AIMessage(""), ToolMessage("Sunny", tool_call_id="c")]) == "none"
    assert call_then_answer_choice([]) == "any"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_agent_answers_from_the_tool_result_on_the_default_model() -> None:
    final = check_one_round(make_agent(ChatRagSpec(max_tokens=64)).invoke(QUESTION, LIMIT)["messages"])
    assert "sunny" in final.content.lower() and "21" in final.content, final.content
