"""Prompts for answering questions from numbered passages.

The passages are numbered ``[1]``, ``[2]``, ... in retrieval order; the model is asked to answer
from them only and to cite them by number. ``QA_CHAT_PROMPT`` is the same prompt as a LangChain
``ChatPromptTemplate`` (variables ``context`` and ``question``) for LCEL chains.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate

QA_SYSTEM_PROMPT = (
    "You answer questions using only the numbered passages the user gives you. "
    "Answer in one or two sentences, reusing the passages' own words, and cite the passages you used "
    "by number in square brackets, like [1]. If the passages do not contain the answer, say that you "
    "do not know."
)

QA_USER_TEMPLATE = "Passages:\n\n{context}\n\nQuestion: {question}"

QA_CHAT_PROMPT = ChatPromptTemplate.from_messages([("system", QA_SYSTEM_PROMPT), ("human", QA_USER_TEMPLATE)])


def passage_label(document: Document) -> str:
    """A short name for a passage: its title, else its source file name, else nothing."""
    meta = document.metadata
    title = meta.get("title")
    if title:
        return str(title)
    source = str(meta.get("source") or "")
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def format_passages(passages: Sequence[Document | str]) -> str:
    """``[1] label\\ntext`` blocks separated by blank lines (``[n]`` is the passage's number)."""
    blocks = []
    for number, passage in enumerate(passages, start=1):
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


def qa_text_prompt(
    question: str, passages: Sequence[Document | str], system_prompt: str = QA_SYSTEM_PROMPT
) -> str:
    """The same request as plain text, for models without a chat template."""
    user = QA_USER_TEMPLATE.format(context=format_passages(passages), question=question.strip())
    return f"{system_prompt}\n\n{user}\nAnswer:"
