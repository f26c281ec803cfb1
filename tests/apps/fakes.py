"""Pipeline results for scripted answerers (an ``Answer`` without running a model), embeddings that count, and
OpenAI function tools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.documents import Document

from ragspec.engine.results import GenerationStats
from ragspec.answers import Answer, Citation


def counting_embeddings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``retrievers.default_embeddings`` made deterministic fake embeddings; the list collects every text embedded."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    import retrievers

    embedded: list[str] = []

    class Counting(DeterministicFakeEmbedding):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            embedded.extend(texts)
            return super().embed_documents(texts)

    monkeypatch.setattr(retrievers, "default_embeddings", lambda: Counting(size=8))
    return embedded


def speed() -> GenerationStats:
    """3 tokens in 0.3 s, the first after 0.1 s: 10 tokens/s after it, 2 forwards (1.5 tokens each), 1 of 2 drafted accepted."""
    return GenerationStats(
        prompt_tokens=20, new_tokens=3, forward_passes=2, drafted_tokens=2, accepted_tokens=1, ttft_s=0.1, wall_s=0.3
    )


def fake_answer(text: str, sources: Sequence[tuple[str, str, str]] = (), *, question: str = "q") -> Answer:
    """An answer citing one passage per ``(source, title, passage text)``, as ``[1]``, ``[2]``, ...;
    with no sources it is unsupported."""
    passages = [Document(page_content=body, metadata={"source": src, "title": title, "start_index": 0}) for src, title, body in sources]
    citations = [Citation(i, src, 0, None, title, body, None) for i, (src, title, body) in enumerate(sources, start=1)]
    return Answer(question, text, citations, passages, "cited" if citations else "unsupported", "eos", speed())


@dataclass
class GeneratorSource:
    """A ``/v1`` generation source over an already built generator (e.g. a tiny random model)."""

    generator: Any
    model: str = "tiny"

    def load(self, model: str | None = None) -> Any:
        return self.generator


def function_tool(name: str, description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``tools`` entry: the function ``name`` whose parameters are ``properties``, all required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
