"""A LangChain `VectorStore` on FAISS: cosine similarity, exact or HNSW, upsert/delete by id, filters, safe persistence.

Vectors are L2-normalized and compared by inner product, so scores are cosine
similarities in [-1, 1]. Documents live in a Python dict keyed by id; FAISS holds the
vectors under int64 labels (`IndexIDMap2`). The flat index removes deleted vectors at
once; HNSW cannot remove, so deleted labels become tombstones that searches skip and the
index is rebuilt from its own vectors once tombstones outnumber live vectors.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from retrievers.catalog import CATALOG_VERSION, Catalog
from retrievers.chunk_store import ChunkStore, Row, as_matrix
from retrievers.embeddings import embeddings_fingerprint
from retrievers.errors import DimensionMismatchError, IndexCorruptError, IndexMismatchError, IndexSaveError
from retrievers.persistence import DEFAULT_LOCK_TIMEOUT_S, read_store, write_store
from retrievers.types import MetadataFilter, check_filter, matches_filter
from retrievers.extras import needs

with needs("retrieval", "FaissVectorStore"):
    import faiss

__all__ = ["FaissVectorStore", "FlatIndex", "HNSWIndex", "IndexConfig"]


@dataclass(frozen=True)
class FlatIndex:
    """Exact search (`IndexFlatIP`): the default; fast enough up to ~10^5-10^6 vectors."""

    kind: Literal["flat"] = "flat"


@dataclass(frozen=True)
class HNSWIndex:
    """Approximate search (`IndexHNSWFlat`, inner product) for large corpora."""

    m: int = 32
    """Graph neighbours per node: more is more accurate, bigger and slower to build."""
    ef_construction: int = 200
    """Candidate list size while building."""
    ef_search: int = 128
    """Candidate list size while searching (raised to k when k is larger)."""
    kind: Literal["hnsw"] = "hnsw"

    def __post_init__(self) -> None:
        if self.m < 2 or self.ef_construction < 1 or self.ef_search < 1:
            raise ValueError(f"HNSWIndex needs m >= 2 and positive ef values, got {self}")


IndexConfig = Union[FlatIndex, HNSWIndex]


@dataclass
class _Record:
    label: int
    text: str
    metadata: dict[str, Any]


class FaissVectorStore(ChunkStore):
    """FAISS vector store with ids, metadata filters and pickle-free, atomic `save`/`load`.

    Example:
        >>> store = FaissVectorStore(default_embeddings())
        >>> store.add_documents(chunks)
        >>> store.similarity_search("how do I rotate keys?", k=4, filter={"file_type": "md"})
        >>> store.save("my-index"); store = FaissVectorStore.load("my-index", default_embeddings())
    """

    def __init__(self, embedding: Embeddings, index: IndexConfig | None = None) -> None:
        if index is not None and not isinstance(index, (FlatIndex, HNSWIndex)):
            raise TypeError(f"index must be FlatIndex() or HNSWIndex(...), got {type(index).__name__}")
        self._embedding = embedding
        self.index_config: IndexConfig = index or FlatIndex()
        self._index: Any = None  # faiss.IndexIDMap2, created on the first add (dimension known then)
        self._dim: int | None = None
        self._records: dict[str, _Record] = {}
        self._label_to_id: dict[int, str] = {}
        self._next_label = 0
        self._lock = threading.RLock()
        self.catalog: Catalog | None = None
        """The files the store was synced from (`retrievers.ingest.sync_index`), saved with it; None otherwise."""

    # --- basics -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, doc_id: object) -> bool:
        """Whether a document with this id is stored."""
        return doc_id in self._records

    def documents(self) -> list[Document]:
        """All stored documents (with ids), in insertion order."""
        with self._lock:
            return [self._document(doc_id, rec) for doc_id, rec in self._records.items()]

    @staticmethod
    def _document(doc_id: str, rec: _Record) -> Document:
        return Document(id=doc_id, page_content=rec.text, metadata=dict(rec.metadata))

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda score: min(1.0, max(0.0, (1.0 + score) / 2.0))

    def _empty(self) -> bool:
        return not self._records

    # --- writing ------------------------------------------------------------------------

    def _write(self, rows: list[Row]) -> None:
        """Add the rows' vectors (normalized here); an id already present is replaced."""
        kept = np.stack([row.vector for row in rows])
        faiss.normalize_L2(kept)
        with self._lock:
            self._ensure_index(kept.shape[1])
            self._remove([row.id for row in rows if row.id in self._records])
            labels = np.arange(self._next_label, self._next_label + len(rows), dtype="int64")
            self._next_label += len(rows)
            self._index.add_with_ids(kept, labels)
            for label, row in zip(labels.tolist(), rows):
                self._records[row.id] = _Record(label, row.text, row.metadata)
                self._label_to_id[label] = row.id

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete documents by id (unknown ids are ignored); ``ids=None`` deletes everything."""
        with self._lock:
            if ids is None:
                self._records.clear()
                self._label_to_id.clear()
                if self._index is not None:
                    self._index = self._new_index(self._index.d)
                return True
            self._remove([str(i) for i in ids if str(i) in self._records])
        return True

    def update_documents(self, documents: Sequence[Document]) -> None:
        """Replace the text and metadata of stored documents (matched by ``id``) without re-embedding them.

        The vectors stay as they are, so use it for changes that do not change what was
        embedded (a chunk's sources, or another whitespace variant of its text).

        Raises:
            KeyError: a document has no id, or an id that is not stored (nothing is changed then).
        """
        with self._lock:
            missing = [doc.id for doc in documents if doc.id is None or doc.id not in self._records]
            if missing:
                raise KeyError(f"update_documents needs the ids of stored documents; not stored: {missing[:5]!r}")
            for doc in documents:
                record = self._records[str(doc.id)]
                record.text = doc.page_content
                record.metadata = dict(doc.metadata)

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked."""
        with self._lock:
            return [self._document(i, self._records[i]) for i in ids if i in self._records]

    def _remove(self, ids: list[str]) -> None:
        if not ids:
            return
        labels = np.asarray([self._records.pop(i).label for i in ids], dtype="int64")
        for label in labels.tolist():
            del self._label_to_id[label]
        if isinstance(self.index_config, FlatIndex):
            self._index.remove_ids(faiss.IDSelectorBatch(labels))
        elif self._index.ntotal - len(self._records) > max(64, len(self._records)):
            self._compact()

    def _compact(self) -> None:
        """Rebuild an HNSW index from its live vectors, dropping tombstones."""
        live = np.asarray(sorted(self._label_to_id), dtype="int64")
        vectors = self._index.reconstruct_batch(live) if len(live) else None
        self._index = self._new_index(self._index.d)
        if vectors is not None:
            self._index.add_with_ids(vectors, live)

    def _ensure_index(self, dim: int) -> None:
        if self._index is None:
            self._index = self._new_index(dim)
            self._dim = dim
        elif dim != self._dim:
            raise DimensionMismatchError(
                f"embeddings have dimension {dim} but this store holds {self._dim}-dimensional vectors; "
                "use the embedding model the store was built with, or build a new store"
            )

    def _new_index(self, dim: int) -> Any:
        config = self.index_config
        if isinstance(config, HNSWIndex):
            base = faiss.IndexHNSWFlat(dim, config.m, faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = config.ef_construction
            base.hnsw.efSearch = config.ef_search
        else:
            base = faiss.IndexFlatIP(dim)
        return faiss.IndexIDMap2(base)

    # --- searching ----------------------------------------------------------------------

    def similarity_search_with_score_by_vector(
        self, embedding: Sequence[float], k: int = 4, filter: MetadataFilter | None = None, **kwargs: Any  # noqa: A002
    ) -> list[tuple[Document, float]]:
        with self._lock:
            hits = self._search(embedding, k, filter)
            return [(self._document(doc_id, self._records[doc_id]), score) for doc_id, score, _ in hits]

    def _search(self, embedding: Sequence[float], k: int, filter: MetadataFilter | None) -> list[tuple[str, float, int]]:  # noqa: A002
        """Top-k (id, score, label) under the lock; the core of every search."""
        check_filter(filter)
        if k <= 0 or self._index is None or not self._records:
            return []
        query = as_matrix([embedding])
        if query.shape[1] != self._dim:
            raise DimensionMismatchError(
                f"query vector has dimension {query.shape[1]} but the index holds {self._dim}-dimensional "
                "vectors; query with the embedding model the index was built with"
            )
        faiss.normalize_L2(query)
        selector = None
        candidates = len(self._records)
        if filter is not None:
            allowed = [rec.label for rec in self._records.values() if matches_filter(rec.metadata, filter)]
            if not allowed:
                return []
            selector = faiss.IDSelectorBatch(np.asarray(allowed, dtype="int64"))
            candidates = len(allowed)
        tombstones = self._index.ntotal - len(self._records)  # only HNSW has any
        fetch = min(k, candidates) + (0 if selector is not None else tombstones)
        fetch = min(fetch, self._index.ntotal)
        params = self._search_params(selector, fetch)
        scores, labels = self._index.search(query, fetch, params=params)
        hits: list[tuple[str, float, int]] = []
        for score, label in zip(scores[0].tolist(), labels[0].tolist()):
            doc_id = self._label_to_id.get(label) if label >= 0 else None
            if doc_id is not None:
                hits.append((doc_id, float(score), label))
                if len(hits) == k:
                    break
        return hits

    def _search_params(self, selector: Any, fetch: int) -> Any:
        if isinstance(self.index_config, HNSWIndex):
            params = faiss.SearchParametersHNSW()
            params.efSearch = max(self.index_config.ef_search, fetch)
        elif selector is not None:
            params = faiss.SearchParameters()
        else:
            return None
        if selector is not None:
            params.sel = selector
        return params

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: MetadataFilter | None = None,  # noqa: A002
        **kwargs: Any,
    ) -> list[Document]:
        """Diverse results: fetch `fetch_k` by similarity, then pick `k` by maximal marginal relevance."""
        if k <= 0 or not self._records:
            return []
        vector = self._embedding.embed_query(query)
        return self.max_marginal_relevance_search_by_vector(vector, k, fetch_k, lambda_mult, filter=filter)

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: Sequence[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: MetadataFilter | None = None,  # noqa: A002
        **kwargs: Any,
    ) -> list[Document]:
        with self._lock:
            hits = self._search(embedding, max(k, fetch_k), filter)
            if not hits:
                return []
            vectors = self._index.reconstruct_batch(np.asarray([label for _, _, label in hits], dtype="int64"))
            query = as_matrix([embedding])
            faiss.normalize_L2(query)
            chosen = maximal_marginal_relevance(query[0], vectors, lambda_mult=lambda_mult, k=k)
            return [self._document(hits[i][0], self._records[hits[i][0]]) for i in chosen]

    # --- construction and persistence -----------------------------------------------------

    @classmethod
    def _for_texts(cls, embedding: Embeddings, *, index: IndexConfig | None = None, **kwargs: Any) -> FaissVectorStore:
        return cls(embedding, index=index)

    def save(self, directory: str | Path, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        """Write the store to `directory` (created if needed) atomically; see `retrievers.persistence`.

        Saves into one folder are serialized by a lock on it: a save waits up to
        `lock_timeout` seconds for another one to finish, then raises `IndexLockedError`.
        Call `retrievers.check_index_writable` first to fail before building a store.
        """
        with self._lock:
            manifest = {
                "created_by": "ragspec.retrievers",
                "embedding": {"id": embeddings_fingerprint(self._embedding), "dimension": self._dim},
                "index": asdict(self.index_config),
                "count": len(self._records),
            }
            docstore = {
                "next_label": self._next_label,
                "documents": [
                    {"id": doc_id, "label": rec.label, "text": rec.text, "metadata": rec.metadata}
                    for doc_id, rec in self._records.items()
                ],
            }
            if self.catalog is not None:
                manifest["ingest"] = self.catalog.manifest_part()
                docstore["ingest"] = self.catalog.docstore_part()
            try:
                write_store(Path(directory), manifest, self._index, docstore, lock_timeout=lock_timeout)
            except IndexSaveError as e:
                if isinstance(e.__cause__, (TypeError, ValueError)):
                    _check_json_metadata(self._records)  # name the document at fault
                raise

    @classmethod
    def load(cls, directory: str | Path, embeddings: Embeddings, *, check_embeddings: bool = True) -> FaissVectorStore:
        """Load a store saved by `save`.

        Raises:
            IndexNotFoundError: nothing saved there.
            IndexCorruptError: files missing, truncated, modified or inconsistent. A save
                committing while this loads is not corruption: the load then reads the new index.
            IndexVersionError: saved by a newer on-disk format.
            IndexMismatchError: saved with other embeddings than `embeddings` (skip this
                check with ``check_embeddings=False``; a dimension mismatch still fails).
        """
        saved = read_store(Path(directory))
        manifest, docstore = saved.manifest, saved.docstore
        try:
            recorded = manifest["embedding"]["id"]
            dim = manifest["embedding"]["dimension"]
            config = _config_from_dict(manifest["index"])
            next_label = int(docstore["next_label"])
            rows = [(str(r["id"]), int(r["label"]), str(r["text"]), dict(r["metadata"])) for r in docstore["documents"]]
            catalog = _catalog_from_saved(manifest, docstore)
        except (KeyError, TypeError, ValueError) as e:
            raise IndexCorruptError(f"the index in {directory} has malformed metadata ({e!r}); rebuild it") from e
        current = embeddings_fingerprint(embeddings)
        if check_embeddings and recorded != current:
            raise IndexMismatchError(
                f"the index in {directory} was built with embeddings {recorded!r} but {current!r} was given; "
                "load it with the same embedding model, or rebuild the index with the new one "
                "(or pass check_embeddings=False if they are in fact the same model)"
            )
        store = cls(embeddings, index=config)
        index = saved.index
        if index is not None:
            if not isinstance(index, faiss.IndexIDMap2):
                raise IndexCorruptError(
                    f"the FAISS index in {directory} is a {type(index).__name__}, not the IndexIDMap2 this store "
                    "writes; rebuild the index"
                )
            stored_labels = set(faiss.vector_to_array(index.id_map).tolist())
            if index.d != dim or any(label not in stored_labels for _, label, _, _ in rows):
                raise IndexCorruptError(
                    f"the FAISS index in {directory} does not match its docstore (dimension or ids differ); rebuild it"
                )
            store._index = index
            store._dim = int(dim)
        elif rows:
            raise IndexCorruptError(f"the index in {directory} lists documents but has no FAISS index; rebuild it")
        for doc_id, label, text, metadata in rows:
            store._records[doc_id] = _Record(label, text, metadata)
            store._label_to_id[label] = doc_id
        store._next_label = next_label
        store.catalog = catalog
        return store


def _catalog_from_saved(manifest: dict[str, Any], docstore: dict[str, Any]) -> Catalog | None:
    """The saved file catalog; None when there is none, or when it is of a newer version (which
    only `sync_index` needs, and refuses: searching does not)."""
    section = manifest.get("ingest")
    if section is None:
        return None
    if not isinstance(section, dict) or not isinstance(section.get("version"), int):
        raise ValueError("the ingest section has no version")
    if section["version"] > CATALOG_VERSION:
        return None
    return Catalog.from_saved(section, docstore["ingest"])


def _config_from_dict(data: dict[str, Any]) -> IndexConfig:
    kind = data.get("kind")
    if kind == "flat":
        return FlatIndex()
    if kind == "hnsw":
        return HNSWIndex(m=int(data["m"]), ef_construction=int(data["ef_construction"]), ef_search=int(data["ef_search"]))
    raise ValueError(f"unknown index kind {kind!r}")


def _check_json_metadata(records: dict[str, _Record]) -> None:
    import json

    for doc_id, rec in records.items():
        try:
            json.dumps(rec.metadata)
        except (TypeError, ValueError) as e:
            raise IndexSaveError(
                f"metadata of document {doc_id!r} cannot be saved as JSON ({e}); keep metadata to str, int, float, "
                "bool, None, lists and dicts with string keys"
            ) from e
