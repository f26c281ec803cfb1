"""Tool calling and structured output of the LangChain models, on a tiny random model.

The model's output is nonsense; the grammar still makes every call and every object well-formed,
which is what these tests check (choosing well is the real model's job).
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from ragspec.engine.constraints import ConstraintError
from ragspec.lc import ChatRagSpec, RagSpecLLM
from ragspec.chat_request import ToolUse, chat_turns
from ragspec.lc.messages import to_chat
from ragspec.engine.tool_calls import CallStream, Tool, ToolError, tool_call_constraint

MAX = 48


@tool
def add(a: Literal[1, 2, 3], b: Literal[1, 2, 3]) -> int:
    """Add two small integers."""
    return a + b


@tool
def weather(city: Literal["Paris", "Oslo"], unit: Literal["C", "F"]) -> str:
    """Get the weather in a city."""
    return "sunny"


class Forecast(BaseModel):
    """A forecast."""

    sky: Literal["sun", "rain", "snow"]
    windy: bool
    level: int = Field(ge=0, le=9)


class ForecastDict(TypedDict):
    """A forecast."""

    sky: Literal["sun", "rain", "snow"]
    windy: bool


@pytest.fixture
def chat(lc_tiny_generator) -> ChatRagSpec:
    return ChatRagSpec(generator=lc_tiny_generator, max_tokens=MAX)


def check_call(call: dict, tools: dict) -> None:
    assert call["name"] in tools and call["id"].startswith("call_") and call["type"] == "tool_call"
    schema = tools[call["name"]]
    assert set(call["args"]) <= set(schema["properties"]) and set(schema.get("required", [])) <= set(call["args"])


@pytest.mark.timeout(300)
def test_forced_tool_calls_are_well_formed_in_invoke_and_stream(chat) -> None:
    tools = {"add": add.args_schema.model_json_schema(), "weather": weather.args_schema.model_json_schema()}
    bound = chat.bind_tools([add, weather], tool_choice="any", parallel_tool_calls=False)
    message = bound.invoke("What is 2 + 3?")
    assert isinstance(message, AIMessage) and message.content == "" and message.tool_calls
    for call in message.tool_calls:
        check_call(call, tools)
    full = None
    for chunk in bound.stream("What is 2 + 3?"):
        assert chunk.content == ""
        full = chunk if full is None else full + chunk
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [(c["name"], c["args"]) for c in message.tool_calls]
    assert all(c["id"] for c in full.tool_calls) and full.tool_call_chunks


@pytest.mark.timeout(300)
def test_tool_choice_by_name_and_none(chat) -> None:
    named = chat.bind_tools([add, weather], tool_choice="weather", parallel_tool_calls=False).invoke("Hi")
    assert [c["name"] for c in named.tool_calls] and all(c["name"] == "weather" for c in named.tool_calls)
    assert all(c["args"]["city"] in ("Paris", "Oslo") for c in named.tool_calls)
    text = chat.bind_tools([add], tool_choice="none").invoke("Hi")
    assert not text.tool_calls and not text.content.startswith("<tool_call>")


@pytest.mark.timeout(300)
def test_speculative_tool_calls_equal_plain_ones(chat) -> None:
    bound = chat.bind_tools([add, weather], tool_choice="any", parallel_tool_calls=False)
    plain = bound.invoke("What is 2 + 3?", speculation=False)
    spec = bound.invoke("What is 2 + 3?", references=['{"name": "add", "arguments": {"a": 2, "b": 3}}'])
    assert [(c["name"], c["args"]) for c in spec.tool_calls] == [(c["name"], c["args"]) for c in plain.tool_calls]
    assert spec.response_metadata["speculative"]["by_source"]["grammar"]["accepted"] > 0


def test_tool_history_is_rendered_in_the_convention() -> None:
    call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "abc", "type": "tool_call"}
    tools = ToolUse((Tool("add", "Add two numbers.", {"type": "object", "properties": {}}),))
    turns = chat_turns(to_chat(
        [HumanMessage("What is 1 + 2"),
         AIMessage([{"type": "text", "text": "Let me add."}, {"type": "tool_use", "id": "abc", "name": "add", "input": {}}],
                   tool_calls=[call]),
         ToolMessage(json.dumps({"result": 3}), tool_call_id="abc")],
    ), tools)
    assert turns == [
        {"role": "system", "content": tools.listing()},
        {"role": "user", "content": "What is 1 + 2"},
        {"role": "assistant", "content": 'Let me add.\n<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'},
        {"role": "user", "content": '<tool_response>\n{"result": 3}\n</tool_response>'},
    ]
    with_system = chat_turns(to_chat([SystemMessage("Be brief."), HumanMessage("hi")]), tools)
    assert with_system[0] == {"role": "system", "content": f"Be brief.\n\n{tools.listing()}"}


@pytest.mark.timeout(300)
def test_a_conversation_with_tool_results_continues(chat) -> None:
    first = chat.bind_tools([add], tool_choice="any").invoke("What is 1 + 2?")
    results = [ToolMessage(str(add.invoke(c["args"])), tool_call_id=c["id"]) for c in first.tool_calls]
    answer = chat.bind_tools([add]).invoke([HumanMessage("What is 1 + 2?"), first, *results])
    assert isinstance(answer, AIMessage)


# -- bad input: clear errors before any generation -----------------------------------------------
def no_docstring(x: int) -> int:
    return x


def test_bad_tools_and_choices_fail_when_bound(chat, monkeypatch) -> None:
    monkeypatch.setattr(chat.load().__class__, "stream", lambda *a, **k: pytest.fail("generation started"))
    with pytest.raises(ToolError, match="needs a description"):
        chat.bind_tools([no_docstring])
    with pytest.raises(ToolError, match="needs a non-empty name"):
        chat.bind_tools([{"type": "function", "function": {"name": "", "description": "d", "parameters": {"type": "object"}}}])
    with pytest.raises(ToolError, match="'multiply' is neither"):
        chat.bind_tools([add], tool_choice="multiply")
    with pytest.raises(ToolError, match="no tools are bound"):
        chat.invoke("hi", tool_choice="any", parallel_tool_calls=False)
    with pytest.raises(ConstraintError, match="Invalid type"):
        chat.with_structured_output({"type": "object", "properties": {"a": {"type": "strin"}}})
    with pytest.raises(ValueError, match="method must be one of"):
        chat.with_structured_output(Forecast, method="xml")
    with pytest.raises(ToolError, match="two tools are named 'add' with different arguments"):
        chat.bind_tools([add, {"type": "function", "function": {"name": "add", "description": "Other.", "parameters": {}}}])
    twice = chat.bind_tools([Forecast, Forecast.model_json_schema()])  # one tool, given twice
    assert [t["function"]["name"] for t in twice.kwargs["tools"]] == ["Forecast"]
    with pytest.raises(ToolError, match="parallel_tool_calls must be True or False"):
        chat.bind_tools([add], parallel_tool_calls="no")
    with pytest.raises(ToolError, match="strict must be"):
        chat.bind_tools([add], strict="yes")
    with pytest.raises(ValueError, match="references must be"):
        chat.invoke("hi", references=5)


@pytest.mark.timeout(120)
def test_langchains_own_flags_and_streamed_history_are_taken(chat) -> None:
    from langchain_core.messages import AIMessageChunk

    assert isinstance(chat.invoke("hi", stream=False).content, str)  # LangChain's routing flag, not an option
    assert isinstance(chat.bind_tools([add], strict=True, tool_choice="add").invoke("hi").tool_calls[0]["args"], dict)
    streamed = sum(chat.stream("hi"), AIMessageChunk(content=""))
    history = [HumanMessage("hi"), streamed, HumanMessage("and?")]
    assert to_chat(history)[1] == {"role": "assistant", "content": streamed.content}
    assert isinstance(chat.invoke(history).content, str)


@pytest.mark.timeout(120)
def test_structured_output_takes_any_json_schema_and_openai_tools(chat) -> None:
    sky = {"enum": ["sun", "rain"]}
    assert chat.with_structured_output(sky).invoke("Sky?") in ("sun", "rain")
    either = {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]}
    assert isinstance(chat.with_structured_output(either).invoke("Either?"), (int, bool))
    tool = {"type": "function", "function": {"name": "pick", "description": "Pick.",
                                             "parameters": {"type": "object", "properties": {"sky": sky}, "required": ["sky"]}}}
    for method in ("json_schema", "function_calling"):
        assert chat.with_structured_output(tool, method=method).invoke("Sky?")["sky"] in ("sun", "rain")


def test_call_stream_releases_whole_calls_and_text() -> None:
    text = '<tool_call>[{"name": "add", "arguments": {"a": 1, "s": "x}\\"y]"}}, {"name": "f", "arguments": {}}]</tool_call>'
    for size in (1, 4, 17, len(text)):
        stream, pieces = CallStream(), []
        for i in range(0, len(text), size):
            pieces += stream.add(text[i : i + size])
        assert stream.flush() == []
        assert [(p.index, p.name, json.loads(p.args)) for p in pieces] == [(0, "add", {"a": 1, "s": 'x}"y]'}), (1, "f", {})]
    stream = CallStream()
    assert stream.add("<tool") == [] and [p.text for p in stream.add(" is a word")] == ["<tool is a word"]
    stream = CallStream()
    assert stream.add("<tool_") == [] and [p.text for p in stream.flush()] == ["<tool_"]  # the answer ended there


@pytest.mark.parametrize("cut", [11, 14, 30, 45, 60, 80])
def test_an_answer_cut_inside_a_call_is_an_invalid_call_streamed_or_not(cut: int) -> None:
    """Cut by the token budget or a stop string: never a call with arguments missing."""
    from langchain_core.messages import AIMessageChunk

    from ragspec.lc.tools import answer_message, piece_message

    full = '<tool_call>[{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "add", "arguments": {"a": 1, "b": 9}}]</tool_call>'
    text = full[:cut]
    stream = CallStream()
    streamed = sum((piece_message(p) for p in [*stream.add(text), *stream.flush()]), AIMessageChunk(content=""))
    invoked = answer_message(text)
    complete = [{"a": 2, "b": 3}] if cut >= full.index(", {") else []
    for message in (streamed, invoked):
        assert message.content == "" and [c["args"] for c in message.tool_calls] == complete, (cut, message)
        assert len(message.invalid_tool_calls) == 1 and message.invalid_tool_calls[0]["args"] == text
    assert invoked.invalid_tool_calls[0]["error"] == "the tool call is incomplete (the answer ended first)"
    assert answer_message(full).tool_calls and not answer_message(full).invalid_tool_calls


def test_tool_call_grammar_by_choice(lc_tokenizer) -> None:
    from ragspec.engine.constraints import Grammar

    tools = [Tool("add", "Add.", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})]
    ids = lc_tokenizer.encode('<tool_call>[{"name": "add", "arguments": {"a": 1}}]</tool_call>', add_special_tokens=False)
    text = lc_tokenizer.encode("Hello there, 3 < 4", add_special_tokens=False)
    echo = lc_tokenizer.encode(" <tool_response>\n3\n</tool_response>", add_special_tokens=False)  # markup first: never text
    for choice, call_ok, text_ok in [("auto", True, True), ("any", True, False), ("none", False, True), ("add", True, False)]:
        grammar = Grammar(tool_call_constraint(tools, choice), lc_tokenizer, len(lc_tokenizer), [lc_tokenizer.eos_token_id])
        assert (grammar._matcher.validate_tokens(ids) == len(ids)) == call_ok, choice
        assert (grammar._matcher.validate_tokens(text) == len(text)) == text_ok, choice
        assert grammar._matcher.validate_tokens(echo) < len(echo), choice


def test_tool_schemas_with_refs_keep_their_meaning(lc_tokenizer) -> None:
    """A tool's "#/$defs/..." and "#" refs point into its own schema, not the call's wrapper."""
    from ragspec.engine.constraints import Grammar

    item = {"type": "object", "properties": {"n": {"$ref": "#/$defs/I"}}, "required": ["n"], "$defs": {"I": {"type": "integer"}}}
    tree = {"type": "object", "properties": {"v": {"type": "integer"}, "child": {"$ref": "#"}}, "required": ["v"]}
    tools = [Tool("count", "Count.", item), Tool("tree", "A tree.", tree)]
    grammar = Grammar(tool_call_constraint(tools, "any"), lc_tokenizer, len(lc_tokenizer), [lc_tokenizer.eos_token_id])

    def accepts(text: str) -> bool:
        ids = lc_tokenizer.encode(text, add_special_tokens=False)
        return grammar._matcher.validate_tokens(ids) == len(ids)

    assert accepts('<tool_call>[{"name": "count", "arguments": {"n": 3}}]</tool_call>')
    assert not accepts('<tool_call>[{"name": "count", "arguments": {"n": "x"}}]</tool_call>')
    assert accepts('<tool_call>[{"name": "tree", "arguments": {"v": 1, "child": {"v": 2}}}]</tool_call>')
    assert not accepts('<tool_call>[{"name": "tree", "arguments": {"v": 1, "child": {"name": "tree"')


def test_schema_rewrites_walk_subschemas_only() -> None:
    from ragspec.lc.tools import bounded_strings
    from ragspec.engine.tool_calls import closed_objects

    # a property named like a keyword is still a schema; enum values are never rewritten
    schema = {"type": "object", "properties": {"default": {"type": "object", "properties": {"x": {"type": "string"}}},
                                               "enum": {"type": "string", "enum": ["properties"]}}}
    closed, bounded = closed_objects(schema), bounded_strings(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["default"]["additionalProperties"] is False
    assert bounded["properties"]["default"]["properties"]["x"]["maxLength"] == 200
    assert bounded["properties"]["enum"] == {"type": "string", "enum": ["properties"]}
    # allOf parts each list their own properties: plain parts are merged into one closed object,
    # others stay open (closing each part would make the whole unsatisfiable)
    both = {"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                        {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert closed_objects(both) == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                    "required": ["a", "b"], "additionalProperties": False}
    overlapping = {"allOf": [{"properties": {"a": {"minimum": 1}}}, {"properties": {"a": {"maximum": 3}}}]}
    assert closed_objects(overlapping) == overlapping


@pytest.mark.timeout(300)
def test_structured_output_takes_allof_and_defs(chat) -> None:
    digit = {"type": "integer", "minimum": 0, "maximum": 9}  # a random model writes digits forever otherwise
    both = {"title": "Both", "type": "object", "allOf": [
        {"properties": {"a": digit}, "required": ["a"]}, {"properties": {"b": digit}, "required": ["b"]}]}  # fmt: skip
    defs = {"title": "Wrapped", "type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}, "required": ["n"],
            "$defs": {"N": digit}}
    long = ChatRagSpec(generator=chat.generator, max_tokens=200)
    for method in ("json_schema", "function_calling"):
        out = long.with_structured_output(both, method=method).invoke("Two numbers?")
        assert isinstance(out["a"], int) and isinstance(out["b"], int), (method, out)
        assert isinstance(long.with_structured_output(defs, method=method).invoke("A number?")["n"], int)


# -- structured output ------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["json_schema", "json_mode", "function_calling"])
def test_structured_output_for_pydantic_typeddict_and_json_schema(chat, method: str) -> None:
    for schema, kind in [(Forecast, Forecast), (ForecastDict, dict), (Forecast.model_json_schema(), dict)]:
        runnable = chat.with_structured_output(schema, method=method)
        result = runnable.invoke("Forecast for tomorrow?")
        assert isinstance(result, kind)
        values = result if isinstance(result, dict) else result.model_dump()
        assert values["sky"] in ("sun", "rain", "snow") and isinstance(values["windy"], bool)
        streamed = list(runnable.stream("Forecast for tomorrow?"))
        assert streamed == [result]  # one complete object, at the end


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["json_schema", "json_mode", "function_calling"])
def test_a_structured_answer_cut_short_is_an_error_not_a_partial_object(chat, method: str) -> None:
    from langchain_core.exceptions import OutputParserException

    for cut in (ChatRagSpec(generator=chat.generator, max_tokens=6), ChatRagSpec(generator=chat.generator, stop=[","])):
        for schema in (ForecastDict, Forecast.model_json_schema(), Forecast):
            with pytest.raises(OutputParserException, match="complete"):
                cut.with_structured_output(schema, method=method).invoke("Forecast?")
            out = cut.with_structured_output(schema, method=method, include_raw=True).invoke("Forecast?")
            assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)


@pytest.mark.timeout(300)
def test_include_raw(chat) -> None:
    out = chat.with_structured_output(Forecast, include_raw=True).invoke("Forecast?")
    assert set(out) == {"raw", "parsed", "parsing_error"} and isinstance(out["raw"], AIMessage)
    assert isinstance(out["parsed"], Forecast) and out["parsing_error"] is None
    short = ChatRagSpec(generator=chat.generator, max_tokens=3)  # the object cannot be finished
    cut = short.with_structured_output(Forecast, include_raw=True).invoke("Forecast?")
    assert cut["parsed"] is None and cut["parsing_error"] is not None


@pytest.mark.timeout(300)
def test_llm_response_format_per_call(lc_tiny_generator) -> None:
    llm = RagSpecLLM(generator=lc_tiny_generator, max_tokens=MAX)
    text = llm.invoke("Forecast:", response_format=Forecast)
    assert Forecast.model_validate_json(text)
    assert isinstance(json.loads(llm.invoke("JSON:", response_format={"type": "json_object"})), dict)
    with pytest.raises(ConstraintError):
        llm.invoke("x", response_format=42)
