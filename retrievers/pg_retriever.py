"""The hybrid retriever over `PgVectorStore`: dense and BM25 inside PostgreSQL, fused as `HybridRetriever` fuses them."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from retrievers.pg_store import PgVectorStore
from retrievers.types import MetadataFilter, ScoredDocument, ScoredRetriever

__all__ = ["PgHybridRetriever"]


class PgHybridRetriever(ScoredRetriever):
    """`HybridRetriever`'s settings over a `PgVectorStore`: nothing is held in this process, so it
    sees every write to the collection at once (no rebuild), and app replicas share it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    store: PgVectorStore
    """The collection searched."""
    k: int = Field(default=4, ge=1)
    """Number of documents returned (overridable per call: ``invoke(q, k=8)``)."""
    fetch_k: int = Field(default=20, ge=1)
    """Candidates taken from each side before fusion (at least k are taken)."""
    fusion: Literal["relative_score", "rrf"] = "relative_score"
    """`relative_score_fusion` of the two sides' scores (default) or `reciprocal_rank_fusion` of their ranks."""
    rrf_k: int = Field(default=60, ge=0)
    """RRF constant (``fusion="rrf"``)."""
    dense_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the dense side in the fusion."""
    bm25_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the keyword (BM25) side in the fusion."""

    def search(self, query: str, k: int | None = None, filter: MetadataFilter | None = None) -> list[ScoredDocument]:  # noqa: A002
        """Top-k fused documents with their fused score."""
        return self.store.hybrid_search(
            query, self.k if k is None else k, filter, fetch_k=self.fetch_k, fusion=self.fusion, rrf_k=self.rrf_k,
            dense_weight=self.dense_weight, keyword_weight=self.bm25_weight,
        )  # fmt: skip
