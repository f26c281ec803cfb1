"""Names of stores: a ``postgresql://`` URL (a collection in PostgreSQL) or an index folder. A leaf module
(no psycopg, no FAISS), so telling them apart costs nothing."""

from __future__ import annotations

__all__ = ["DATABASE_SCHEMES", "DEFAULT_COLLECTION", "is_database_url", "safe_label"]

DATABASE_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_COLLECTION = "default"


def is_database_url(target: object) -> bool:
    """Whether `target` names a PostgreSQL database (``postgresql://`` or ``postgres://``) rather than an index folder."""
    return isinstance(target, str) and target.startswith(DATABASE_SCHEMES)


def safe_label(target: str, collection: str | None = None) -> str:
    """`target` as it may be printed: a database URL without its password, and the collection."""
    if not is_database_url(target):
        return str(target)
    scheme, _, rest = target.partition("://")
    credentials, at, location = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    shown = f"{scheme}://{user}{at}{location}" if at else target
    return f"collection {collection or DEFAULT_COLLECTION!r} at {shown}"

