"""ragspec: retrieval-augmented generation sped up by lossless speculative decoding.

Importing ``ragspec`` is cheap: the LangChain classes and the pipeline (which need torch and
transformers) are imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retrievers.lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "RagSpecLLM": "ragspec.lc",
    "ChatRagSpec": "ragspec.lc",
    "SpeculativeGenerator": "ragspec.engine.generator",
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
    "MissingExtraError": "retrievers.extras",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from ragspec.answers import Answer, AnswerStream, Citation
    from ragspec.backends import load_model
    from ragspec.conversation import Conversation
    from ragspec.engine.config import GenerationConfig
    from ragspec.engine.constraints import Constraint
    from ragspec.engine.generator import SpeculativeGenerator
    from ragspec.engine.results import GenerationResult
    from ragspec.lc import ChatRagSpec, RagSpecLLM
    from ragspec.pipeline import DocumentQA
    from ragspec.prompts import Turn
    from ragspec.remote import RemoteGenerator
    from retrievers.extras import MissingExtraError


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
