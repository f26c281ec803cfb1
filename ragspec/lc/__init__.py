"""LangChain integration: ``RagSpecLLM`` (text completion) and ``ChatRagSpec`` (chat model).

Both load their model lazily on the first call and share it with every other instance that has
the same ``(model, device, dtype)``. See ``ragspec.lc.base`` for the per-call options
(``references=``, overrides) they accept, and ``ragspec.lc.chains.answer_from_context`` for
handing retrieved documents to them as references inside an LCEL chain; ``ragspec.lc.agents``
(which needs ``langchain``) has the middleware for ``create_agent`` on the default model.
"""

from __future__ import annotations

from ragspec.lc.base import CALL_OPTIONS, Reference, load_options
from ragspec.lc.chains import answer_from_context
from ragspec.lc.chat import ChatRagSpec
from ragspec.lc.llm import InstructModelWarning, RagSpecLLM

__all__ = [
    "CALL_OPTIONS", "ChatRagSpec", "InstructModelWarning", "RagSpecLLM", "Reference", "answer_from_context", "load_options",
]  # fmt: skip
