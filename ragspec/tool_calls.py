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
``"none"`` (text only; an answer may not start with ``<tool_call>``), or a tool's name (a call
of that tool).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragspec.constraints import JSON_OPTIONS, Constraint, ConstraintError

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


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name, its arguments and an id to match its result to."""

    name: str
    args: dict[str, Any]
    id: str


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties and
    does not say otherwise: a call's arguments (or a structured answer) hold the declared fields only."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: closed_objects(v) if k not in ("enum", "const", "default", "examples") else v for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and "patternProperties" not in schema:
        out["additionalProperties"] = False
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


def tool_call_constraint(tools: Sequence[Tool], choice: str | None = "auto", parallel: bool = True) -> Constraint:
    """The grammar of an answer under ``choice`` (see the module docstring); ``parallel=False``
    allows one call per answer instead of a list of them."""
    choice = check_choice(tools, choice)
    chosen = [t for t in tools if choice in ("auto", "any") or t.name == choice]
    text = "TEXT: /(.|\\n)*/ & ~/" + _regex_literal(CALL_OPEN) + "(.|\\n)*/"
    if choice == "none" or not chosen:
        return _lark("start: TEXT\n" + text, "none")
    schema = {
        "x-guidance": JSON_OPTIONS,
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": closed_objects(dict(t.parameters))},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in chosen
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


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in "\\/.^$|?*+()[]{}" else c for c in text)


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


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_calls(text: str) -> list[ToolCall] | None:
    """The calls in an answer, or ``None`` when it is a text answer. Raises ``ValueError`` for a
    call cut short (e.g. by the token budget)."""
    if not text.startswith(CALL_OPEN):
        return None
    body = text[len(CALL_OPEN) :]
    if not body.endswith(CALL_CLOSE):
        raise ValueError(f"the tool call is incomplete (the answer ended first): {text!r}")
    items = json.loads(body[: -len(CALL_CLOSE)])
    return [ToolCall(item["name"], item["arguments"], new_call_id()) for item in items]


@dataclass
class CallStreamPiece:
    """What one streamed delta adds: text, or a piece of the ``index``-th call."""

    text: str = ""
    index: int | None = None
    name: str | None = None
    id: str | None = None
    args: str = ""


class CallStream:
    """Turns an answer's text deltas into text pieces and tool-call pieces as they arrive.

    While the answer could still be the start of ``<tool_call>`` nothing is released. In a call,
    each item ``{"name": "...", "arguments": {...}}`` gives a piece with its name and a new id once
    the name is complete, then pieces of the arguments' JSON text as it grows.
    """

    def __init__(self) -> None:
        self.text = ""
        self._mode = "undecided"  # "text" | "calls"
        self._pos = 0  # in calls: how far ``text`` was consumed
        self._index = -1
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._in_args = False

    def add(self, delta: str) -> list[CallStreamPiece]:
        self.text += delta
        if self._mode == "undecided":
            if self.text.startswith(CALL_OPEN):
                self._mode, self._pos = "calls", len(CALL_OPEN) + 1  # past "["
            elif CALL_OPEN.startswith(self.text):
                return []
            else:
                self._mode = "text"
                return [CallStreamPiece(text=self.text)]
        if self._mode == "text":
            return [CallStreamPiece(text=delta)] if delta else []
        return self._calls()

    def flush(self) -> list[CallStreamPiece]:
        """At the end of the answer: text still held back (it only looked like the start of a call)."""
        if self._mode == "undecided" and self.text:
            self._mode = "text"
            return [CallStreamPiece(text=self.text)]
        return []

    def _calls(self) -> list[CallStreamPiece]:
        pieces: list[CallStreamPiece] = []
        while self._pos < len(self.text):
            if not self._in_args:
                prefix = '{"name": "'
                rest = self.text[self._pos :]
                start = rest.find(prefix)
                marker = rest.find('", "arguments": ', start + len(prefix)) if start >= 0 else -1
                if marker < 0:
                    break
                self._index += 1
                name = json.loads('"' + rest[start + len(prefix) : marker] + '"')
                pieces.append(CallStreamPiece(index=self._index, name=name, id=new_call_id()))
                self._pos += marker + len('", "arguments": ')
                self._in_args, self._depth = True, 0
                continue
            start, end = self._pos, self._scan()
            if end > start:
                pieces.append(CallStreamPiece(index=self._index, args=self.text[start:end]))
            if self._in_args:
                break
        return pieces

    def _scan(self) -> int:
        """Advance over the arguments' JSON; stop at its end (then leave the arguments) or the text's."""
        while self._pos < len(self.text):
            c = self.text[self._pos]
            self._pos += 1
            if self._in_string:
                self._escape, self._in_string = (False, True) if self._escape else (c == "\\", c != '"')
                continue
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._in_args = False
                    return self._pos
        return self._pos
