"""LCEL building blocks: answering from retrieved documents that are also the drafter's references.

A ragspec model drafts from the passages it is given as ``references=``; inside an LCEL chain the
retrieved documents are one step away from the model, so ``answer_from_context`` carries them
there::

    chain = (
        {"context": retriever, "question": RunnablePassthrough()}
        | answer_from_context(ChatRagSpec(max_tokens=128))
        | StrOutputParser()
    )
    chain.invoke("When does the ferry leave?")

Streaming (``stream``/``astream``) streams the model's chunks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda

from ragspec.lc.base import RagSpecParams
from ragspec.prompts import QA_CHAT_PROMPT, format_passages

__all__ = ["answer_from_context"]


def _documents(inputs: object) -> list[Document | str]:
    if not isinstance(inputs, Mapping) or "context" not in inputs or "question" not in inputs:
        got = sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__
        raise ValueError(
            f'answer_from_context takes {{"question": str, "context": [Document, ...]}}, got {got}; '
            'build it with {"context": retriever, "question": RunnablePassthrough()}'
        )
    context = inputs["context"]
    items = [context] if isinstance(context, (str, Document)) else context
    if not isinstance(items, Sequence) or not all(isinstance(d, (str, Document)) for d in items):
        raise ValueError(f"context must be a list of Documents (or strings), got {type(context).__name__}")
    return list(items)


def answer_from_context(llm: RagSpecParams, prompt: BasePromptTemplate = QA_CHAT_PROMPT) -> Runnable[dict[str, Any], Any]:
    """A runnable taking ``{"question": str, "context": [Document, ...]}`` and returning ``llm``'s output.

    The prompt is filled with ``context`` as numbered passages (``ragspec.prompts.format_passages``:
    ``[1] title`` then the text) and the other keys as they are; default: the pipeline's own
    ``QA_CHAT_PROMPT`` (variables ``context`` and ``question``). The documents go to ``llm`` as
    ``references=``, one reference each, so the drafter copies from them. ``llm`` is a
    ``ChatRagSpec`` or ``RagSpecLLM``.
    """
    if not isinstance(llm, RagSpecParams):
        raise ValueError(
            f"answer_from_context needs a ragspec ChatRagSpec or RagSpecLLM (they take references=), "
            f"got {type(llm).__name__}"
        )
    model: Runnable[Any, Any] = llm  # type: ignore[assignment]

    def with_references(inputs: Mapping[str, Any]) -> Runnable[Any, Any]:
        documents = _documents(inputs)
        filled = {**inputs, "context": format_passages(documents)}
        return RunnableLambda(lambda _: filled, name="format_passages") | prompt | model.bind(references=documents)

    return RunnableLambda(with_references, name="answer_from_context")
