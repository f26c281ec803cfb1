"""Tool calls for local models: the prompt convention, the grammar of a call, and its parser.

The default model's chat template (SmolLM2-135M-Instruct) has no tool support, so ragspec uses
the format SmolLM2-Instruct was fine-tuned on for function calling:

- the tools are listed as JSON between ``<tools>`` and ``</tools>`` in the system turn, with the
  instruction to call them as ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``;
- an assistant turn that called tools is written in that same form;
- a tool's result comes back as a user turn ``<tool_response>\\n...\\n</tool_response>``.

The grammar (``tool_call_constraint``) makes every call well-formed: a known tool name, arguments
valid against that tool's JSON Schema (with no properties beyond those it declares, unless it
allows them explicitly), nothing after ``</tool_call>``. It cannot make a 135M
model choose the right tool or the right values: that is the model's job.

``tool_choice``: ``"auto"`` (an answer in text, or calls), ``"any"`` (at least one call),
``"none"`` (text only), or a tool's name (a call of that tool). A text answer may not start with
``<`` (after spaces): a call is the only markup an answer opens with, and after a tool's result
the default model, left free, echoes ``<tool_response>`` back instead of answering from it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragspec.engine.constraints import JSON_OPTIONS, Constraint, ConstraintError, check_finite

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CHOICES = ("auto", "any", "none")


class ToolError(ValueError):
    """A tool definition or a ``tool_choice`` that cannot be used; the message names it."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and a JSON Schema of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ToolError(f"a tool needs a non-empty name, got {self.name!r}")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ToolError(f"tool {self.name!r} needs a description: the model reads it to choose the tool")
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type", "object") != "object":
            raise ToolError(f"tool {self.name!r}: parameters must be a JSON Schema of type 'object'")

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_ONE = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames", "contains", "not",
               "if", "then", "else", "additionalItems", "unevaluatedItems")


def map_subschemas(schema: Mapping[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """``schema`` with ``fn`` applied to each of its direct subschemas (the values of ``properties``,
    the branches of ``anyOf``, ``items``, ...); other keywords, and property names, as they are."""
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            out[key] = {name: fn(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [fn(sub) for sub in schema[key]]
    for key in _SCHEMA_ONE:
        if isinstance(schema.get(key), Mapping):
            out[key] = fn(schema[key])
    return out


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties and
    does not say otherwise: a call's arguments (or a structured answer) hold the declared fields only.

    An ``allOf`` of plain object parts (properties and required names, no property in two parts)
    is merged into one object first. Other objects combined with ``allOf`` stay open (each part
    lists only its own properties, so closing them would make the parts reject each other); their
    nested objects are closed.
    """
    if not isinstance(schema, Mapping):
        return schema
    if (merged := _merged_all_of(schema)) is not None:
        return closed_objects(merged)
    out = map_subschemas(schema, closed_objects)
    if isinstance(schema.get("allOf"), list):
        out["allOf"] = [map_subschemas(part, closed_objects) if isinstance(part, Mapping) else part for part in schema["allOf"]]
    keeps_open = any(k in schema for k in ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf"))
    if "properties" in schema and not keeps_open:
        out["additionalProperties"] = False
    return out


STRING_LIMIT = 200
"""``maxLength`` given to the strings of a structured-output schema that set no bound of their own."""


def bounded_strings(schema: Any, limit: int = STRING_LIMIT) -> Any:
    """``schema`` with ``maxLength: limit`` on every string that has no length, pattern, format or value set.

    A small model under greedy decoding can repeat itself inside a string until the token budget
    runs out, which leaves the object unfinished; with a bound the grammar closes the string and
    the object completes. Pass your own ``maxLength`` to choose another bound.
    """
    if not isinstance(schema, Mapping):
        return schema
    out = map_subschemas(schema, lambda sub: bounded_strings(sub, limit))
    types = schema.get("type")
    is_string = types == "string" or (isinstance(types, list) and "string" in types)
    if is_string and not any(k in schema for k in ("maxLength", "pattern", "format", "enum", "const")):
        out["maxLength"] = limit
    return out


def _merged_all_of(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """One object for ``{"allOf": [object parts]}`` (see ``closed_objects``), or None."""
    parts = schema.get("allOf")
    plain = ("type", "properties", "required", "title", "description")
    if not (isinstance(parts, list) and parts and all(isinstance(p, Mapping) and set(p) <= set(plain)
                                                      and p.get("type", "object") == "object" for p in parts)):
        return None
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    if merged.get("type", "object") != "object":
        return None
    properties = dict(merged.get("properties") or {})
    required = list(merged.get("required") or [])
    for part in parts:
        for name, sub in (part.get("properties") or {}).items():
            if name in properties:
                return None  # two constraints on one property: left to the grammar engine
            properties[name] = sub
        required += [name for name in part.get("required") or [] if name not in required]
    return {**merged, "type": "object", "properties": properties, "required": required}


def _rebased(schema: Any, base: str) -> Any:
    """``schema`` with its local ``$ref``s (``#...``) pointing below ``base`` instead of the root."""
    if not isinstance(schema, Mapping):
        return schema
    out = map_subschemas(schema, lambda sub: _rebased(sub, base))
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    return out


def check_choice(tools: Sequence[Tool], choice: str | None) -> str:
    """``choice`` normalised (``None`` -> ``"auto"``; ``"required"`` -> ``"any"``), or a ``ToolError``."""
    names = [t.name for t in tools]
    if choice is None:
        return "auto"
    if choice == "required":
        return "any"
    if choice in CHOICES or choice in names:
        if choice == "any" and not tools:
            raise ToolError("tool_choice='any' needs at least one tool")
        return choice
    raise ToolError(f"tool_choice {choice!r} is neither 'auto', 'any', 'none' nor one of the tools ({', '.join(names) or 'none bound'})")


def openai_tool(value: object) -> Tool:
    """A ``Tool`` from OpenAI's ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    function = value.get("function") if isinstance(value, Mapping) and value.get("type") == "function" else None
    if not isinstance(function, Mapping):
        raise ToolError('a tool must be {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}')
    parameters = function.get("parameters")
    return Tool(function.get("name", ""), function.get("description", ""),
                {"type": "object", "properties": {}} if parameters is None else parameters)


def parse_choice(tool_choice: object, tools: Sequence[Tool]) -> str:
    """OpenAI's and LangChain's spellings of ``tool_choice`` (``"auto"``, ``"required"``/``"any"``,
    ``"none"``, a tool's name, ``{"type": "function", "function": {"name": ...}}``, ``True`` for the
    only tool, ``False`` for none) as ``check_choice`` returns them."""
    if tool_choice is True:
        if len(tools) != 1:
            raise ToolError(f"tool_choice=True needs exactly one tool, got {len(tools)}")
        tool_choice = tools[0].name
    elif tool_choice is False:
        tool_choice = "none"
    elif isinstance(tool_choice, Mapping):
        function = tool_choice.get("function") if tool_choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise ToolError(f"tool_choice {dict(tool_choice)!r} is not {{'type': 'function', 'function': {{'name': ...}}}}")
        tool_choice = name
    elif tool_choice is not None and not isinstance(tool_choice, str):
        raise ToolError(f"tool_choice must be a string, True, or a dict naming a function; got {tool_choice!r}")
    return check_choice(tools, tool_choice)


def tool_call_constraint(tools: Sequence[Tool], choice: str | None = "auto", parallel: bool = True) -> Constraint:
    """The grammar of an answer under ``choice`` (see the module docstring); ``parallel=False``
    allows one call per answer instead of a list of them."""
    choice = check_choice(tools, choice)
    chosen = [t for t in tools if choice in ("auto", "any") or t.name == choice]
    # A text answer may not open with markup: after a tool's result the default model otherwise
    # echoes the <tool_response> wrapper (or invents a tag) instead of answering from it.
    text = "TEXT: /(.|\\n)*/ & ~/[ \\t\\n]*<(.|\\n)*/"
    if choice == "none" or not chosen:
        return _lark("start: TEXT\n" + text, "none")
    for t in chosen:
        try:
            check_finite(t.parameters, f"the parameters of tool {t.name!r}")
        except ConstraintError as e:
            raise ToolError(str(e)) from e
    # Each tool's argument schema sits under $defs, its local $refs rebased there, so that "#/$defs/X"
    # (or "#" for a recursive schema) still means what it meant in the tool's own schema.
    schema = {
        "x-guidance": JSON_OPTIONS,
        "$defs": {f"arguments{i}": _rebased(closed_objects(dict(t.parameters)), f"#/$defs/arguments{i}")
                  for i, t in enumerate(chosen)},
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": {"$ref": f"#/$defs/arguments{i}"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for i, t in enumerate(chosen)
        ],
    }
    items = 'item (", " item)*' if parallel else "item"
    call = f'call: "{CALL_OPEN}[" {items} "]{CALL_CLOSE}"\nitem: %json {json.dumps(schema)}'
    start = "start: TEXT | call\n" + text if choice == "auto" else "start: call"
    return _lark(start + "\n" + call, choice)


def _lark(grammar: str, choice: str) -> Constraint:
    try:
        return Constraint.lark(grammar)
    except ConstraintError as e:
        raise ToolError(f"the tools' argument schemas cannot be used (tool_choice={choice!r}): {e}") from e


def system_prompt(tools: Sequence[Tool], choice: str = "auto") -> str:
    """The instruction listing ``tools`` (added to the system turn)."""
    listing = json.dumps([t.as_json() for t in tools], ensure_ascii=False)
    how = (
        f'To call functions, answer only with {CALL_OPEN}[{{"name": "function name", "arguments": '
        f'{{"argument name": "value"}}}}]{CALL_CLOSE}, one object per call.'
    )
    when = {
        "auto": " If no function fits the question, answer it in plain text.",
        "none": " Do not call a function now: answer in plain text.",
    }.get(choice, " Call at least one function.")
    return (
        "You can call the functions listed as JSON between <tools> and </tools>.\n"
        f"<tools>{listing}</tools>\n{how}{when}"
    )


def format_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """An assistant turn that made these calls, as the model writes it."""
    items = ", ".join(json.dumps({"name": name, "arguments": dict(args)}, ensure_ascii=False) for name, args in calls)
    return f"{CALL_OPEN}[{items}]{CALL_CLOSE}"


def format_result(content: str) -> str:
    """A tool's result as the user turn that hands it back."""
    return f"<tool_response>\n{content}\n</tool_response>"


def call_turn(text: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, str]:
    """The assistant turn of an answer that made ``calls`` (after its text, if any)."""
    written = format_calls(calls)
    return {"role": "assistant", "content": f"{text}\n{written}" if text.strip() else written}


def result_turn(content: str) -> dict[str, str]:
    """The turn that hands a tool's result back to the model."""
    return {"role": "user", "content": format_result(content)}


def with_system_text(turns: Sequence[Mapping[str, str]], text: str) -> list[dict[str, str]]:
    """``turns`` with ``text`` (e.g. ``system_prompt``'s listing of the tools) added to the system
    turn (one is created if there is none)."""
    out = [dict(turn) for turn in turns]
    if not text:
        return out
    if out and out[0].get("role") == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallStreamPiece:
    """What one streamed delta adds: text, or one whole call (``index``, ``name``, a new ``id``,
    ``arguments`` and ``args``, the same arguments as JSON text). At the end of an answer whose
    calls are unfinished, a piece with ``error`` set holds the whole answer as ``args``."""

    text: str = ""
    index: int | None = None
    name: str | None = None
    id: str | None = None
    args: str = ""
    arguments: dict[str, Any] | None = None
    error: str | None = None


class CallStream:
    """Turns an answer's text deltas into text pieces and tool calls as each call completes.

    While the answer could still be the start of ``<tool_call>`` nothing is released. In a list of
    calls, an item ``{"name": "...", "arguments": {...}}`` is released once it is complete, never
    half-way: an answer cut inside a call (by the token budget or a stop string) would otherwise
    leave merged chunks that look like a finished call with arguments missing. ``flush`` at the
    end reports a list the answer left unfinished (or that is not a list of calls) as one piece
    with ``error`` set.
    """

    def __init__(self) -> None:
        self.text = ""
        self.mode = "undecided"  # "text" | "calls"
        self._pos = 0  # in calls: how far ``text`` was parsed
        self._expect = "["  # in calls: "[", "item", "sep", "close", "done" or "bad"
        self._index = 0
        self._decoder = json.JSONDecoder()

    def add(self, delta: str) -> list[CallStreamPiece]:
        self.text += delta
        if self.mode == "undecided":
            if self.text.startswith(CALL_OPEN):
                self.mode, self._pos = "calls", len(CALL_OPEN)
            elif CALL_OPEN.startswith(self.text):
                return []
            else:
                self.mode = "text"
                return [CallStreamPiece(text=self.text)]
        if self.mode == "text":
            return [CallStreamPiece(text=delta)] if delta else []
        return self._calls()

    def flush(self) -> list[CallStreamPiece]:
        """At the end of the answer: text still held back (it only looked like the start of a
        call), or the unfinished calls as an error piece."""
        if self.mode == "undecided" and self.text:
            self.mode = "text"
            return [CallStreamPiece(text=self.text)]
        if self.mode == "calls" and self._expect != "done":
            error = ("the tool call is not well-formed" if self._expect == "bad"
                     else "the tool call is incomplete (the answer ended first)")
            return [CallStreamPiece(index=self._index, id=new_call_id(), args=self.text, error=error)]
        return []

    def _calls(self) -> list[CallStreamPiece]:
        pieces: list[CallStreamPiece] = []
        while self._expect not in ("done", "bad"):
            rest = self.text[self._pos :]
            start = len(rest) - len(rest.lstrip())
            rest = rest[start:]
            if not rest:
                break
            if self._expect == "item":
                if rest[0] == "]" and self._index == 0:  # an empty list: no calls
                    self._pos, self._expect = self._pos + start + 1, "close"
                    continue
                try:
                    item, end = self._decoder.raw_decode(self.text, self._pos + start)
                except json.JSONDecodeError:
                    break  # not complete yet (or never: ``flush`` says so)
                if not (isinstance(item, dict) and set(item) == {"name", "arguments"} and isinstance(item["name"], str)
                        and isinstance(item["arguments"], dict)):
                    self._expect = "bad"
                    break
                args = json.dumps(item["arguments"], ensure_ascii=False)
                pieces.append(CallStreamPiece(index=self._index, name=item["name"], id=new_call_id(), args=args,
                                              arguments=item["arguments"]))
                self._index += 1
                self._pos, self._expect = end, "sep"
                continue
            if self._expect == "close":
                if rest.startswith(CALL_CLOSE) and not rest[len(CALL_CLOSE) :].strip():
                    self._expect = "done"
                elif not CALL_CLOSE.startswith(rest):
                    self._expect = "bad"
                break
            wanted = {"[": ("[",), "sep": (",", "]")}[self._expect]
            if rest[0] not in wanted:
                self._expect = "bad"
                break
            self._pos += start + 1
            self._expect = "item" if rest[0] in "[," else "close"
        return pieces
