"""One chat request, built the same way for every entry point: ``ChatRagSpec`` (``ragspec.lc``) and the
OpenAI-compatible ``/v1`` routes (``apps.web.openai_api``).

A conversation (``{"role", "content"}`` turns, tool calls and results already written in
``ragspec.engine.tool_calls``' form) becomes a ``ChatRequest``: the prompt's token ids (the chat
template over the turns, with the tools' listing or the JSON instruction in the system turn), one
``GenerationConfig`` (with the grammar: the tool-call format or a response format) and the passages
the drafter copies from. Each entry point parses its own input (LangChain messages, OpenAI JSON) into
turns, a ``ToolUse`` and options; what the model then sees is decided here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragspec.engine import tool_calls
from ragspec.engine.config import GenerationConfig
from ragspec.prompts import chat_prompt_ids

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from ragspec.engine.constraints import Constraint
    from ragspec.engine.results import GenerationStream, TextGenerator

JSON_INSTRUCTION = "Answer with one JSON object."
"""Added to the system turn in JSON mode when no turn mentions JSON (OpenAI asks the client to say so;
ragspec does it for a client that did not)."""


@dataclass(frozen=True)
class ToolUse:
    """The tools a request lets the model call, and how (``tool_calls.parse_choice``' spelling)."""

    tools: tuple[tool_calls.Tool, ...]
    choice: str = "auto"
    """``"auto"``, ``"any"``, ``"none"`` or a tool's name."""
    parallel: bool = True
    """Several calls in one answer."""

    @property
    def calls(self) -> bool:
        """The model may call a tool now (tools are sent and ``choice`` is not ``"none"``)."""
        return bool(self.tools) and self.choice != "none"

    def listing(self) -> str:
        """The instruction that lists the tools, for the system turn."""
        return tool_calls.system_prompt(self.tools, self.choice)

    def constraint(self, schema: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> Constraint:
        """The grammar of well-formed calls; ``schema`` rewrites each tool's argument schema first
        (``/v1`` bounds a client's strings, ``apps.web.openai_api.jobs.served_schema``)."""
        tools = self.tools if schema is None else [tool_calls.Tool(t.name, t.description, schema(t.parameters)) for t in self.tools]
        return tool_calls.tool_call_constraint(tools, self.choice, self.parallel)


def chat_turns(turns: Sequence[Mapping[str, str]], tools: ToolUse | None = None, json_mode: bool = False) -> list[dict[str, str]]:
    """The conversation as the model gets it: with ``tools``, their listing in the system turn; in
    ``json_mode`` (and unless a turn mentions JSON), ``JSON_INSTRUCTION`` there."""
    out = [dict(turn) for turn in turns]
    if tools is not None:
        out = tool_calls.with_system_text(out, tools.listing())
    if json_mode and not any("json" in turn["content"].lower() for turn in out):
        out = tool_calls.with_system_text(out, JSON_INSTRUCTION)
    return out


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase, turns: Sequence[Mapping[str, str]], tools: ToolUse | None = None, json_mode: bool = False
) -> list[int]:
    """Token ids of ``chat_turns(turns, tools, json_mode)`` ready for the answer (``ragspec.prompts.chat_prompt_ids``)."""
    return chat_prompt_ids(tokenizer, chat_turns(turns, tools, json_mode))


@dataclass(frozen=True)
class ChatRequest:
    """One generation as the generator takes it."""

    prompt: list[int] | str
    """Token ids as the model takes them (a chat's: ``chat_prompt``), or a completion's text, which the
    generator encodes."""
    config: GenerationConfig
    """How to decode, the grammar (``constraint``) included."""
    references: tuple[str | list[int], ...] = ()
    """Passages the drafter copies from (none: the prompt is drafted from)."""

    def constrained(self, constraint: Constraint | None) -> ChatRequest:
        """This request with ``constraint`` as its grammar (None: unchanged)."""
        if constraint is None:
            return self
        return dataclasses.replace(self, config=self.config.merged(constraint=constraint))

    def stream(self, generator: TextGenerator) -> GenerationStream:
        """``generator.stream`` of this request: a context manager yielding text deltas, then ``result``."""
        return generator.stream(self.prompt, self.config, references=self.references)


__all__ = ["JSON_INSTRUCTION", "ChatRequest", "ToolUse", "chat_prompt", "chat_turns"]
