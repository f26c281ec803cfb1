"""ragspec: retrieval-augmented generation sped up by lossless speculative decoding.

Importing ``ragspec`` is cheap: the LangChain classes and the pipeline (which need torch and
transformers) are imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "RagSpecLLM": "ragspec.lc",
    "ChatRagSpec": "ragspec.lc",
    "SpeculativeGenerator": "ragspec.decoding.generator",
    "GenerationResult": "ragspec.engine.results",
    "GenerationConfig": "ragspec.engine.config",
    "Constraint": "ragspec.engine.constraints",
    "RemoteGenerator": "ragspec.remote",
    "load_model": "ragspec.backends",
    "DocumentQA": "ragspec.pipeline",
    "Answer": "ragspec.answers",
    "Citation": "ragspec.answers",
    "AnswerStream": "ragspec.answers",
    "Conversation": "ragspec.conversation",
    "Turn": "ragspec.prompts",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from ragspec.answers import Answer, AnswerStream, Citation
    from ragspec.backends import load_model
    from ragspec.conversation import Conversation
    from ragspec.engine.config import GenerationConfig
    from ragspec.engine.constraints import Constraint
    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.engine.results import GenerationResult
    from ragspec.lc import ChatRagSpec, RagSpecLLM
    from ragspec.pipeline import DocumentQA
    from ragspec.prompts import Turn
    from ragspec.remote import RemoteGenerator


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ragspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
