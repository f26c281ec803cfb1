"""Lexical retrieval: a LangChain `BaseRetriever` over bm25s (Okapi BM25, Lucene variant)."""

from __future__ import annotations

from typing import Any

import numpy as np
from langchain_core.documents import Document
from pydantic import Field, PrivateAttr

from retrievers.chunking import contextual_text
from retrievers.types import MetadataFilter, ScoredDocument, ScoredRetriever, check_filter, matches_filter
from retrievers.extras import needs

with needs("retrieval", "BM25Retriever"):
    import bm25s

__all__ = ["BM25Retriever"]


class BM25Retriever(ScoredRetriever):
    """BM25 over a fixed list of documents (usually the chunks from `split_documents`).

    Each document is indexed by its `contextual_text`: a chunk's header (its document's
    title, from `split_documents`) and its text, so a query naming the document matches
    every chunk of it. Only documents sharing at least one non-stopword token with the
    query are returned, so a query can get fewer than `k` results.
    """

    documents: list[Document]
    """The documents to search; the index is built when the retriever is created."""
    k: int = Field(default=4, ge=1)
    """Number of documents returned (overridable per call: ``invoke(q, k=8)``)."""
    k1: float = Field(default=1.5, ge=0.0)
    """BM25 term-frequency saturation."""
    b: float = Field(default=0.75, ge=0.0, le=1.0)
    """BM25 document-length normalization."""
    stopwords: str | list[str] = "en"
    """Stopwords removed from documents and queries: a bm25s language code or a list of words."""

    _bm25: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        corpus = self._tokenize([contextual_text(d) for d in self.documents]) if self.documents else []
        if any(corpus):  # documents of stopwords and one-letter words only leave nothing to index
            self._bm25.index(corpus, show_progress=False)

    @classmethod
    def from_documents(cls, documents: list[Document], **kwargs: Any) -> BM25Retriever:
        return cls(documents=list(documents), **kwargs)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(texts, lower=True, stopwords=self.stopwords, return_ids=False, show_progress=False)

    def search(self, query: str, k: int | None = None, filter: MetadataFilter | None = None) -> list[ScoredDocument]:  # noqa: A002
        """Top-k documents with their BM25 scores (only scores > 0)."""
        check_filter(filter)
        k = self.k if k is None else k
        if k <= 0 or not self.documents:
            return []
        vocabulary = getattr(self._bm25, "vocab_dict", None) or {}
        tokens = [t for t in self._tokenize([query])[0] if t in vocabulary]
        if not tokens:
            return []
        scores = np.asarray(self._bm25.get_scores(tokens), dtype="float64")
        if filter is not None:
            mask = np.fromiter((matches_filter(d.metadata, filter) for d in self.documents), bool, len(self.documents))
            scores = np.where(mask, scores, 0.0)
        positive = np.flatnonzero(scores > 0)
        # Highest score first; equal scores keep document order (stable sort on -score).
        order = positive[np.argsort(-scores[positive], kind="stable")][:k]
        return [ScoredDocument(self.documents[i], float(scores[i])) for i in order]
