"""Small shared types: scored results and metadata filters."""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from retrievers.errors import FilterError

__all__ = [
    "COMBINATIONS", "COMPARISONS", "MAX_FILTER_DEPTH", "MetadataFilter", "ScoredDocument", "ScoredRetriever", "check_filter", "matches_filter",
]  # fmt: skip

#: A dict of conditions on metadata (see `matches_filter`), or a callable(metadata) -> bool.
MetadataFilter = Union[Mapping[str, Any], Callable[[Mapping[str, Any]], bool]]

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin")
"""The operators a field's condition may use, as in Chroma's and PGVector's filters."""
COMBINATIONS = ("$and", "$or")
"""The operators that combine filters."""
MAX_FILTER_DEPTH = 32
"""Most levels of ``$and``/``$or`` one inside another; deeper is a ``FilterError`` (matching recurses per level)."""


@dataclass(frozen=True)
class ScoredDocument:
    """A retrieved document and its score (higher is better; the scale depends on the retriever)."""

    document: Document
    score: float


class ScoredRetriever(BaseRetriever):
    """A LangChain retriever whose ``search(query, k, filter)`` gives ``ScoredDocument``s, best first;
    LangChain's ``invoke`` returns their documents."""

    def search(self, query: str, k: int | None = None, filter: MetadataFilter | None = None) -> list[ScoredDocument]:  # noqa: A002
        raise NotImplementedError

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: MetadataFilter | None = None,  # noqa: A002
    ) -> list[Document]:
        return [hit.document for hit in self.search(query, k=k, filter=filter)]


def check_filter(filter: MetadataFilter | None) -> None:  # noqa: A002 - LangChain's name for it
    """Raise early for a filter that cannot be applied: TypeError for one that is neither a mapping
    nor a callable, `FilterError` for an unknown operator, a malformed condition or combinations nested
    deeper than `MAX_FILTER_DEPTH`."""
    if filter is not None and not isinstance(filter, Mapping) and not callable(filter):
        raise TypeError(
            f"filter must be a dict of metadata conditions or a callable(metadata) -> bool, got {type(filter).__name__}"
        )
    if isinstance(filter, Mapping):
        _check_conditions(filter)


def _check_conditions(filter: Mapping[str, Any], depth: int = 1) -> None:  # noqa: A002
    for key, value in filter.items():
        if key in COMBINATIONS:
            if not isinstance(value, list) or not value or not all(isinstance(f, Mapping) for f in value):
                raise FilterError(f"{key} takes a non-empty list of filters, got {_brief(value)}")
            if depth > MAX_FILTER_DEPTH:
                raise FilterError(f"{' and '.join(COMBINATIONS)} are nested more than {MAX_FILTER_DEPTH} levels deep: flatten the filter")
            for part in value:
                _check_conditions(part, depth + 1)
        elif isinstance(key, str) and key.startswith("$"):
            raise FilterError(f"unsupported filter operator {key!r}: combine filters with {' or '.join(COMBINATIONS)}")
        elif isinstance(value, Mapping):
            if not value:
                raise FilterError(f"the condition on {key!r} is empty: give an operator such as {{'$eq': ...}}")
            for op, operand in value.items():
                if op not in COMPARISONS:
                    raise FilterError(
                        f"unsupported filter operator {op!r} on {key!r}: use one of {', '.join(COMPARISONS)} "
                        "(or a callable filter for anything else)"
                    )
                if op in ("$in", "$nin") and not isinstance(operand, (list, tuple)):
                    raise FilterError(f"{op} on {key!r} takes a list of values, got {_brief(operand)}")
                if op in ("$gt", "$gte", "$lt", "$lte") and not _orderable(operand):
                    raise FilterError(f"{op} on {key!r} takes a number or a string, got {_brief(operand)}")


def _brief(value: object) -> str:
    """``value``'s repr, cut short in length and depth (a filter may be nested far too deep to print whole)."""
    return reprlib.repr(value)


def _orderable(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))


_MISSING = object()


def _compare(op: str, value: Any, operand: Any) -> bool:
    """One comparison; a missing field matches none, and an order between a number and a string is false."""
    if value is _MISSING:
        return False
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if op == "$in":
        return value in operand
    if op == "$nin":
        return value not in operand
    if not (_orderable(value) and isinstance(value, str) == isinstance(operand, str)):
        return False
    return {"$gt": value > operand, "$gte": value >= operand, "$lt": value < operand, "$lte": value <= operand}[op]


def _matches(metadata: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:  # noqa: A002
    for key, condition in filter.items():
        if key == "$and":
            ok = all(_matches(metadata, part) for part in condition)
        elif key == "$or":
            ok = any(_matches(metadata, part) for part in condition)
        elif isinstance(condition, Mapping):
            value = metadata.get(key, _MISSING)
            ok = all(_compare(op, value, operand) for op, operand in condition.items())
        else:
            ok = _compare("$eq", metadata.get(key, _MISSING), condition)
        if not ok:
            return False
    return True


def matches_filter(metadata: Mapping[str, Any], filter: MetadataFilter | None) -> bool:  # noqa: A002
    """Whether `metadata` passes `filter` (None passes everything; check it first with `check_filter`).

    A dict filter holds every one of its entries: ``{"field": value}`` (equality), ``{"field":
    {"$op": operand}}`` with the operators of `COMPARISONS` (all of them, when several are given),
    ``{"$and": [filters]}`` and ``{"$or": [filters]}``, as Chroma's and PGVector's filters do. A
    document without the field matches no condition on it (``$ne`` and ``$nin`` included); ``$gt``,
    ``$gte``, ``$lt`` and ``$lte`` compare numbers with numbers and strings with strings, never one
    with the other. A callable gets the metadata and returns whether to keep the document.
    """
    if filter is None:
        return True
    if isinstance(filter, Mapping):
        return _matches(metadata, filter)
    return bool(filter(metadata))
