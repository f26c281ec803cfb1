"""Tool calling on ``/v1/chat/completions``: OpenAI's request and response shapes, offline.

A tiny random model over the default tokenizer answers: the grammar makes every call it writes
well-formed, so the protocol (tool_calls in the message and in stream deltas, finish reasons,
tool results in the conversation, 400s) is checked exactly without the real model. The real
model through the official clients is in ``test_openai_clients.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import function_tool
from tests.apps.test_openai_api import TinySource

CHAT = "/v1/chat/completions"
CITY = function_tool("weather", "The weather in a city.", city={"enum": ["Paris", "Rome"]})
UNIT = function_tool("convert", "Convert a temperature.", celsius={"type": "boolean"})
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, lc_tiny_model: Any) -> Iterator[httpx.Client]:
    from ragspec.decoding.generator import SpeculativeGenerator

    app = create_app(
        AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path_factory.mktemp("sessions"),
        generation=TinySource(SpeculativeGenerator(lc_tiny_model)),
    )  # fmt: skip
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def chat(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    r = api.post(CHAT, json={"model": "tiny", "messages": ASK, "max_tokens": 40, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def stream(api: httpx.Client, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": "tiny", "messages": ASK, "max_tokens": 40, "stream": True, **fields}
    with api.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def calls_of(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


@pytest.mark.timeout(120)
def test_a_named_or_required_choice_returns_tool_calls_and_the_stream_sends_the_same(api: httpx.Client) -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    body = chat(api, tools=[CITY, UNIT], tool_choice=named, parallel_tool_calls=False)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    ((name, args),) = calls_of(choice["message"])
    assert name == "weather" and args["city"] in ("Paris", "Rome")
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")

    chunks = stream(api, tools=[CITY, UNIT], tool_choice=named, parallel_tool_calls=False)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed = [d["tool_calls"] for d in deltas if d.get("tool_calls")]
    assert [(t[0]["index"], t[0]["function"]["name"], json.loads(t[0]["function"]["arguments"])) for t in streamed] == [
        (0, name, args)
    ]
    assert not any(d.get("content") for d in deltas)  # nothing of the call's text leaks as content
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    required = chat(api, tools=[CITY, UNIT], tool_choice="required")["choices"][0]
    if required["finish_reason"] == "tool_calls":  # a random model may fill the budget with parallel calls
        assert {n for n, _ in calls_of(required["message"])} <= {"weather", "convert"}
    else:
        assert required["finish_reason"] == "length" and required["message"]["content"].startswith("<tool_call>[")


@pytest.mark.timeout(120)
def test_none_answers_in_text_and_tool_turns_enter_the_conversation(api: httpx.Client) -> None:
    none = chat(api, tools=[CITY], tool_choice="none", max_tokens=8)["choices"][0]
    assert none["finish_reason"] in ("stop", "length") and "tool_calls" not in none["message"]
    assert not none["message"]["content"].lstrip().startswith("<")  # the "none" grammar: no markup first
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]  # fmt: skip
    after = chat(api, messages=history, tools=[CITY], max_tokens=6)
    assert after["usage"]["prompt_tokens"] > chat(api, tools=[CITY], max_tokens=1)["usage"]["prompt_tokens"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0]"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": "weather"}, "tools"),
        ({"tools": [CITY, CITY]}, "tools"),
        ({"tools": [CITY], "tool_choice": "weather_report"}, "tool_choice"),
        ({"tools": [CITY], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [CITY], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [CITY], "response_format": {"type": "json_object"}}, "response_format"),
        ({"functions": [CITY["function"]]}, "functions"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "weather"}}]}]}, "messages[0].tool_calls[0]"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": "{oops"}}]}]}, "messages[0].tool_calls[0]"),
        ({"messages": [{"role": "tool", "content": 3}]}, "messages[0].content"),
    ],
)  # fmt: skip
def test_bad_tools_are_400s_naming_the_parameter(api: httpx.Client, fields: dict[str, Any], param: str) -> None:
    r = api.post(CHAT, json={"model": "tiny", "messages": ASK, "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_tool_choice_none_still_has_a_grammar_unless_a_response_format_is_sent() -> None:
    """Under "none" the answer is text that may not open with markup (the default model echoed
    ``<tool_response>`` back when left free); a response_format, when sent, is the grammar instead."""
    from apps.web.openai_api import parse_request, request_constraint

    def grammar(**fields: Any) -> Any:
        return request_constraint(parse_request({"model": "m", "messages": ASK, "tools": [CITY], **fields}, chat=True))

    assert grammar(tool_choice="none").kind == "lark" and grammar(tool_choice="auto").kind == "lark"
    assert grammar(tool_choice="none", response_format={"type": "json_object"}).kind == "json"
