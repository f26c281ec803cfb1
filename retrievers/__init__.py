"""Document ingestion and retrieval for ragspec: loaders, chunking, embeddings, FAISS, BM25, hybrid fusion.

Typical use::

    from retrievers import load_documents, split_documents, default_embeddings, FaissVectorStore, HybridRetriever

    loaded = load_documents("docs/", exclude=["drafts"])
    chunks = split_documents(loaded.documents)
    store = FaissVectorStore(default_embeddings())
    store.add_documents(chunks)
    store.save("index/")
    retriever = HybridRetriever(vectorstore=store, documents=chunks, k=4)
    passages = retriever.invoke("How do I restore a snapshot?")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retrievers.lazy import lazy_names

_LAZY = {
    "BM25Retriever": "retrievers.bm25",
    "HEADER_KEY": "retrievers.chunking",
    "chunk_header": "retrievers.chunking",
    "chunk_id": "retrievers.chunking",
    "contextual_text": "retrievers.chunking",
    "default_max_tokens": "retrievers.chunking",
    "default_token_length": "retrievers.chunking",
    "split_documents": "retrievers.chunking",
    "BACKENDS": "retrievers.embeddings",
    "DEFAULT_MODEL_ID": "retrievers.embeddings",
    "SentenceTransformerEmbeddings": "retrievers.embeddings",
    "default_embeddings": "retrievers.embeddings",
    "default_model_path": "retrievers.embeddings",
    "embed_chunks": "retrievers.embeddings",
    "embeddings_fingerprint": "retrievers.embeddings",
    "DimensionMismatchError": "retrievers.errors",
    "EmbeddingModelError": "retrievers.errors",
    "FileSkippedError": "retrievers.errors",
    "FilterError": "retrievers.errors",
    "IndexCorruptError": "retrievers.errors",
    "IndexLoadError": "retrievers.errors",
    "IndexLockedError": "retrievers.errors",
    "IndexMismatchError": "retrievers.errors",
    "IndexNotFoundError": "retrievers.errors",
    "IndexSaveError": "retrievers.errors",
    "IndexVersionError": "retrievers.errors",
    "NothingToIndexError": "retrievers.errors",
    "RetrieverError": "retrievers.errors",
    "MissingExtraError": "retrievers.extras",
    "FaissVectorStore": "retrievers.faiss_store",
    "FlatIndex": "retrievers.faiss_store",
    "HNSWIndex": "retrievers.faiss_store",
    "IndexConfig": "retrievers.faiss_store",
    "HybridRetriever": "retrievers.hybrid",
    "reciprocal_rank_fusion": "retrievers.hybrid",
    "relative_score_fusion": "retrievers.hybrid",
    "ChunkingSettings": "retrievers.ingest",
    "SyncProgress": "retrievers.ingest",
    "SyncReport": "retrievers.ingest",
    "sync_index": "retrievers.ingest",
    "DEFAULT_INCLUDE": "retrievers.loaders",
    "DEFAULT_MAX_FILE_BYTES": "retrievers.loaders",
    "FileNote": "retrievers.loaders",
    "LoadResult": "retrievers.loaders",
    "SkippedFile": "retrievers.loaders",
    "SkippedFileWarning": "retrievers.loaders",
    "load_documents": "retrievers.loaders",
    "load_file": "retrievers.loaders",
    "FORMAT_VERSION": "retrievers.persistence",
    "check_index_writable": "retrievers.persistence",
    "CrossEncoderReranker": "retrievers.rerank",
    "Reranker": "retrievers.rerank",
    "MetadataFilter": "retrievers.types",
    "ScoredDocument": "retrievers.types",
}
"""Where each public name lives. They are imported on first use, so ``import retrievers`` (and the
core's use of its light modules) needs none of the ``retrieval`` extra's packages; the modules that
do raise `MissingExtraError` naming the extra when they are imported without it."""

if TYPE_CHECKING:
    from retrievers.bm25 import BM25Retriever
    from retrievers.chunking import (
        HEADER_KEY,
        chunk_header,
        chunk_id,
        contextual_text,
        default_max_tokens,
        default_token_length,
        split_documents,
    )
    from retrievers.embeddings import (
        BACKENDS,
        DEFAULT_MODEL_ID,
        SentenceTransformerEmbeddings,
        default_embeddings,
        default_model_path,
        embed_chunks,
        embeddings_fingerprint,
    )
    from retrievers.errors import (
        DimensionMismatchError,
        EmbeddingModelError,
        FileSkippedError,
        FilterError,
        IndexCorruptError,
        IndexLoadError,
        IndexLockedError,
        IndexMismatchError,
        IndexNotFoundError,
        IndexSaveError,
        IndexVersionError,
        NothingToIndexError,
        RetrieverError,
    )
    from retrievers.faiss_store import FaissVectorStore, FlatIndex, HNSWIndex, IndexConfig
    from retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion, relative_score_fusion
    from retrievers.ingest import ChunkingSettings, SyncProgress, SyncReport, sync_index
    from retrievers.loaders import (
        DEFAULT_INCLUDE,
        DEFAULT_MAX_FILE_BYTES,
        FileNote,
        LoadResult,
        SkippedFile,
        SkippedFileWarning,
        load_documents,
        load_file,
    )
    from retrievers.persistence import FORMAT_VERSION, check_index_writable
    from retrievers.rerank import CrossEncoderReranker, Reranker
    from retrievers.types import MetadataFilter, ScoredDocument
    from retrievers.extras import MissingExtraError

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
