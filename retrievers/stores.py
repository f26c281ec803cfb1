"""Open a store by its name: an index folder (FAISS) or a ``postgresql://`` URL (a collection in PostgreSQL).

psycopg is imported only for a URL, so folders work without the postgres extra.
"""

from __future__ import annotations

from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever

from retrievers.store_url import DEFAULT_COLLECTION, is_database_url

__all__ = ["open_hybrid_retriever"]


def open_hybrid_retriever(
    target: str, embeddings: Embeddings, *, collection: str | None = None, k: int = 4
) -> BaseRetriever:
    """The hybrid (dense + BM25) retriever over the store `target` names.

    A ``postgresql://`` URL: `PgHybridRetriever` over `collection` (default ``"default"``); both
    sides run inside the database. A folder: `HybridRetriever` over the FAISS index saved there
    (``collection`` must be None: a folder holds one).

    Raises:
        MissingExtraError: a URL without the postgres extra installed (the message says how to install it).
        IndexNotFoundError: nothing at `target` (no index in the folder, or no such collection).
    """
    if not is_database_url(target):
        if collection is not None:
            raise ValueError("a collection names a set of documents in a database; an index folder holds one: drop --collection")
        from retrievers.faiss_store import FaissVectorStore
        from retrievers.hybrid import HybridRetriever

        return HybridRetriever(vectorstore=FaissVectorStore.load(target, embeddings), k=k)
    from retrievers.pg_store import PgVectorStore  # MissingExtraError without the postgres extra
    from retrievers.errors import IndexNotFoundError

    store = PgVectorStore(target, embeddings, collection=collection or DEFAULT_COLLECTION)
    if store.collection_id is None:
        store.close()
        raise IndexNotFoundError(
            f"no collection {store.collection!r} in the database; build it with "
            f"'ragspec ingest PATH... --store URL --collection {store.collection}'"
        )
    from retrievers.pg_retriever import PgHybridRetriever

    return PgHybridRetriever(store=store, k=k)
