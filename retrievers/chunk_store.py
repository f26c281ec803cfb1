"""What `FaissVectorStore` and `PgVectorStore` share: ids, embeddings and validation of added documents,
``from_texts``, and the LangChain search methods that reduce to ``similarity_search_with_score_by_vector``."""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from retrievers.embeddings import embed_chunks
from retrievers.types import MetadataFilter, check_filter

__all__ = ["ChunkStore", "Row", "as_matrix"]

_Store = TypeVar("_Store", bound="ChunkStore")


@dataclass(frozen=True)
class Row:
    """One chunk to store: its id, text, metadata (a copy) and vector."""

    id: str
    text: str
    metadata: dict[str, Any]
    vector: np.ndarray


def as_matrix(vectors: Iterable[Sequence[float]] | np.ndarray) -> np.ndarray:
    """``vectors`` as a C-contiguous float32 matrix of its own, one row a vector."""
    matrix = np.array(vectors, dtype="float32", copy=True)
    if matrix.ndim != 2:
        matrix = matrix.reshape(len(matrix), -1) if matrix.size else np.zeros((0, 0), dtype="float32")
    return np.ascontiguousarray(matrix)


class ChunkStore(VectorStore):
    """A LangChain `VectorStore` of chunks: a store writes checked rows (``_write``), searches by vector
    (``similarity_search_with_score_by_vector``), says when it holds nothing (``_empty``) and is built
    for ``from_texts`` (``_for_texts``); the rest is here."""

    _embedding: Embeddings
    _dim: int | None

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    @property
    def dimension(self) -> int | None:
        """Vector dimension, or None before anything was added."""
        return self._dim

    @abstractmethod
    def _empty(self) -> bool:
        """Whether nothing is stored (searches then return nothing, without embedding the query)."""

    def add_embeddings(self, texts: Sequence[str], embeddings: Sequence[Sequence[float]] | np.ndarray,
                       metadatas: Sequence[dict[str, Any]] | None = None, ids: Sequence[str] | None = None) -> list[str]:
        """Add precomputed vectors; an id already present is replaced. Returns the ids written (within one
        call a repeated id keeps its last text). Nothing is written when any row fails ``prepare_rows``."""
        rows = self.prepare_rows(texts, embeddings, metadatas, ids)
        if rows:
            self._write(rows)
        return [row.id for row in rows]

    def prepare_rows(self, texts: Sequence[str], embeddings: Sequence[Sequence[float]] | np.ndarray,
                     metadatas: Sequence[dict[str, Any]] | None = None, ids: Sequence[str] | None = None) -> list[Row]:
        """Checked rows, one per distinct id (the last of a repeated id wins); raises before anything is written."""
        vectors, n = as_matrix(embeddings), len(texts)
        if vectors.shape[0] != n or (metadatas is not None and len(metadatas) != n) or (ids is not None and len(ids) != n):
            raise ValueError("texts, embeddings, metadatas and ids must have the same length")
        id_list = [str(i) for i in ids] if ids is not None else [uuid.uuid4().hex for _ in range(n)]
        last = {doc_id: i for i, doc_id in enumerate(id_list)}
        rows = [
            Row(id_list[i], texts[i], dict(metadatas[i]) if metadatas is not None and metadatas[i] else {}, vectors[i])
            for i in sorted(last.values())
        ]
        if rows:
            self._check_rows(rows, vectors.shape[1])
        return rows

    def _check_rows(self, rows: Sequence[Row], dimension: int) -> None:
        """Raise for rows (of vectors of ``dimension``) the store cannot hold."""

    @abstractmethod
    def _write(self, rows: list[Row]) -> None:
        """Store ``rows`` (checked, distinct ids), replacing the documents of the same ids."""

    @classmethod
    @abstractmethod
    def _for_texts(cls: type[_Store], embedding: Embeddings, **kwargs: Any) -> _Store:
        """An empty store for ``from_texts``, built from its keyword arguments."""

    @classmethod
    def from_texts(
        cls: type[_Store],
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> _Store:
        """A new store (built by ``_for_texts`` from ``kwargs``) holding ``texts``, embedded by ``embedding``."""
        store = cls._for_texts(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def _check_documents(self, documents: Sequence[Document], ids: Sequence[str]) -> None:
        """Raise for documents the store cannot hold, before any time is spent embedding them."""

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Embed and add (or replace, for ids already present) documents; returns their ids.

        Ids come from the ``ids`` keyword, else each document's ``id``, else a new UUID. A chunk
        made by ``split_documents`` is embedded with its contextual header (``contextual_text``),
        as ``ragspec ingest`` does; other documents as their ``page_content``.
        """
        ids = kwargs.pop("ids", None)
        if ids is not None and len(ids) != len(documents):
            raise ValueError(f"got {len(ids)} ids for {len(documents)} documents; pass one id per document")
        resolved = [
            str(ids[i]) if ids is not None and ids[i] is not None else (doc.id or uuid.uuid4().hex)
            for i, doc in enumerate(documents)
        ]
        if not documents:
            return []
        self._check_documents(documents, resolved)
        vectors = embed_chunks(self._embedding, documents)
        return self.add_embeddings([d.page_content for d in documents], vectors, [d.metadata for d in documents], resolved)

    def add_texts(
        self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        texts = list(texts)
        docs = [Document(page_content=t, metadata=(metadatas[i] if metadatas else {}) or {}) for i, t in enumerate(texts)]
        return self.add_documents(docs, ids=ids)

    def similarity_search(
        self, query: str, k: int = 4, filter: MetadataFilter | None = None, **kwargs: Any  # noqa: A002
    ) -> list[Document]:
        """The k documents most similar to `query` (fewer if the store or filter has fewer)."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k=k, filter=filter, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: MetadataFilter | None = None, **kwargs: Any  # noqa: A002
    ) -> list[tuple[Document, float]]:
        """Like `similarity_search`, with cosine similarity scores (higher is closer)."""
        check_filter(filter)
        if k <= 0 or self._empty():
            return []
        return self.similarity_search_with_score_by_vector(self._embedding.embed_query(query), k=k, filter=filter, **kwargs)

    def similarity_search_by_vector(
        self, embedding: Sequence[float], k: int = 4, filter: MetadataFilter | None = None, **kwargs: Any  # noqa: A002
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k=k, filter=filter, **kwargs)]

    @abstractmethod
    def similarity_search_with_score_by_vector(
        self, embedding: Sequence[float], k: int = 4, filter: MetadataFilter | None = None, **kwargs: Any  # noqa: A002
    ) -> list[tuple[Document, float]]:
        """The k documents nearest to ``embedding``, with cosine similarity scores (higher is closer)."""
