"""A LangChain `VectorStore` on PostgreSQL: pgvector (HNSW, cosine) for the dense side, BM25 over full-text search
for the keyword side, fused in one round trip; collections; filters as bound SQL.

Why not langchain-postgres' ``PGVector``: its schema (one embedding table for every collection,
``cmetadata`` jsonb) has no text-search column, and its newer ``PGVectorStore`` ranks keywords with
``ts_rank_cd`` (no IDF) in a second query, needs metadata as real columns to filter, and pins
``pgvector<0.4`` with SQLAlchemy and asyncpg. ragspec needs the keyword side scored as its FAISS
hybrid scores it (BM25 over the chunk's contextual header and text), the file manifest beside the
chunks, and one lock per collection; so the SQL is written here with psycopg 3 (``sql.Identifier``
for names, bound parameters for every value) on a ``psycopg_pool`` pool, and pgvector's adapter
for the vectors.

Layout in the database (``ragspec_`` tables, created on first use):

- ``ragspec_collections``: one row per collection: its name, the embedding model's fingerprint and
  dimension (checked on every later open: a mismatch is `IndexMismatchError`, never mixed vectors),
  the text-search configuration, the chunking settings of the last sync, and the chunk count and
  total length that BM25 needs.
- per collection ``id``: ``ragspec_chunks_<id>`` (id, text, metadata jsonb, ``vector(d)`` with an
  HNSW index, ``tsvector`` of the contextual text with a GIN index, its length in tokens),
  ``ragspec_terms_<id>`` (document frequency of each lexeme, for BM25's IDF) and the manifest of
  synced files (``ragspec_files_<id>``, ``ragspec_refs_<id>``; `retrievers.pg_ingest`). A query names
  one collection's tables only, so it cannot read another collection's chunks.

Every write to a collection runs in one transaction holding the collection's advisory lock, so
the chunks, the term statistics and the manifest move together, and writers of one collection
take turns (readers never wait: MVCC).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Literal

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from retrievers.chunk_store import ChunkStore, Row
from retrievers.chunking import contextual_text
from retrievers.embeddings import embeddings_fingerprint
from retrievers.errors import DimensionMismatchError, IndexMismatchError
from retrievers.hybrid import reciprocal_rank_fusion, relative_score_fusion
from retrievers.pg_filters import filter_sql
from retrievers.pg_schema import LOCK_CLASS, SCHEMA_LOCK, HnswSettings, PgStoreError, Tables, create_tables, ensure_schema
from retrievers.store_url import DEFAULT_COLLECTION, is_database_url
from retrievers.types import MetadataFilter, ScoredDocument, check_filter
from retrievers.extras import needs

with needs("postgres", "PgVectorStore"):
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool

__all__ = ["MEMO_ENTRIES", "HnswSettings", "PgStoreError", "PgVectorStore"]

MEMO_ENTRIES = 10_000
"""Entries `PgVectorStore.remember` keeps per collection (the oldest go first)."""
_MAX_NAME = 200
_BM25_K1 = 1.5  # BM25Retriever's defaults, so both stores rank keywords alike
_BM25_B = 0.75
_COMMON_FLOOR = 2000  # a query term in more chunks than this and than _COMMON_SHARE of them finds no candidates
_COMMON_SHARE = 0.05  # by itself (it still scores them): see `keyword_search`


class PgVectorStore(ChunkStore):
    """Chunks of one collection in PostgreSQL, searched densely (HNSW), by keywords (BM25 on full-text search) or both.

    Example:
        >>> store = PgVectorStore("postgresql://app@db/rag", default_embeddings(), collection="handbook")
        >>> store.add_documents(chunks)
        >>> store.hybrid_search("how do I rotate keys?", k=4, filter={"file_type": "md"})
        >>> retriever = PgHybridRetriever(store=store, k=4)     # what DocumentQA.from_store uses

    The collection is created on the first write (its dimension is the first vectors'); opening
    one that exists checks the embedding model's fingerprint and dimension against it.
    """

    def __init__(
        self,
        url: str,
        embedding: Embeddings,
        *,
        collection: str = DEFAULT_COLLECTION,
        hnsw: HnswSettings | None = None,
        text_search_config: str = "english",
        pool_size: int = 4,
        check_embeddings: bool = True,
    ) -> None:
        if not is_database_url(url):
            raise ValueError(f"url must start with postgresql:// or postgres://, got {url[:40]!r}")
        _check_name(collection)
        if pool_size < 1:
            raise ValueError(f"pool_size must be positive, got {pool_size}")
        self._embedding = embedding
        self.url = url
        self.collection = collection
        self.hnsw = hnsw or HnswSettings()
        self.text_search_config = text_search_config
        self.check_embeddings = check_embeddings
        ensure_schema(url)
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, configure=register_vector, open=True,
                                    kwargs={"autocommit": False})  # fmt: skip
        self._id: int | None = None
        self._dim: int | None = None
        try:
            self._open_collection()
        except BaseException:
            self._pool.close()
            raise

    # --- basics -------------------------------------------------------------------------

    @property
    def collection_id(self) -> int | None:
        """The collection's number in ``ragspec_collections`` (None before it was created)."""
        return self._id

    def close(self) -> None:
        """Close the connection pool."""
        self._pool.close()

    def __enter__(self) -> PgVectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda score: min(1.0, max(0.0, (1.0 + score) / 2.0))

    def _open_collection(self) -> None:
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT id, embedding, dimension, text_config FROM ragspec_collections WHERE name = %s", (self.collection,)
            ).fetchone()
        if row is None:
            return
        self._id, fingerprint, self._dim, config = int(row[0]), row[1], int(row[2]), row[3]
        self.text_search_config = config
        wanted = embeddings_fingerprint(self._embedding)
        if self.check_embeddings and fingerprint != wanted:
            raise IndexMismatchError(
                f"collection {self.collection!r} was built with embeddings {fingerprint!r} ({self._dim} dimensions), "
                f"not {wanted!r}; use the model it was built with, or another --collection"
            )

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[psycopg.Connection[Any]]:
        """One transaction; a write one holds the collection's advisory lock until it commits."""
        with self._pool.connection() as conn:
            with conn.transaction():
                if write and self._id is not None:
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, self._id))
                yield conn

    def _empty(self) -> bool:
        return self._missing()

    def _missing(self) -> bool:
        """Whether the collection does not exist (yet): another process may have created it since this one looked."""
        if self._id is None:
            self._open_collection()
        return self._id is None

    def _tables(self) -> Tables:
        assert self._id is not None
        return Tables.of(self._id)

    def __len__(self) -> int:
        if self._missing():
            return 0
        with self._transaction(write=False) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._tables().chunks)).fetchone()
        return int(row[0]) if row else 0

    # --- writing ------------------------------------------------------------------------

    def _check_documents(self, documents: Sequence[Document], ids: Sequence[str]) -> None:
        for doc, doc_id in zip(documents, ids):
            _check_storable(doc_id, doc.page_content, doc.metadata)

    def _check_rows(self, rows: Sequence[Row], dimension: int) -> None:
        for row in rows:
            _check_storable(row.id, row.text, row.metadata)
            if not np.all(np.isfinite(row.vector)):
                raise ValueError(f"the vector of document {row.id!r} is not finite")
        if self._dim is not None and dimension != self._dim:
            raise DimensionMismatchError(
                f"embeddings have dimension {dimension} but collection {self.collection!r} holds "
                f"{self._dim}-dimensional vectors; use the embedding model it was built with, or another collection"
            )

    def _write(self, rows: list[Row]) -> None:
        """Upsert the rows in one transaction (an id already present gets the new text, metadata and vector)."""
        self._ensure_collection(len(rows[0].vector))
        with self._transaction(write=True) as conn:
            self.write_rows(conn, rows)

    def write_rows(self, conn: psycopg.Connection[Any], rows: Sequence[Row]) -> None:
        """Upsert `rows` inside the caller's write transaction, keeping the BM25 statistics in step."""
        ids = [row.id for row in rows]
        self._forget_statistics(conn, ids)
        t = self._tables()
        statement = sql.SQL(
            "INSERT INTO {chunks} (id, text, metadata, embedding, tsv, length) "
            "SELECT r.id, r.text, r.metadata, r.embedding, v.tsv, "
            "(SELECT coalesce(sum(array_length(u.positions, 1)), 0) FROM unnest(v.tsv) u) "
            "FROM unnest(%(id)s::text[], %(text)s::text[], %(metadata)s::jsonb[], %(embedding)s::vector[], %(context)s::text[]) "
            "AS r(id, text, metadata, embedding, context) "
            "CROSS JOIN LATERAL (SELECT to_tsvector(%(config)s::regconfig, r.context) AS tsv) v "
            "ON CONFLICT (id) DO UPDATE SET text = EXCLUDED.text, metadata = EXCLUDED.metadata, "
            "embedding = EXCLUDED.embedding, tsv = EXCLUDED.tsv, length = EXCLUDED.length"
        ).format(chunks=t.chunks)
        params = {  # one statement for the whole batch: the rows travel as arrays
            "id": ids, "text": [row.text for row in rows], "metadata": [Jsonb(row.metadata) for row in rows],
            "embedding": [row.vector for row in rows], "config": self.text_search_config,
            "context": [contextual_text(Document(page_content=row.text, metadata=row.metadata)) for row in rows],
        }  # fmt: skip
        try:
            conn.execute(statement, params)
        except psycopg.errors.ProgramLimitExceeded as e:
            raise PgStoreError(
                f"a document is too large for PostgreSQL's full-text index ({e.diag.message_primary}); split it into "
                "smaller chunks (split_documents). Nothing was written"
            ) from e
        self._count_statistics(conn, ids, sign=1)

    def update_metadata(self, conn: psycopg.Connection[Any], updates: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
        """Replace (id, text, metadata) of stored chunks without re-embedding them, in the caller's write transaction.

        For changes that leave the embedded text as it was (a chunk's sources); the keyword index is
        rebuilt from the new contextual text.
        """
        self._forget_statistics(conn, [u[0] for u in updates])
        statement = sql.SQL(
            "UPDATE {chunks} SET text = %(text)s, metadata = %(metadata)s, tsv = v.tsv, "
            "length = (SELECT coalesce(sum(array_length(u.positions, 1)), 0) FROM unnest(v.tsv) u) "
            "FROM (SELECT to_tsvector(%(config)s::regconfig, %(context)s) AS tsv) v WHERE id = %(id)s"
        ).format(chunks=self._tables().chunks)
        for doc_id, text, metadata in updates:
            _check_storable(doc_id, text, metadata)
        params = [
            {"id": doc_id, "text": text, "metadata": Jsonb(metadata), "config": self.text_search_config,
             "context": contextual_text(Document(page_content=text, metadata=metadata))}
            for doc_id, text, metadata in updates
        ]  # fmt: skip
        with conn.cursor() as cur:
            cur.executemany(statement, params)
        self._count_statistics(conn, [u[0] for u in updates], sign=1)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete chunks by id (unknown ids are ignored); ``ids=None`` empties the collection (its manifest too)."""
        if self._missing():
            return True
        with self._transaction(write=True) as conn:
            if ids is None:
                t = self._tables()
                for table in (t.refs, t.files, t.chunks, t.terms, t.memo):
                    conn.execute(sql.SQL("DELETE FROM {}").format(table))
                conn.execute(
                    "UPDATE ragspec_collections SET chunk_count = 0, total_length = 0, settings = NULL WHERE id = %s", (self._id,)
                )
            else:
                self.delete_rows(conn, [str(i) for i in ids])
        return True

    def delete_rows(self, conn: psycopg.Connection[Any], ids: Sequence[str]) -> None:
        """Delete chunks inside the caller's write transaction."""
        if not ids:
            return
        self._forget_statistics(conn, ids)
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self._tables().chunks), (list(ids),))

    def _forget_statistics(self, conn: psycopg.Connection[Any], ids: Sequence[str]) -> None:
        self._count_statistics(conn, ids, sign=-1)

    def _count_statistics(self, conn: psycopg.Connection[Any], ids: Sequence[str], *, sign: int) -> None:
        """Add (sign 1) or remove (-1) the rows `ids` (as stored now) from the document frequencies and totals."""
        t = self._tables()
        conn.execute(
            sql.SQL(
                "INSERT INTO {terms} (lexeme, df) SELECT u.lexeme, %(sign)s * count(*) FROM {chunks} c, unnest(c.tsv) u "
                "WHERE c.id = ANY(%(ids)s) GROUP BY u.lexeme "
                "ON CONFLICT (lexeme) DO UPDATE SET df = {terms}.df + EXCLUDED.df"
            ).format(terms=t.terms, chunks=t.chunks),
            {"ids": list(ids), "sign": sign},
        )
        if sign < 0:
            conn.execute(sql.SQL("DELETE FROM {} WHERE df <= 0").format(t.terms))
        conn.execute(
            sql.SQL(
                "UPDATE ragspec_collections SET chunk_count = chunk_count + %(sign)s * s.n, "
                "total_length = total_length + %(sign)s * s.total "
                "FROM (SELECT count(*) AS n, coalesce(sum(length), 0) AS total FROM {chunks} WHERE id = ANY(%(ids)s)) s "
                "WHERE ragspec_collections.id = %(collection)s"
            ).format(chunks=t.chunks),
            {"ids": list(ids), "sign": sign, "collection": self._id},
        )

    def _ensure_collection(self, dimension: int) -> None:
        """Create the collection and its tables for vectors of `dimension` (once; safe under concurrency)."""
        if self._id is not None:
            return
        if dimension < 1 or dimension > 16000:
            raise ValueError(f"pgvector's vector type holds 1 to 16000 dimensions, got {dimension}")
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, SCHEMA_LOCK))
            row = conn.execute("SELECT id FROM ragspec_collections WHERE name = %s", (self.collection,)).fetchone()
            if row is None:
                conn.execute("SELECT %s::regconfig", (self.text_search_config,))  # an unknown configuration fails here
                row = conn.execute(
                    "INSERT INTO ragspec_collections (name, embedding, dimension, text_config) VALUES (%s, %s, %s, %s) "
                    "RETURNING id",
                    (self.collection, embeddings_fingerprint(self._embedding), dimension, self.text_search_config),
                ).fetchone()
                assert row is not None
                create_tables(conn, Tables.of(int(row[0])), dimension, self.hnsw)
        self._open_collection()

    # --- reading ------------------------------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked."""
        if self._missing() or not ids:
            return []
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, text, metadata FROM {} WHERE id = ANY(%s)").format(self._tables().chunks),
                ([str(i) for i in ids],),
            ).fetchall()
        found = {row[0]: Document(id=row[0], page_content=row[1], metadata=row[2]) for row in rows}
        return [found[str(i)] for i in ids if str(i) in found]

    def files(self) -> list[str]:
        """The files ingested into the collection (its manifest's paths), sorted; ``[]`` before it exists."""
        if self._missing():
            return []
        with self._transaction(write=False) as conn:
            rows = conn.execute(sql.SQL("SELECT path FROM {} ORDER BY path").format(self._tables().files)).fetchall()
        return [path for (path,) in rows]

    def documents(self, filter: MetadataFilter | None = None) -> list[Document]:  # noqa: A002
        """All stored documents (those passing `filter`), by id."""
        if self._missing():
            check_filter(filter)
            return []
        where, params = filter_sql(filter)
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                sql.SQL("SELECT id, text, metadata FROM {} WHERE {} ORDER BY id").format(self._tables().chunks, where), params
            ).fetchall()
        return [Document(id=r[0], page_content=r[1], metadata=r[2]) for r in rows]

    def similarity_search_with_score_by_vector(
        self, embedding: Sequence[float], k: int = 4, filter: MetadataFilter | None = None, exact: bool = False, **kwargs: Any  # noqa: A002
    ) -> list[tuple[Document, float]]:
        """Nearest by cosine through the HNSW index (``exact=True``: a full scan, the reference for its recall)."""
        where, params = filter_sql(filter)
        if k <= 0 or self._missing():
            return []
        vector = self._query_vector(embedding)
        statement = sql.SQL(
            "SELECT id, text, metadata, 1 - (embedding <=> %(v)s) FROM {chunks} WHERE {where} "
            "ORDER BY embedding <=> %(v)s, id LIMIT %(k)s"
        ).format(chunks=self._tables().chunks, where=where)
        with self._transaction(write=False) as conn:
            self._search_settings(conn, k, exact)
            rows = conn.execute(statement, {**params, "v": vector, "k": k}).fetchall()
        return [(Document(id=r[0], page_content=r[1], metadata=r[2]), float(r[3])) for r in rows]

    def _query_vector(self, embedding: Sequence[float]) -> np.ndarray:
        vector = np.asarray(embedding, dtype="float32").reshape(-1)
        if vector.shape[0] != self._dim:
            raise DimensionMismatchError(
                f"query vector has dimension {vector.shape[0]} but collection {self.collection!r} holds "
                f"{self._dim}-dimensional vectors; query with the embedding model it was built with"
            )
        return vector

    def _search_settings(self, conn: psycopg.Connection[Any], rows: int, exact: bool) -> None:
        """Search breadth for this transaction: HNSW ``ef_search`` of at least `rows`, scanning on past
        filtered-out rows in distance order; or no index at all for an exact search."""
        if exact:
            conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
            return
        conn.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'strict_order', true)",
            (str(min(1000, max(self.hnsw.ef_search, rows))),),
        )

    def keyword_search(self, query: str, k: int = 4, filter: MetadataFilter | None = None) -> list[ScoredDocument]:  # noqa: A002
        """Top-k by BM25 over the full-text index (only documents sharing a term with the query).

        BM25 is computed exactly (Lucene's idf, k1 = 1.5, b = 0.75, as `BM25Retriever`) for every
        candidate. Candidates are the chunks holding a query term, except that in a large collection a
        term found in more than 2000 chunks and more than 5% of them does not make a chunk a candidate
        by itself (when every query term is that common, all of them do): scoring every chunk that
        holds "use" or "data" would cost a scan of the collection per query, for chunks that term
        alone ranks low. In collections of 2000 chunks or fewer this never applies.
        """
        return self._hybrid_rows(query, None, k, filter)[1]

    def hybrid_search(
        self,
        query: str,
        k: int = 4,
        filter: MetadataFilter | None = None,  # noqa: A002
        *,
        fetch_k: int = 20,
        fusion: Literal["relative_score", "rrf"] = "relative_score",
        rrf_k: int = 60,
        dense_weight: float = 1.0,
        keyword_weight: float = 1.0,
    ) -> list[ScoredDocument]:
        """Dense and BM25 candidates (`fetch_k` each) from one statement, fused as `HybridRetriever` fuses them."""
        check_filter(filter)
        if k <= 0 or self._missing():
            return []
        fetch = max(fetch_k, k)
        dense, lexical = self._hybrid_rows(query, self._embedding.embed_query(query), fetch, filter)
        by_id = {hit.document.id: hit.document for hit in (*dense, *lexical)}
        weights = [dense_weight, keyword_weight]
        if fusion == "rrf":
            fused = reciprocal_rank_fusion([[h.document.id for h in side] for side in (dense, lexical)], k=rrf_k, weights=weights)
        elif fusion == "relative_score":
            relevance = self._select_relevance_score_fn()
            fused = relative_score_fusion(
                [[(h.document.id, relevance(h.score)) for h in dense], [(h.document.id, h.score) for h in lexical]],
                weights=weights,
            )
        else:
            raise ValueError(f"fusion must be 'relative_score' or 'rrf', got {fusion!r}")
        return [ScoredDocument(by_id[key], score) for key, score in fused[:k]]  # type: ignore[index]

    def _hybrid_rows(
        self, query: str, vector: Sequence[float] | None, fetch: int, filter: MetadataFilter | None  # noqa: A002
    ) -> tuple[list[ScoredDocument], list[ScoredDocument]]:
        """The dense (when `vector` is given) and BM25 candidates, best first, in one round trip."""
        where, params = filter_sql(filter)
        if fetch <= 0 or self._missing():
            return [], []
        if "\x00" in query:
            raise ValueError("the query holds a NUL character; remove it")
        t = self._tables()
        parts = {"chunks": t.chunks, "terms": t.terms, "where": where}
        lexical = sql.SQL(
            "WITH stats AS (SELECT greatest(chunk_count, 1) AS n, greatest(total_length::float8 / greatest(chunk_count, 1), 1e-9) AS avgdl "
            "  FROM ragspec_collections WHERE id = %(collection)s), "
            "q AS (SELECT DISTINCT w.lexeme, tm.df FROM unnest(to_tsvector(%(config)s::regconfig, %(query)s)) w "
            "  JOIN {terms} tm ON tm.lexeme = w.lexeme), "
            "rare AS (SELECT q.lexeme FROM q, stats s WHERE q.df <= greatest(%(common_floor)s, %(common_share)s * s.n)), "
            "seeds AS (SELECT lexeme FROM rare UNION ALL SELECT lexeme FROM q WHERE NOT EXISTS (SELECT 1 FROM rare)), "
            "tsq AS (SELECT string_agg('''' || replace(replace(lexeme, '\\', '\\\\'), '''', '''''') || '''', ' | ')::tsquery AS q FROM seeds), "
            "matched AS (SELECT c.id, c.tsv, c.length FROM {chunks} c, tsq WHERE c.tsv @@ tsq.q AND {where}), "
            "lexical AS (SELECT m.id, sum(ln(1 + (s.n - q.df + 0.5) / (q.df + 0.5)) * array_length(u.positions, 1) "
            "    / (array_length(u.positions, 1) + %(k1)s * (1 - %(b)s + %(b)s * m.length / s.avgdl))) AS score "
            "  FROM matched m CROSS JOIN stats s CROSS JOIN LATERAL unnest(m.tsv) u JOIN q ON q.lexeme = u.lexeme "
            "  GROUP BY m.id ORDER BY score DESC, m.id LIMIT %(fetch)s) "
        ).format(**parts)
        if vector is not None:
            body = sql.SQL(
                ", dense AS (SELECT id, 1 - (embedding <=> %(v)s) AS score FROM {chunks} WHERE {where} "
                "  ORDER BY embedding <=> %(v)s, id LIMIT %(fetch)s) "
                "SELECT 'd', d.id, d.score, c.text, c.metadata FROM dense d JOIN {chunks} c ON c.id = d.id "
                "UNION ALL SELECT 'l', l.id, l.score, c.text, c.metadata FROM lexical l JOIN {chunks} c ON c.id = l.id"
            ).format(**parts)
            params["v"] = self._query_vector(vector)
        else:
            body = sql.SQL("SELECT 'l', l.id, l.score, c.text, c.metadata FROM lexical l JOIN {chunks} c ON c.id = l.id").format(**parts)
        params.update({"collection": self._id, "config": self.text_search_config, "query": query, "fetch": fetch,
                       "k1": _BM25_K1, "b": _BM25_B, "common_floor": _COMMON_FLOOR, "common_share": _COMMON_SHARE})  # fmt: skip
        with self._transaction(write=False) as conn:
            self._search_settings(conn, fetch, exact=False)
            rows = conn.execute(lexical + body, params).fetchall()
        sides: dict[str, list[ScoredDocument]] = {"d": [], "l": []}
        for side, doc_id, score, text, metadata in rows:
            sides[side].append(ScoredDocument(Document(id=doc_id, page_content=text, metadata=metadata), float(score)))
        for hits in sides.values():
            hits.sort(key=lambda h: (-h.score, h.document.id))
        return sides["d"], sides["l"]

    # --- what an app remembers across replicas --------------------------------------------

    def remember(self, key: str, documents: Sequence[Document]) -> None:
        """Keep `documents` under `key` in the collection's memo table, shared by every process using the
        collection (the newest `MEMO_ENTRIES` are kept). ``apps.collection.Collection`` keeps there the
        passages each answer was first shown with, so that any replica lays out a follow-up alike."""
        if self._missing():
            return
        for doc in documents:
            _check_storable(str(doc.id or ""), doc.page_content, doc.metadata)
        value = Jsonb([{"id": d.id, "text": d.page_content, "metadata": d.metadata} for d in documents])
        memo = self._tables().memo
        with self._transaction(write=False) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} (key, value) VALUES (%s, %s) "
                        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, at = clock_timestamp()").format(memo),
                (key, value),
            )  # fmt: skip
            conn.execute(
                sql.SQL("DELETE FROM {m} WHERE key IN (SELECT key FROM {m} ORDER BY at DESC, key OFFSET %s)").format(m=memo),
                (MEMO_ENTRIES,),
            )

    def recall(self, key: str) -> list[Document] | None:
        """What `remember` kept under `key`, or None."""
        if self._missing():
            return None
        with self._transaction(write=False) as conn:
            row = conn.execute(sql.SQL("SELECT value FROM {} WHERE key = %s").format(self._tables().memo), (key,)).fetchone()
        if row is None:
            return None
        return [Document(id=d["id"], page_content=d["text"], metadata=d["metadata"]) for d in row[0]]

    # --- construction -------------------------------------------------------------------

    @classmethod
    def _for_texts(cls, embedding: Embeddings, *, url: str | None = None, **kwargs: Any) -> PgVectorStore:
        if url is None:
            raise ValueError("PgVectorStore.from_texts needs url='postgresql://...'")
        return cls(url, embedding, **kwargs)


def _check_name(collection: str) -> None:
    if not isinstance(collection, str) or not collection.strip() or len(collection) > _MAX_NAME or "\x00" in collection:
        raise ValueError(f"a collection name is 1 to {_MAX_NAME} characters (no NUL), got {collection!r}")


def _check_storable(doc_id: str, text: str, metadata: dict[str, Any]) -> None:
    """PostgreSQL's text and jsonb hold neither NUL characters nor NaN: say which document has one, before writing."""
    if not isinstance(text, str):
        raise TypeError(f"the text of document {doc_id!r} is {type(text).__name__}, not str")
    for what, value in (("id", doc_id), ("text", text)):
        if "\x00" in value:
            raise ValueError(
                f"the {what} of document {doc_id[:80]!r} holds a NUL character, which PostgreSQL text cannot store; remove it"
            )
    try:
        encoded = json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"metadata of document {doc_id!r} cannot be stored as JSON ({e}); keep metadata to str, int, finite float, "
            "bool, None, lists and dicts with string keys"
        ) from e
    if "\\u0000" in encoded:
        raise ValueError(f"metadata of document {doc_id!r} holds a NUL character, which PostgreSQL's jsonb cannot store")
