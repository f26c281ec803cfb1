"""A process-wide cache of loaded models and their speculative generators.

Loading a model takes seconds and hundreds of MiB, so every LangChain object with the same
``(model, device, dtype, backend)`` shares one loaded model (``"auto"`` is resolved first, so it
shares with the back end it picks); generators over it are keyed by
``max_draft`` as well (their drafting policy depends on it). A generator serializes its own
calls, so sharing one between instances is safe from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragspec.backends import check_backend
from ragspec.engine.config import CallOptions, GenerationConfig, call_options

if TYPE_CHECKING:
    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.backends import TargetModel

_lock = threading.Lock()
_models: dict[tuple[str, str, str, str], TargetModel] = {}
_generators: dict[tuple[str, str, str, str, int], SpeculativeGenerator] = {}


def get_generator(
    model: str, device: str = "auto", dtype: str = "auto", max_draft: int = 16, backend: str = "auto"
) -> SpeculativeGenerator:
    """The shared generator for these settings, loading the model on first use."""
    from ragspec.backends import choose_backend
    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.backends import load_model
    from ragspec.prompts import qa_prefix_ids

    key = (model, device, dtype, choose_backend(model, backend, device, dtype))
    generator = _generators.get((*key, max_draft))
    if generator is not None:  # the common case: no lock, so a long first load elsewhere never blocks it
        return generator
    with _lock:  # loading is rare; holding the lock keeps two threads from loading one model twice
        generator = _generators.get((*key, max_draft))
        if generator is None:
            lm = _models.get(key)
            if lm is None:
                lm = _models[key] = load_model(model, device=device, dtype=dtype, backend=key[3])
            # The QA prompt's fixed part holds no user's words: every cache scope reuses it.
            generator = SpeculativeGenerator(lm, max_draft=max_draft, public_prefix=qa_prefix_ids(lm.tokenizer))
            _generators[(*key, max_draft)] = generator
        return generator


def clear() -> None:
    """Forget every cached model and generator (their memory is freed once no object uses them)."""
    with _lock:
        _models.clear()
        _generators.clear()


@dataclass(frozen=True)
class LocalModel:
    """A model by name, loaded on first use and shared through this registry, with the defaults of its calls.

    ``DocumentQA`` takes one of these, or a ``ChatRagSpec`` / ``RagSpecLLM`` (which behave alike).
    """

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    max_draft: int = 16
    backend: str = "auto"
    """``"auto"``, ``"torch"`` or ``"llamacpp"`` (see ``ragspec.backends.choose_backend``)."""
    config: GenerationConfig = field(default_factory=GenerationConfig)

    def __post_init__(self) -> None:
        check_backend(self.backend)

    def load(self, model: str | None = None) -> SpeculativeGenerator:
        return get_generator(model or self.model, self.device, self.dtype, self.max_draft, self.backend)

    def call_options(self, stop: Sequence[str] | None = None, options: Mapping[str, Any] | None = None) -> CallOptions:
        """This model's defaults with ``options`` (generation options, ``model=``) merged in; ``stop`` is added."""
        return call_options(self.model, self.config, stop, options)
