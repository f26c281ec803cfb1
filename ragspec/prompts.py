"""Prompts: conversations as the model's token ids, and the question-answering prompt.

``chat_prompt_ids`` is the one place a conversation becomes a prompt (the pipeline, the chat
model and the benchmark all use it). With a chat template it is the template's rendering with the
generation prompt; a model without one gets a plain transcript instead (see ``plain_prompt``) and
a ``NoChatTemplateWarning``.

The question-answering prompt numbers the passages ``[1]``, ``[2]``, ... in the order given and
asks the model to answer from them only and to cite them by number. ``QA_CHAT_PROMPT`` is the same
prompt as a LangChain ``ChatPromptTemplate`` (variables ``context`` and ``question``) for LCEL chains.

A conversation (``conversation_messages``) is laid out so that each turn's prompt extends the
previous one token for token, which the prefix cache (``ragspec.engine.prefix_cache``) turns into a
prefill of the new part only: the earlier turns stay as they were asked, each user turn with the
passages first shown with it (numbered on from the turn before), each followed by its answer; the
new question comes last with the passages not shown yet. The first turn is ``qa_messages``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

QA_SYSTEM_PROMPT = (
    "You answer questions using only the numbered passages the user gives you. "
    "Answer in one or two sentences, reusing the passages' own words, and cite the passages you used "
    "by number in square brackets, like [1]. If the passages do not contain the answer, say that you "
    "do not know."
)

QA_USER_TEMPLATE = "Passages:\n\n{context}\n\nQuestion: {question}"

FOLLOW_UP_TEMPLATE = "Question: {question}"
"""A later turn of a conversation that brings no new passage."""

QA_CHAT_PROMPT = ChatPromptTemplate.from_messages([("system", QA_SYSTEM_PROMPT), ("human", QA_USER_TEMPLATE)])


def passage_label(document: Document) -> str:
    """A short name for a passage: its title, else its source file name, else nothing."""
    meta = document.metadata
    title = meta.get("title")
    if title:
        return str(title)
    source = str(meta.get("source") or "")
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def format_passages(passages: Sequence[Document | str], start: int = 1) -> str:
    """``[1] label\\ntext`` blocks separated by blank lines (``[n]`` is the passage's number, from ``start``)."""
    blocks = []
    for number, passage in enumerate(passages, start=start):
        if isinstance(passage, Document):
            label, text = passage_label(passage), passage.page_content
        else:
            label, text = "", passage
        header = f"[{number}] {label}".rstrip()
        blocks.append(f"{header}\n{text.strip()}")
    return "\n\n".join(blocks)


def qa_messages(
    question: str, passages: Sequence[Document | str], system_prompt: str = QA_SYSTEM_PROMPT
) -> list[dict[str, str]]:
    """The chat turns asking ``question`` about ``passages``."""
    user = QA_USER_TEMPLATE.format(context=format_passages(passages), question=question.strip())
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class Turn:
    """An earlier exchange of a conversation: the question, its answer, and the passages first shown with it."""

    question: str
    answer: str
    passages: tuple[Document, ...] = ()


def _user_turn(question: str, passages: Sequence[Document | str], start: int) -> str:
    if not passages:
        return FOLLOW_UP_TEMPLATE.format(question=question.strip())
    return QA_USER_TEMPLATE.format(context=format_passages(passages, start), question=question.strip())


def conversation_messages(
    turns: Sequence[Turn], question: str, passages: Sequence[Document | str], system_prompt: str = QA_SYSTEM_PROMPT
) -> list[dict[str, str]]:
    """The chat turns asking ``question`` after ``turns``, with ``passages`` (those not shown yet) numbered
    after the earlier turns' passages; the earlier turns are rendered as they were asked."""
    messages = [{"role": "system", "content": system_prompt}]
    start = 1
    for turn in turns:
        messages.append({"role": "user", "content": _user_turn(turn.question, turn.passages, start)})
        messages.append({"role": "assistant", "content": turn.answer.strip()})
        start += len(turn.passages)
    messages.append({"role": "user", "content": _user_turn(question, passages, start)})
    return messages


class NoChatTemplateWarning(UserWarning):
    """The model's tokenizer has no chat template; the conversation was sent as a plain transcript."""


_PLAIN_LABELS = {"user": "User", "assistant": "Assistant"}


def plain_prompt(turns: Sequence[Mapping[str, str]]) -> str:
    """A conversation as plain text for a model without a chat template.

    System turns are paragraphs of their own; the others are ``User: ...`` / ``Assistant: ...``
    paragraphs; the text ends with ``Assistant:`` for the model to continue.
    """
    parts = []
    for turn in turns:
        role, content = turn["role"], turn["content"].strip()
        parts.append(content if role == "system" else f"{_PLAIN_LABELS[role]}: {content}")
    return "\n\n".join([*parts, "Assistant:"])


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, turns: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a conversation (``{"role": "system" | "user" | "assistant", "content": str}``
    turns), ready for the model's answer.

    With a chat template: the template's text with the generation prompt, encoded without adding
    special tokens (the template writes its own). Without one: ``plain_prompt(turns)`` encoded with
    the tokenizer's special tokens (a BOS where the model expects one), and a
    ``NoChatTemplateWarning``. Lone surrogates in the text become U+FFFD.
    """
    from ragspec.engine.text import clean_text

    if not turns:
        raise ValueError("a conversation needs at least one turn")
    for turn in turns:
        if turn.get("role") not in ("system", "user", "assistant") or not isinstance(turn.get("content"), str):
            raise ValueError(f"a turn is {{'role': 'system' | 'user' | 'assistant', 'content': str}}, got {turn!r}")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(turns), tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(clean_text(text), add_special_tokens=False))
    warnings.warn(
        "the model's tokenizer has no chat template: sending the conversation as a plain "
        "'User: ... / Assistant:' transcript (an instruction-tuned model with a template answers better)",
        NoChatTemplateWarning,
        stacklevel=2,
    )
    return list(tokenizer.encode(clean_text(plain_prompt(turns))))


def qa_prefix_ids(tokenizer: PreTrainedTokenizerBase, system_prompt: str = QA_SYSTEM_PROMPT) -> list[int]:
    """The ids every question-answering prompt (``qa_prompt_ids``) with ``system_prompt`` starts with: the
    template and the instructions up to the first passage's number. They are the same for every user,
    so the prefix cache computes them once per process and shares them across cache scopes
    (``ragspec.engine.prefix_cache``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoChatTemplateWarning)
        a = qa_prompt_ids(tokenizer, "a", [Document("a", metadata={"source": "a"})], system_prompt)
        b = qa_prompt_ids(tokenizer, "b", ["b"], system_prompt)
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


def qa_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    passages: Sequence[Document | str],
    system_prompt: str = QA_SYSTEM_PROMPT,
) -> list[int]:
    """Token ids of the request to answer ``question`` from ``passages`` (``chat_prompt_ids`` of ``qa_messages``)."""
    return chat_prompt_ids(tokenizer, qa_messages(question, passages, system_prompt))
