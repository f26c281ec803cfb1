"""The tables of `PgVectorStore` (see its module for the layout): created once, names from numbers only.

DDL takes no bound parameters, so the only values composed into it are validated integers
(`sql.Literal`), and every table name is an `sql.Identifier` made from a collection's number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from retrievers.errors import RetrieverError
from retrievers.extras import needs

with needs("postgres", "the PostgreSQL store"):
    import psycopg
    from psycopg import sql

__all__ = [
    "LOCK_CLASS", "SCHEMA_LOCK", "HnswSettings", "PgStoreError", "Tables", "create_tables", "drop_collection", "ensure_schema",
]

LOCK_CLASS = 0x52_41_47  # "RAG": the first key of ragspec's advisory locks (the second is the collection id)
SCHEMA_LOCK = 0  # second key of the lock that serializes creating tables


class PgStoreError(RetrieverError):
    """The database refused a change or a query; the message says what to fix. Nothing was changed."""


@dataclass(frozen=True)
class HnswSettings:
    """pgvector's HNSW index (cosine), fixed when a collection is created, and its search breadth."""

    m: int = 16
    """Graph neighbours per node (pgvector's default)."""
    ef_construction: int = 64
    """Candidate list while building (pgvector's default)."""
    ef_search: int = 100
    """Candidate list while searching (raised to the number of rows asked for); pgvector's default is 40."""

    def __post_init__(self) -> None:
        if not 2 <= self.m <= 100 or not 4 <= self.ef_construction <= 1000 or not 1 <= self.ef_search <= 1000:
            raise ValueError(f"HnswSettings needs 2 <= m <= 100, 4 <= ef_construction <= 1000, 1 <= ef_search <= 1000; got {self}")
        if self.ef_construction < 2 * self.m:
            raise ValueError(f"ef_construction must be at least 2 * m (pgvector), got {self}")


@dataclass(frozen=True)
class Tables:
    chunks: sql.Identifier
    terms: sql.Identifier
    files: sql.Identifier
    refs: sql.Identifier
    memo: sql.Identifier

    @classmethod
    def of(cls, collection_id: int) -> Tables:
        n = int(collection_id)
        return cls(*(sql.Identifier(f"ragspec_{kind}_{n}") for kind in ("chunks", "terms", "files", "refs", "memo")))


_SCHEMA = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE IF NOT EXISTS ragspec_collections (
    id serial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    embedding text NOT NULL,
    dimension integer NOT NULL,
    text_config text NOT NULL,
    settings jsonb,
    chunk_count bigint NOT NULL DEFAULT 0,
    total_length bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""


def ensure_schema(url: str) -> None:
    """The extension and the collections table, created once (a lock keeps two first users from racing)."""
    try:
        with psycopg.connect(url, autocommit=False) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, SCHEMA_LOCK))
            exists = conn.execute(
                "SELECT to_regclass('ragspec_collections') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')"
            ).fetchone()
            if not (exists and exists[0]):
                conn.execute(_SCHEMA)
    except psycopg.OperationalError as e:
        raise PgStoreError(f"cannot connect to the database ({str(e).strip().splitlines()[0] if str(e).strip() else e}); check the URL and that the server runs") from e
    except psycopg.errors.FeatureNotSupported as e:
        raise PgStoreError(f"the database has no pgvector ({e}); install the extension (CREATE EXTENSION vector)") from e


def create_tables(conn: psycopg.Connection[Any], t: Tables, dimension: int, hnsw: HnswSettings) -> None:
    """A new collection's tables and indexes (DDL takes no bound parameters: the numbers are validated ints)."""
    numbers = {"dim": sql.Literal(int(dimension)), "m": sql.Literal(int(hnsw.m)), "ef": sql.Literal(int(hnsw.ef_construction))}
    names = {"chunks": t.chunks, "terms": t.terms, "files": t.files, "refs": t.refs, "memo": t.memo}
    for statement in (
        "CREATE TABLE {chunks} (id text PRIMARY KEY, text text NOT NULL, metadata jsonb NOT NULL, "
        "embedding vector({dim}) NOT NULL, tsv tsvector NOT NULL, length integer NOT NULL)",
        "CREATE INDEX ON {chunks} USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {ef})",
        "CREATE INDEX ON {chunks} USING gin (tsv)",
        "CREATE TABLE {terms} (lexeme text PRIMARY KEY, df bigint NOT NULL)",
        "CREATE TABLE {files} (path text PRIMARY KEY, sha256 text NOT NULL, size bigint NOT NULL, chunks integer NOT NULL)",
        "CREATE TABLE {refs} (path text NOT NULL REFERENCES {files} ON DELETE CASCADE, position integer NOT NULL, "
        "key text NOT NULL, text_sha text NOT NULL, metadata jsonb NOT NULL, PRIMARY KEY (path, position))",
        "CREATE INDEX ON {refs} (key)",
        "CREATE TABLE {memo} (key text PRIMARY KEY, value jsonb NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    ):
        conn.execute(sql.SQL(statement).format(**names, **numbers))


def drop_collection(url: str, name: str) -> bool:
    """Drop the collection `name` with its tables; False when there is none. Waits for a writer of it to finish."""
    with psycopg.connect(url, autocommit=False) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, SCHEMA_LOCK))
        found = conn.execute("SELECT to_regclass('ragspec_collections') IS NOT NULL").fetchone()
        row = conn.execute("SELECT id FROM ragspec_collections WHERE name = %s", (name,)).fetchone() if found and found[0] else None
        if row is None:
            return False
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, int(row[0])))  # the collection's write lock
        t = Tables.of(int(row[0]))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}, {}, {}, {}").format(t.refs, t.files, t.memo, t.terms, t.chunks))
        conn.execute("DELETE FROM ragspec_collections WHERE id = %s", (int(row[0]),))
    return True
