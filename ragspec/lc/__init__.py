"""LangChain integration: ``RagSpecLLM`` (text completion) and ``ChatRagSpec`` (chat model).

Both load their model lazily on the first call and share it with every other instance that has
the same ``(model, device, dtype)``. See ``ragspec.lc.base`` for the per-call options
(``references=``, overrides) they accept.
"""

from __future__ import annotations

from ragspec.lc.base import CALL_OPTIONS, Reference
from ragspec.lc.chat import ChatRagSpec
from ragspec.lc.llm import RagSpecLLM

__all__ = ["CALL_OPTIONS", "ChatRagSpec", "RagSpecLLM", "Reference"]
