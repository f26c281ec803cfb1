"""LangChain messages to the model's chat template."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage
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


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[BaseMessage], model_name: str) -> list[int]:
    """Token ids of the conversation through the model's chat template, ready for the answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"model {model_name!r} has no chat template: use RagSpecLLM with a plain prompt, "
            "or a model whose tokenizer defines one"
        )
    text = tokenizer.apply_chat_template(to_chat(messages), tokenize=False, add_generation_prompt=True)
    # The template already writes any BOS/special tokens as text; don't add them twice.
    return list(tokenizer.encode(text, add_special_tokens=False))
