"""Fitting a question's prompt to the model's context window, leaving room for the answer.

Passages that do not fit together with the answer budget are dropped from the lowest rank up; if
the top passage alone is too long it is truncated. Earlier turns of a conversation that do not fit
are dropped, oldest first. Either way a ``ContextBudgetWarning`` says so. The prompt is the one
``ragspec.prompts.conversation_messages`` lays out (``chat_prompt_ids``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from ragspec.conversation import passage_key
from ragspec.prompts import Turn, chat_prompt_ids, conversation_messages

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase


class ContextBudgetWarning(UserWarning):
    """Passages were dropped or truncated to fit the model's context window."""


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, system_prompt: str, question: str, passages: Sequence[Document],
    turns: Sequence[Turn] = (),
) -> list[int]:
    """The prompt's token ids: the earlier ``turns``, then ``question`` with its new ``passages``."""
    return chat_prompt_ids(tokenizer, conversation_messages(turns, question, passages, system_prompt))


def fit_turns(
    tokenizer: PreTrainedTokenizerBase, system_prompt: str, question: str, retrieved: list[Document], turns: list[Turn],
    max_tokens: int, context: int,
) -> tuple[list[Turn], int]:
    """The most recent earlier turns that fit the context budget with the question and its new passages,
    and how many were dropped."""
    budget, dropped = context - max_tokens, 0
    while turns:
        shown = {passage_key(p) for t in turns for p in t.passages}
        new = [p for p in retrieved if passage_key(p) not in shown]
        if len(prompt_ids(tokenizer, system_prompt, question, new, turns)) <= budget:
            break
        turns, dropped = turns[1:], dropped + 1
    if dropped:
        warnings.warn(
            f"the conversation does not fit the context window with room for {max_tokens} answer tokens: "
            f"left out its {dropped} oldest turn(s)",
            ContextBudgetWarning,
            stacklevel=6,
        )
    return turns, dropped


def fit_passages(
    tokenizer: PreTrainedTokenizerBase, system_prompt: str, question: str, passages: list[Document], max_tokens: int,
    context: int, turns: Sequence[Turn] = (),
) -> tuple[list[Document], list[int]]:
    """Drop the lowest-ranked passages, then truncate the top one, until the prompt leaves room for
    ``max_tokens``; returns the passages kept and the prompt's ids."""
    budget = context - max_tokens

    def ids_of(kept: Sequence[Document]) -> list[int]:
        return prompt_ids(tokenizer, system_prompt, question, kept, turns)

    kept = list(passages)
    ids = ids_of(kept)
    while len(ids) > budget and len(kept) > 1:
        kept.pop()
        ids = ids_of(kept)
    truncated = False
    if len(ids) > budget and kept:
        top = kept[0]
        text_ids = tokenizer.encode(top.page_content, add_special_tokens=False)
        keep = len(text_ids) - (len(ids) - budget)
        kept, ids = [], ids_of([])
        while keep > 0:
            short = Document(page_content=tokenizer.decode(text_ids[:keep]), metadata=top.metadata, id=top.id)
            candidate = ids_of([short])
            if len(candidate) <= budget:
                kept, ids, truncated = [short], candidate, True
                break
            keep -= max(1, len(candidate) - budget)
    if len(ids) > budget:
        raise ValueError(
            f"the question alone needs {len(ids)} prompt tokens, but with max_tokens="
            f"{max_tokens} only {budget} fit the model's context: shorten the question or lower max_tokens"
        )
    if len(kept) < len(passages) or truncated:
        dropped = len(passages) - len(kept)
        warnings.warn(
            f"{len(passages)} passages do not fit the context window with room for {max_tokens} answer "
            f"tokens: dropped the {dropped} lowest-ranked" + (" and truncated the top one" if truncated else ""),
            ContextBudgetWarning,
            stacklevel=5,
        )
    return kept, ids


def document_position(passage: Document) -> tuple[str, int, int]:
    """Where a passage sits among the documents: its source, then its page and character offset."""
    meta = passage.metadata
    start, page = meta.get("start_index"), meta.get("page")
    return (str(meta.get("source", "")), page if isinstance(page, int) else -1, start if isinstance(start, int) else -1)
