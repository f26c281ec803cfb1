"""A process-wide cache of loaded models and their speculative generators.

Loading a model takes seconds and hundreds of MiB, so every LangChain object with the same
``(model, device, dtype)`` shares one ``LoadedModel``; generators over it are keyed by
``max_draft`` as well (their drafting policy depends on it). A generator serializes its own
calls, so sharing one between instances is safe from any thread.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragspec.generator import SpeculativeGenerator
    from ragspec.models import LoadedModel

_lock = threading.Lock()
_models: dict[tuple[str, str, str], LoadedModel] = {}
_generators: dict[tuple[str, str, str, int], SpeculativeGenerator] = {}


def get_generator(model: str, device: str = "auto", dtype: str = "auto", max_draft: int = 16) -> SpeculativeGenerator:
    """The shared generator for these settings, loading the model on first use."""
    from ragspec.generator import SpeculativeGenerator
    from ragspec.models import load_model

    key = (model, device, dtype)
    generator = _generators.get((*key, max_draft))
    if generator is not None:  # the common case: no lock, so a long first load elsewhere never blocks it
        return generator
    with _lock:  # loading is rare; holding the lock keeps two threads from loading one model twice
        generator = _generators.get((*key, max_draft))
        if generator is None:
            lm = _models.get(key)
            if lm is None:
                lm = _models[key] = load_model(model, device=device, dtype=dtype)
            generator = _generators[(*key, max_draft)] = SpeculativeGenerator(lm, max_draft=max_draft)
        return generator


def clear() -> None:
    """Forget every cached model and generator (their memory is freed once no object uses them)."""
    with _lock:
        _models.clear()
        _generators.clear()
