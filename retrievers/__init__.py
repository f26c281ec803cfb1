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

__all__ = [
    "BACKENDS",
    "DEFAULT_INCLUDE",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MODEL_ID",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "BM25Retriever",
    "ChunkingSettings",
    "CrossEncoderReranker",
    "DimensionMismatchError",
    "EmbeddingModelError",
    "FaissVectorStore",
    "FileNote",
    "FileSkippedError",
    "FilterError",
    "FlatIndex",
    "HNSWIndex",
    "HybridRetriever",
    "IndexConfig",
    "IndexCorruptError",
    "IndexLoadError",
    "IndexLockedError",
    "IndexMismatchError",
    "IndexNotFoundError",
    "IndexSaveError",
    "IndexVersionError",
    "LoadResult",
    "MetadataFilter",
    "NothingToIndexError",
    "Reranker",
    "RetrieverError",
    "ScoredDocument",
    "SentenceTransformerEmbeddings",
    "SkippedFile",
    "SkippedFileWarning",
    "SyncProgress",
    "SyncReport",
    "check_index_writable",
    "chunk_header",
    "chunk_id",
    "contextual_text",
    "default_embeddings",
    "default_max_tokens",
    "default_model_path",
    "default_token_length",
    "embed_chunks",
    "embeddings_fingerprint",
    "load_documents",
    "load_file",
    "reciprocal_rank_fusion",
    "relative_score_fusion",
    "split_documents",
    "sync_index",
]
