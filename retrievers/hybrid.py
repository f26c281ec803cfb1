"""Hybrid retrieval: dense (FAISS) and BM25 results fused by their normalized scores (or by rank), optionally reranked."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore
from pydantic import Field, PrivateAttr, model_validator

from retrievers.bm25 import BM25Retriever
from retrievers.rerank import Reranker
from retrievers.types import MetadataFilter, ScoredDocument, ScoredRetriever, check_filter

__all__ = ["HybridRetriever", "reciprocal_rank_fusion", "relative_score_fusion"]


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int = 60, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Fuse rankings of keys: score(key) = sum over rankings of weight / (k + rank), rank from 1.

    Returns (key, score) pairs by descending score; ties go to the key seen first. A key
    repeated within one ranking counts at its best rank only.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"got {len(weights)} weights for {len(rankings)} rankings")
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[str] = set()
        for rank, key in enumerate(ranking, start=1):
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    order = {key: i for i, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))


def relative_score_fusion(
    results: Sequence[Sequence[tuple[str, float]]], weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Fuse scored results: score(key) = sum over results of weight * min-max normalized score.

    Within each result list the scores are rescaled to [0, 1] (the best 1, the worst 0; all
    1 when they are equal), and a key missing from a list gets 0 from it. Unlike rank
    fusion, a clear winner on one side stays ahead of a near-tie on the other.
    Returns (key, score) pairs by descending score; ties go to the key seen first. A key
    repeated within one list counts at its best score.
    """
    weights = [1.0] * len(results) if weights is None else list(weights)
    if len(weights) != len(results):
        raise ValueError(f"got {len(weights)} weights for {len(results)} result lists")
    scores: dict[str, float] = {}
    for result, weight in zip(results, weights):
        best: dict[str, float] = {}
        for key, score in result:
            best[key] = max(best.get(key, score), score)
        for key in best:
            scores.setdefault(key, 0.0)
        if not best:
            continue
        low, high = min(best.values()), max(best.values())
        for key, score in best.items():
            scores[key] += weight * ((score - low) / (high - low) if high > low else 1.0)
    order = {key: i for i, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))


def _key(document: Document) -> str:
    """Identity of a chunk across retrievers: its id, else a hash of its source and text."""
    if document.id:
        return document.id
    raw = f"{document.metadata.get('source', '')}\x00{document.page_content}"
    return "content:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()


class HybridRetriever(ScoredRetriever):
    """Dense + BM25 retrieval, fused by normalized scores (or by rank), with an optional reranker.

    Build it from the chunks and the vector store holding them:
    ``HybridRetriever(vectorstore=store, documents=chunks, k=4)``; without `documents`
    the BM25 index is built from every document in a `FaissVectorStore`. The BM25 side is
    fixed at construction: build a new retriever after changing the store.
    """

    vectorstore: VectorStore
    """Dense side; searched with `similarity_search_with_relevance_scores(query, k=fetch_k, filter=...)`
    (`similarity_search` for ``fusion="rrf"``)."""
    documents: list[Document] | None = None
    """Documents for the BM25 side (default: all documents of a `FaissVectorStore`)."""
    k: int = Field(default=4, ge=1)
    """Number of documents returned (overridable per call: ``invoke(q, k=8)``)."""
    fetch_k: int = Field(default=20, ge=1)
    """Candidates taken from each side before fusion (at least k are taken)."""
    fusion: Literal["relative_score", "rrf"] = "relative_score"
    """How the two sides combine: `relative_score_fusion` of their scores (default), or
    `reciprocal_rank_fusion` of their ranks."""
    rrf_k: int = Field(default=60, ge=0)
    """RRF constant (``fusion="rrf"``): larger values flatten the advantage of top ranks."""
    dense_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the dense ranking in the fusion."""
    bm25_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the BM25 ranking in the fusion."""
    reranker: Any = None
    """Optional `Reranker` (e.g. `CrossEncoderReranker`) that reorders the fused candidates."""
    rerank_candidates: int = Field(default=20, ge=1)
    """How many fused candidates the reranker scores."""

    _bm25: BM25Retriever = PrivateAttr()

    @model_validator(mode="after")
    def _check(self) -> HybridRetriever:
        if self.reranker is not None and not isinstance(self.reranker, Reranker):
            raise TypeError(
                f"reranker must have a score(query, passages) -> list[float] method, got {type(self.reranker).__name__}"
            )
        if self.documents is None and not hasattr(self.vectorstore, "documents"):
            raise ValueError(
                f"{type(self.vectorstore).__name__} cannot list its documents; pass documents=<the chunks> for BM25"
            )
        return self

    def model_post_init(self, context: Any, /) -> None:
        documents = self.documents if self.documents is not None else self.vectorstore.documents()  # type: ignore[attr-defined]
        self._bm25 = BM25Retriever(documents=list(documents))

    @property
    def bm25(self) -> BM25Retriever:
        """The BM25 side."""
        return self._bm25

    def search(self, query: str, k: int | None = None, filter: MetadataFilter | None = None) -> list[ScoredDocument]:  # noqa: A002
        """Top-k fused documents with their RRF score (or reranker score when a reranker is set)."""
        check_filter(filter)
        k = self.k if k is None else k
        if k <= 0:
            return []
        fetch = max(self.fetch_k, k)
        dense = self._dense(query, fetch, filter)
        lexical = [(hit.document, hit.score) for hit in self._bm25.search(query, k=fetch, filter=filter)]
        by_key: dict[str, Document] = {}
        for doc, _ in (*dense, *lexical):
            by_key.setdefault(_key(doc), doc)
        weights = [self.dense_weight, self.bm25_weight]
        if self.fusion == "rrf":
            fused = reciprocal_rank_fusion([[_key(d) for d, _ in side] for side in (dense, lexical)], k=self.rrf_k, weights=weights)
        else:
            fused = relative_score_fusion([[(_key(d), s) for d, s in side] for side in (dense, lexical)], weights=weights)
        hits = [ScoredDocument(by_key[key], score) for key, score in fused]
        if self.reranker is not None and hits:
            hits = self._rerank(query, hits[: max(self.rerank_candidates, k)])
        return hits[:k]

    def _dense(self, query: str, fetch: int, filter: MetadataFilter | None) -> list[tuple[Document, float]]:  # noqa: A002
        """The dense side's candidates, best first, with relevance scores (none are needed for RRF)."""
        if self.fusion == "rrf":
            return [(doc, 0.0) for doc in self.vectorstore.similarity_search(query, k=fetch, filter=filter)]
        try:
            return self.vectorstore.similarity_search_with_relevance_scores(query, k=fetch, filter=filter)
        except NotImplementedError as e:
            raise TypeError(
                f"{type(self.vectorstore).__name__} gives no relevance scores for score fusion; "
                "pass fusion='rrf' to fuse by rank"
            ) from e

    def _rerank(self, query: str, hits: list[ScoredDocument]) -> list[ScoredDocument]:
        scores = list(self.reranker.score(query, [h.document.page_content for h in hits]))
        if len(scores) != len(hits):
            raise ValueError(f"reranker returned {len(scores)} scores for {len(hits)} passages")
        # Stable: equal reranker scores keep the fused order.
        order = sorted(range(len(hits)), key=lambda i: -scores[i])
        return [ScoredDocument(hits[i].document, float(scores[i])) for i in order]
