"""``ragspec serve`` through the clients LangChain users already have: LangChain's standard suite
for ``ChatOpenAI`` pointed at a live server (tool calling, tool choice, structured output and JSON
mode on), and tool calls through the ``openai`` client, streamed and whole.

One ``ragspec serve`` subprocess on the default model serves the whole module. Each standard test
that the model (not the protocol) fails is an expected failure, strict, with the reason measured.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.apps.fakes import function_tool
from tests.apps.ragspec_server import ServeProcess
from tests.ragspec.test_langchain_chat_standard import Capabilities

openai = pytest.importorskip("openai")
langchain_openai = pytest.importorskip("langchain_openai")
from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402


pytestmark = pytest.mark.integration

KEY = "test-key-" + secrets.token_urlsafe(18)
_served: list[ServeProcess] = []


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[ServeProcess]:
    process = ServeProcess("--max-tokens", "512", api_key=KEY)
    try:
        _served.append(process.wait_ready())
        yield process
    finally:
        _served.clear()
        process.stop()


def live_url() -> str:
    (process,) = _served
    return f"{process.url}/v1"


WEATHER = function_tool("get_weather", "Get the current weather in a city.", city={"type": "string"})
TIME = function_tool("get_time", "Get the local time in a city.", city={"type": "string"})


@pytest.fixture
def client() -> Iterator[Any]:
    with openai.OpenAI(base_url=live_url(), api_key=KEY, max_retries=0, timeout=300) as c:
        yield c


@pytest.mark.timeout(300)
def test_openai_client_tool_calls_whole_and_streamed_agree(client: Any) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris and the time in Rome?"}]
    whole = client.chat.completions.create(
        model="default", messages=messages, tools=[WEATHER, TIME], tool_choice="required", max_tokens=96
    )
    (choice,) = whole.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls and all(name in ("get_weather", "get_time") and set(args) == {"city"} for name, args in calls)

    streamed: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model="default", messages=messages, tools=[WEATHER, TIME], tool_choice="required", max_tokens=96, stream=True
    ):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:  # OpenAI's accumulation, as clients do it
            entry = streamed.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(e["name"], json.loads(e["arguments"])) for _, e in sorted(streamed.items())] == calls

    # the tool results go back, and the model answers in text under "none"
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C" if c.function.name == "get_weather" else "14:05"}
        for c in choice.message.tool_calls
    ]
    answer = client.chat.completions.create(
        model="default", messages=[*messages, choice.message.model_dump(exclude_none=True), *results],
        tools=[WEATHER, TIME], tool_choice="none", max_tokens=48,
    )  # fmt: skip
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and text and "<tool" not in text


@pytest.mark.timeout(300)
def test_structured_output_that_fills_max_tokens_exactly_is_complete(client: Any) -> None:
    """``finish_reason`` is "stop" when the JSON completes at the budget (``ChatOpenAI`` raises on "length")."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    messages = [{"role": "user", "content": "Is the sky blue?"}]
    whole = client.chat.completions.create(model="default", messages=messages, response_format=fmt, max_tokens=32)
    exact = client.chat.completions.create(
        model="default", messages=messages, response_format=fmt, max_tokens=whole.usage.completion_tokens
    )
    assert exact.choices[0].message.content == whole.choices[0].message.content
    assert exact.choices[0].finish_reason == "stop" and json.loads(exact.choices[0].message.content)["ok"] in (True, False)


@pytest.mark.timeout(300)
def test_chat_openai_structured_output_json_mode_and_an_agent_through_the_server() -> None:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    class Joke(BaseModel):
        """A joke."""

        setup: str = Field(description="the question")
        punchline: str = Field(description="the answer")

    llm = langchain_openai.ChatOpenAI(base_url=live_url(), api_key=KEY, model="default", temperature=0, max_retries=0,
                                      max_tokens=256)  # fmt: skip
    for method in ("function_calling", "json_schema"):  # strings bounded by the server: the object completes
        joke = llm.with_structured_output(Joke, method=method).invoke("Tell me a joke about cats.")
        assert isinstance(joke, Joke) and joke.setup and joke.punchline
    # json_mode with no word of JSON in the prompt: the server tells the model to write one
    mode = llm.with_structured_output(method="json_mode").invoke("Describe a cat in two words.", max_tokens=64)
    assert isinstance(mode, dict) and mode

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "Sunny, 21 C"

    agents = pytest.importorskip("langchain.agents")
    from ragspec.lc.agents import CallThenAnswer

    agent = agents.create_agent(llm, [get_weather], middleware=[CallThenAnswer()])
    messages = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 8})["messages"]
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert isinstance(messages[2], ToolMessage) and isinstance(messages[3], AIMessage) and not messages[3].tool_calls
    assert "sunny" in messages[3].content.lower(), messages[3].content


class TestChatOpenAIOnRagspecServe(Capabilities, ChatModelIntegrationTests):
    """LangChain's standard integration suite for ``ChatOpenAI`` against ``ragspec serve``, with
    ``ChatRagSpec``'s capabilities (the server serves the same features)."""

    @property
    def chat_model_class(self) -> type:
        return langchain_openai.ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        # stream_usage: ChatOpenAI asks for usage in streams only from OpenAI's own URL unless told.
        # A fresh async HTTP client per model: the default one is cached across the event loops of
        # the async tests, and a closed loop's client fails ("Event loop is closed").
        return {"base_url": live_url(), "api_key": KEY, "model": "default", "temperature": 0, "max_tokens": 256,
                "stream_usage": True, "http_async_client": httpx.AsyncClient(timeout=300)}  # fmt: skip

    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    @pytest.mark.xfail(
        reason="the 135M model answers in text under tool_choice='auto' (as ChatRagSpec's own standard "
        "test_agent_loop, benchmarks/tool_choice_eval.py: 0/6 calls under 'auto')",
        strict=True,
    )
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(
        reason="json_object mode carries no schema, so nothing holds the model to the keys the prompt asks "
        "for: the 135M model writes {\"setup\": \"The cat was having a cat-themed party, ...\"} without "
        "'punchline' (ChatRagSpec's json_mode constrains to the schema it is given; the server is not given one)",
        strict=True,
    )
    def test_json_mode(self, model: Any) -> None:
        super().test_json_mode(model)


@pytest.mark.timeout(600)
def test_document_qa_answers_the_same_through_chat_openai_as_with_the_local_model() -> None:
    """Greedy on both sides, the same prompt turns: the server applies the chat template the
    pipeline applies locally, so the answer and its citations are the same."""
    from ragspec.pipeline import DocumentQA
    from ragspec.registry import LocalModel
    from tests.ragspec.test_pipeline import PASSAGES, FixedRetriever

    retriever = FixedRetriever(passages=PASSAGES)
    remote = langchain_openai.ChatOpenAI(base_url=live_url(), api_key=KEY, model="default", temperature=0, max_retries=0,
                                        max_tokens=64)  # fmt: skip
    through_server = DocumentQA(retriever, remote).ask("When does the ferry leave Dunmore?")
    local = DocumentQA(retriever, LocalModel()).ask("When does the ferry leave Dunmore?", max_tokens=64)
    assert through_server.text == local.text and through_server.text
    assert [c.number for c in through_server.citations] == [c.number for c in local.citations]
    assert through_server.stats is None and local.stats is not None
