"""An agent loop that terminates on ragspec models: ``call_then_answer`` in LangGraph's prebuilt
agent (a tool call after the user's turn, a text answer after the results), on a tiny random
model offline and on the default model."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from ragspec.lc import ChatRagSpec, call_then_answer

prebuilt = pytest.importorskip("langgraph.prebuilt")


@tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Get the current weather in a city."""
    return f"Sunny, 21 C in {city}"


def run_agent(chat: Any) -> list[Any]:
    agent = prebuilt.create_react_agent(call_then_answer(chat, [get_weather]), [get_weather])
    return agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 8})["messages"]


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
    check_one_round(run_agent(ChatRagSpec(generator=lc_tiny_generator, max_tokens=120)))


def test_the_choice_follows_the_last_message() -> None:
    seen: list[Any] = []

    class Recorder:
        def bind_tools(self, tools: Any, tool_choice: str) -> str:
            seen.append(tool_choice)
            return tool_choice

    choose = call_then_answer(Recorder(), [get_weather])
    assert seen == ["any", "none"]
    assert choose({"messages": [HumanMessage("hi")]}, None) == "any"
    result = ToolMessage("Sunny", tool_call_id="call_1")
    assert choose({"messages": [HumanMessage("hi"), AIMessage("", tool_calls=[]), result]}, None) == "none"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_agent_answers_from_the_tool_result_on_the_default_model() -> None:
    final = check_one_round(run_agent(ChatRagSpec(max_tokens=64)))
    assert "sunny" in final.content.lower() and "21" in final.content, final.content
