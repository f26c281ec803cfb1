"""LangChain messages as the model's prompt (through ``ragspec.prompts.chat_prompt_ids``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage

from ragspec.prompts import chat_prompt_ids

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

_ROLES = {"system": "system", "human": "user", "ai": "assistant"}
_SUPPORTED = (
    "SystemMessage, HumanMessage, AIMessage (text only, no tool calls) and ChatMessage with role "
    "'system', 'user' or 'assistant'"
)


def message_text(message: BaseMessage) -> str:
    """The text of a message whose content is a string or a list of text blocks."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        else:
            kind = block.get("type", "untyped") if isinstance(block, dict) else type(block).__name__
            raise ValueError(
                f"{type(message).__name__} has a content block of type {kind!r}: ragspec models take text only "
                "(a string, or blocks of type 'text'); describe images/files in words or drop them"
            )
    return "".join(parts)


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """Role/content dicts for ``apply_chat_template``; a clear error for anything else."""
    chat: list[dict[str, str]] = []
    for message in messages:
        if isinstance(message, ChatMessage):
            role = message.role if message.role in ("system", "user", "assistant") else None
        else:
            role = _ROLES.get(message.type)
        if role is None:
            raise ValueError(
                f"ChatRagSpec cannot take a {type(message).__name__} (type {message.type!r}): "
                f"it supports {_SUPPORTED}; tool calling is not available for local ragspec models"
            )
        if isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls):
            raise ValueError(
                "ChatRagSpec cannot take an AIMessage with tool calls: tool calling is not available for "
                "local ragspec models; keep only the text turns of the conversation"
            )
        chat.append({"role": role, "content": message_text(message)})
    if not chat:
        raise ValueError("ChatRagSpec needs at least one message")
    return chat


def messages_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[BaseMessage]) -> list[int]:
    """Token ids of the conversation, ready for the answer (``ragspec.prompts.chat_prompt_ids``:
    the chat template, or a plain transcript and a warning for a model without one)."""
    return chat_prompt_ids(tokenizer, to_chat(messages))
