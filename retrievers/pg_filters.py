"""Metadata filters (`retrievers.types`) as SQL over a ``jsonb`` column, with every key and value a bound parameter.

`filter_sql(filter, column)` returns a `psycopg.sql.Composable` condition that holds for exactly the
rows whose metadata `retrievers.types.matches_filter` keeps. The SQL text depends only on the
filter's *shape* (which operators, nested how); keys and operands reach the server as parameters
(``metadata -> %s``), so no key or value can change the query. The column name is an
`sql.Identifier`. Python's comparison rules are kept:

- ``$eq``/``$ne``/``$in``/``$nin``: JSON equality (``1`` equals ``1.0``), plus Python's ``True == 1``
  and ``False == 0`` at the top level of a value; a missing field matches no condition on it.
- ``$gt``/``$gte``/``$lt``/``$lte``: numbers with numbers (``numeric``), strings with strings by code
  point (``COLLATE "C"``), never one with the other, never booleans (a ``CASE`` checks the type first:
  SQL's ``AND`` does not promise to evaluate its left side first).
- A key that is not a string matches nothing (stored metadata keys are strings).

Callable filters cannot run in the database: they raise `FilterError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


from retrievers.errors import FilterError
from retrievers.types import MetadataFilter, check_filter
from retrievers.extras import needs

with needs("postgres", "the PostgreSQL store"):
    from psycopg import sql
    from psycopg.types.json import Jsonb

__all__ = ["filter_sql", "jsonb_value"]

_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def filter_sql(filter: MetadataFilter | None, column: str = "metadata") -> tuple[sql.Composable, dict[str, Any]]:  # noqa: A002
    """A SQL condition on the jsonb `column` equivalent to `matches_filter(metadata, filter)` (``TRUE`` for
    None), and its parameters: named placeholders ``%(f0)s``, ``%(f1)s``... and their values.

    Raises:
        FilterError: a malformed filter (as `check_filter`), a callable, or an operand that is not JSON.
        TypeError: a filter that is neither a mapping nor a callable.
    """
    check_filter(filter)
    params: dict[str, Any] = {}
    if filter is None:
        return sql.SQL("TRUE"), params
    if not isinstance(filter, Mapping):
        raise FilterError(
            "a callable filter cannot run inside PostgreSQL; give a dict of conditions "
            "({'field': value}, {'field': {'$gte': 2}}, {'$or': [...]})"
        )
    return _Translation(sql.Identifier(column), params).conditions(filter), params


class _Translation:
    """Builds the condition, binding each key and operand under a fresh parameter name."""

    def __init__(self, column: sql.Identifier, params: dict[str, Any]) -> None:
        self.column = column
        self.params = params

    def bind(self, value: Any) -> sql.Placeholder:
        name = f"f{len(self.params)}"
        self.params[name] = value
        return sql.Placeholder(name)

    def conditions(self, filter: Mapping[str, Any]) -> sql.Composable:  # noqa: A002
        parts: list[sql.Composable] = []
        for key, condition in filter.items():
            if key in ("$and", "$or"):
                joiner = sql.SQL(" AND " if key == "$and" else " OR ")
                parts.append(sql.SQL("({})").format(joiner.join(self.conditions(part) for part in condition)))
            elif not isinstance(key, str):
                parts.append(sql.SQL("FALSE"))
            elif isinstance(condition, Mapping):
                parts.extend(self.comparison(op, key, operand) for op, operand in condition.items())
            else:
                parts.append(self.comparison("$eq", key, condition))
        return sql.SQL("({})").format(sql.SQL(" AND ").join(parts)) if parts else sql.SQL("TRUE")

    def comparison(self, op: str, key: str, operand: Any) -> sql.Composable:
        column = self.column
        name = self.bind(key)
        if op in ("$eq", "$ne", "$in", "$nin"):
            values = [operand] if op in ("$eq", "$ne") else list(operand)
            choices = [jsonb_value(v, where=f"{op} on {key!r}") for value in values for v in _equals(value)]
            member = sql.SQL("({c} -> {k} = ANY({v}::jsonb[]))").format(c=column, k=name, v=self.bind(choices))
            negate = sql.SQL("NOT ") if op in ("$ne", "$nin") else sql.SQL("")
            return sql.SQL("({c} ? {k} AND {n}{m})").format(c=column, k=name, n=negate, m=member)
        symbol = sql.SQL(_ORDER[op])
        if isinstance(operand, str):
            if "\x00" in operand:
                raise FilterError(f"{op} on {key!r}: {operand!r} holds a NUL character, which PostgreSQL text cannot hold")
            return sql.SQL(
                "(CASE WHEN jsonb_typeof({c} -> {k}) = 'string' THEN ({c} ->> {k}) COLLATE \"C\" {s} {v} ELSE FALSE END)"
            ).format(c=column, k=name, s=symbol, v=self.bind(operand))
        if isinstance(operand, float) and not math.isfinite(operand):
            raise FilterError(f"{op} on {key!r} takes a finite number, got {operand!r}")
        return sql.SQL("(CASE WHEN jsonb_typeof({c} -> {k}) = 'number' THEN ({c} -> {k})::numeric {s} {v}::numeric ELSE FALSE END)").format(
            c=column, k=name, s=symbol, v=self.bind(repr(operand) if isinstance(operand, float) else str(operand))
        )


def _equals(value: Any) -> list[Any]:
    """`value` and what Python's ``==`` also equates it with that JSON does not: ``True``/``1``, ``False``/``0``."""
    if isinstance(value, bool):
        return [value, int(value)]
    if isinstance(value, (int, float)) and value in (0, 1):
        return [value, bool(value)]
    return [value]


def jsonb_value(value: Any, *, where: str) -> Jsonb:
    """`value` as a jsonb parameter; `FilterError` naming `where` when it is not JSON (NaN, NUL, objects)."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise FilterError(f"{where}: {value!r} is not a JSON value ({e})") from e
    if "\\u0000" in text:
        raise FilterError(f"{where}: {value!r} holds a NUL character, which PostgreSQL's jsonb cannot store")
    return Jsonb(value)
