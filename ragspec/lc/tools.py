"""Tool calling and structured output for the LangChain models, by grammar-constrained decoding.

- ``bind_tools(tools, tool_choice=...)`` binds the tools in OpenAI's format; each call renders
  them into the prompt (``ragspec.engine.tool_calls``' convention) and constrains the answer to
  well-formed calls. ``tool_choice``: ``"auto"`` (default), ``"any"`` / ``"required"``,
  ``"none"``, a tool's name, ``True`` (the only tool) or OpenAI's ``{"type": "function", ...}``.
- ``with_structured_output(schema, method=...)``: ``"json_schema"`` (default) constrains the
  answer to the schema; ``"json_mode"`` to a JSON object, and to the schema when one is given (a
  local model gains nothing from being allowed to miss it); ``"function_calling"`` forces a call
  of a tool built from the schema. Strings the schema leaves unbounded get ``maxLength`` 200
  (``bounded_strings``), so that a small model that repeats itself still finishes the object, and
  objects take only their declared properties unless they allow more (``closed_objects``).
  Pydantic classes give instances, TypedDicts and JSON Schema dicts give dicts; an answer cut
  short raises ``OutputParserException``. Streaming yields the one parsed object at the end.
- ``response_format=`` per call (``RagSpecLLM`` and ``ChatRagSpec``): a ``Constraint``, a JSON
  Schema dict, a Pydantic class or TypedDict, ``"json"``, or OpenAI's ``{"type": "json_object"}`` /
  ``{"type": "json_schema", "json_schema": {"schema": ...}}``.

Every check (a tool without a name or description, an unknown ``tool_choice``, an invalid schema)
runs when the tools or schema are bound, before anything is generated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.exceptions import OutputParserException
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ValidationError
from pydantic.v1 import ValidationError as ValidationErrorV1

from ragspec.chat_request import ToolUse
from ragspec.engine import tool_calls
from ragspec.engine.constraints import OPENAI_RESPONSE_FORMATS, Constraint, ConstraintError, response_format_constraint
from ragspec.lc.messages import message_text
from ragspec.engine.tool_calls import CallStream, CallStreamPiece, Tool, ToolError, bounded_strings

METHODS = ("json_schema", "json_mode", "function_calling")


# -- tools ------------------------------------------------------------------------------------
def to_tool(tool: Any) -> Tool:
    """A ragspec ``Tool`` from anything LangChain takes as a tool (BaseTool, function, Pydantic
    class, TypedDict, OpenAI tool or function dict)."""
    if _is_json_schema_tool(tool):  # LangChain's converter drops what is not under "properties" (allOf, $defs, ...)
        parameters = {k: v for k, v in tool.items() if k not in ("title", "description")}
        return Tool(tool["title"], tool.get("description", ""), parameters)
    try:
        function = convert_to_openai_tool(tool)["function"]
    except Exception as e:
        raise ToolError(f"cannot use {tool!r} as a tool: {e}") from e
    return Tool(function.get("name", ""), function.get("description", ""),
                function.get("parameters") or {"type": "object", "properties": {}})


def _is_json_schema_tool(tool: Any) -> bool:
    """A JSON Schema dict of an object that names itself with ``title`` (not an OpenAI or Anthropic tool dict)."""
    return (isinstance(tool, Mapping) and isinstance(tool.get("title"), str) and tool.get("type", "object") == "object"
            and not {"function", "name", "input_schema", "parameters"} & set(tool))


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The tools in OpenAI's format, each checked (name, description, argument schema)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        t = to_tool(tool)
        same_name = [o["function"] for o in out if o["function"]["name"] == t.name]
        if same_name:  # one tool given twice (a Pydantic class and its JSON Schema) is bound once
            if _untitled(same_name[0]["parameters"]) != _untitled(dict(t.parameters)):
                raise ToolError(f"two tools are named {t.name!r} with different arguments: a call names its tool")
            continue
        tool_calls.tool_call_constraint([t], "any")  # its schema must compile now, not at the first call
        out.append({"type": "function", "function": t.as_json()})
    return out


def _untitled(schema: Any) -> Any:
    """``schema`` without the ``title`` annotations (Pydantic writes them, LangChain's converter drops them)."""
    if not isinstance(schema, Mapping):
        return schema
    return {k: v for k, v in tool_calls.map_subschemas(schema, _untitled).items() if k != "title"}


def bound_tools(kwargs: dict[str, Any]) -> ToolUse | None:
    """Pop ``tools``, ``tool_choice`` and ``parallel_tool_calls`` from a call's options as a
    ``ragspec.chat_request.ToolUse``; None without tools."""
    tools, choice = kwargs.pop("tools", None), kwargs.pop("tool_choice", None)
    parallel = kwargs.pop("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolError(f"parallel_tool_calls must be True or False, got {parallel!r}")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ToolError(f"tool_choice={choice!r} but no tools are bound: use .bind_tools(tools, tool_choice=...)")
        return None
    parsed = tuple(to_tool(t) for t in tools)
    return ToolUse(parsed, tool_calls.parse_choice(choice, parsed), parallel)


# -- response formats ---------------------------------------------------------------------------
def response_constraint(response_format: Any) -> Constraint | None:
    """A per-call ``response_format`` as a constraint (see the module docstring); OpenAI's dicts
    are read by ``ragspec.engine.constraints.response_format_constraint``, as on ``/v1``."""
    if isinstance(response_format, Constraint):
        return response_format
    if response_format == "json":
        return Constraint.json()
    if isinstance(response_format, Mapping) and response_format.get("type") in OPENAI_RESPONSE_FORMATS:
        return response_format_constraint(response_format)
    return Constraint.json_schema(_json_schema(response_format))


def _json_schema(schema: Any) -> dict[str, Any]:
    """A JSON Schema dict from a Pydantic class, a TypedDict or a JSON Schema dict."""
    if isinstance(schema, Mapping):
        function = schema.get("function")
        if schema.get("type") == "function" and isinstance(function, Mapping):  # an OpenAI tool: its arguments
            return dict(function.get("parameters") or {"type": "object", "properties": {}})
        if any(k in schema for k in ("type", "properties", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "items")):
            return dict(schema)
    try:
        return convert_to_json_schema(schema)
    except Exception as e:
        raise ConstraintError(
            f"a structured-output schema must be a Pydantic class, a TypedDict or a JSON Schema dict "
            f"(or, as response_format, a Constraint, 'json' or an OpenAI response_format dict); got {schema!r} ({e})"
        ) from e


# -- structured output -----------------------------------------------------------------------------
def structured_output(
    model: Any, schema: Any, method: str = "json_schema", include_raw: bool = False, **kwargs: Any
) -> Runnable:
    """``ChatRagSpec.with_structured_output`` (see the module docstring)."""
    if kwargs:
        raise ValueError(f"with_structured_output got unsupported argument(s) {', '.join(sorted(kwargs))}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    trace = {"kwargs": {"method": method}, "schema": schema}
    if method == "function_calling":
        if schema is None:
            raise ValueError("method='function_calling' needs a schema")
        if _is_json_schema_tool(schema) and not schema.get("description"):  # a tool needs one; a schema may not have it
            schema = {**schema, "description": f"Give the answer as {schema['title']}."}
        tool = to_tool(schema)
        bounded = {"type": "function", "function": {**tool.as_json(), "parameters": bounded_strings(dict(tool.parameters))}}
        llm = model.bind_tools([bounded], tool_choice=tool.name, parallel_tool_calls=False, ls_structured_output_format=trace)
    else:
        if schema is None and method == "json_schema":
            raise ValueError("method='json_schema' needs a schema (or use method='json_mode')")
        constraint = (Constraint.json() if schema is None
                      else Constraint.json_schema(bounded_strings(tool_calls.closed_objects(_json_schema(schema)))))
        llm = model.bind(response_format=constraint, ls_structured_output_format=trace)

    def parse(message: AIMessage) -> Any:
        """The one object of a complete answer; an answer cut short (token budget, stop string) raises."""
        ended = message.response_metadata.get("finish_reason")
        if method == "function_calling":
            if not message.tool_calls:
                raise OutputParserException(f"the answer holds no complete call (finish_reason {ended!r})",
                                            llm_output=str(message.invalid_tool_calls or message.content))
            values = message.tool_calls[0]["args"]
        else:
            try:
                values = json.loads(message_text(message))
            except json.JSONDecodeError as e:
                raise OutputParserException(f"the answer is not a complete JSON value (finish_reason {ended!r}): {e}",
                                            llm_output=message_text(message)) from e
        if is_pydantic:
            try:  # pydantic 2 models, or pydantic.v1 ones
                return schema.model_validate(values) if hasattr(schema, "model_validate") else schema.parse_obj(values)
            except (ValidationError, ValidationErrorV1) as e:
                raise OutputParserException(f"the answer does not fit {schema.__name__}: {e}", llm_output=json.dumps(values)) from e
        return values

    final = RunnableLambda(parse)  # one object, once the answer is complete
    if not include_raw:
        return llm | final
    with_parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | final, parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | with_parsed.with_fallbacks([fallback], exception_key="parsing_error")


# -- answers -----------------------------------------------------------------------------------------
def answer_message(text: str, **fields: Any) -> AIMessage:
    """The AIMessage of a finished answer: its text, or its calls (a call the answer left
    unfinished is an invalid tool call, as in the streamed message)."""
    stream = CallStream()
    pieces = [*stream.add(text), *stream.flush()]
    if stream.mode != "calls":
        return AIMessage(content=text, **fields)
    calls = [{"name": p.name, "args": p.arguments, "id": p.id, "type": "tool_call"} for p in pieces if not p.error]
    invalid = [{"name": None, "args": p.args, "id": p.id, "error": p.error, "type": "invalid_tool_call"}
               for p in pieces if p.error]
    return AIMessage(content="", tool_calls=calls, invalid_tool_calls=invalid, **fields)  # type: ignore[arg-type]


def piece_message(piece: CallStreamPiece) -> AIMessageChunk:
    """The AIMessageChunk of one piece of a streamed answer with tools bound. An unfinished call
    carries the whole answer as its arguments, which LangChain cannot parse: the merged message
    then holds it as an invalid tool call, as ``answer_message`` does."""
    if piece.index is None:
        return AIMessageChunk(content=piece.text)
    chunk = {"name": piece.name, "args": piece.args, "id": piece.id, "index": piece.index, "type": "tool_call_chunk"}
    return AIMessageChunk(content="", tool_call_chunks=[chunk])  # type: ignore[list-item]
