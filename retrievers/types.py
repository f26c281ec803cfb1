"""Small shared types: scored results and metadata filters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from langchain_core.documents import Document

__all__ = ["MetadataFilter", "ScoredDocument", "check_filter", "matches_filter"]

#: Keep a document when every key equals the given value (a dict), or when the callable
#: returns True for the document's metadata.
MetadataFilter = Union[Mapping[str, Any], Callable[[Mapping[str, Any]], bool]]


@dataclass(frozen=True)
class ScoredDocument:
    """A retrieved document and its score (higher is better; the scale depends on the retriever)."""

    document: Document
    score: float


def check_filter(filter: MetadataFilter | None) -> None:  # noqa: A002 - LangChain's name for it
    """Raise TypeError early for a filter that is neither a mapping nor a callable."""
    if filter is not None and not isinstance(filter, Mapping) and not callable(filter):
        raise TypeError(
            f"filter must be a dict of metadata values or a callable(metadata) -> bool, got {type(filter).__name__}"
        )


def matches_filter(metadata: Mapping[str, Any], filter: MetadataFilter | None) -> bool:  # noqa: A002
    """Whether `metadata` passes `filter` (None passes everything)."""
    if filter is None:
        return True
    if isinstance(filter, Mapping):
        missing = object()
        return all(metadata.get(key, missing) == value for key, value in filter.items())
    return bool(filter(metadata))
