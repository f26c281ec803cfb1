"""LangChain messages as conversation turns (the model's prompt is then built by ``ragspec.chat_request``)."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage

from ragspec.engine import tool_calls

_ROLES = {
    "system": "system", "human": "user", "ai": "assistant",
    # a streamed message (the sum of its chunks) passed back as history
    "SystemMessageChunk": "system", "HumanMessageChunk": "user", "AIMessageChunk": "assistant",
}  # fmt: skip
_SUPPORTED = (
    "SystemMessage, HumanMessage, AIMessage (text and tool calls), ToolMessage and ChatMessage with role "
    "'system', 'user' or 'assistant'"
)
_CALL_BLOCKS = ("tool_use", "tool_call", "function_call")
"""Content blocks that repeat an AIMessage's ``tool_calls`` (e.g. Anthropic's ``tool_use``)."""


def message_text(message: BaseMessage, skip: Sequence[str] = ()) -> str:
    """The text of a message whose content is a string or a list of text blocks (blocks of the
    types in ``skip`` are left out)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block, dict) and block.get("type") in skip:
            continue
        else:
            kind = block.get("type", "untyped") if isinstance(block, dict) else type(block).__name__
            raise ValueError(
                f"{type(message).__name__} has a content block of type {kind!r}: ragspec models take text only "
                "(a string, or blocks of type 'text'); describe images/files in words or drop them"
            )
    return "".join(parts)


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """Role/content dicts for ``apply_chat_template``; a clear error for anything else.

    Tool calls and results follow ``ragspec.engine.tool_calls``' convention: an AIMessage's calls are
    written as the model writes them and a ToolMessage is a user turn with the result (the bound
    tools' listing is added by ``ragspec.chat_request.chat_turns``).
    """
    chat: list[dict[str, str]] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            chat.append(tool_calls.result_turn(message_text(message)))
            continue
        if isinstance(message, AIMessage) and message.tool_calls:
            text = message_text(message, skip=_CALL_BLOCKS).strip()
            chat.append(tool_calls.call_turn(text, [(c["name"], c["args"]) for c in message.tool_calls]))
            continue
        if isinstance(message, ChatMessage):
            role = message.role if message.role in ("system", "user", "assistant") else None
        else:
            role = _ROLES.get(message.type)
        if role is None:
            raise ValueError(
                f"ChatRagSpec cannot take a {type(message).__name__} (type {message.type!r}): "
                f"it supports {_SUPPORTED} (or their chunks)"
            )
        if isinstance(message, AIMessage) and message.invalid_tool_calls:
            raise ValueError(
                "ChatRagSpec cannot take an AIMessage with invalid tool calls (they could not be parsed): "
                "drop that turn or replace it with a text answer"
            )
        chat.append({"role": role, "content": message_text(message)})
    if not chat:
        raise ValueError("ChatRagSpec needs at least one message")
    return chat

