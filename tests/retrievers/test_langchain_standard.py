"""LangChain's own standard test suites, subclassed unchanged (nothing overridden, skipped or xfailed)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests, VectorStoreIntegrationTests

from retrievers import BM25Retriever, FaissVectorStore, HNSWIndex, HybridRetriever

CORPUS = [
    Document(id=f"c{i}", page_content=text, metadata={"i": i})
    for i, text in enumerate(
        [
            "Keepers refill the lighthouse lamp with oil every evening.",
            "A lighthouse guides boats into the harbour during a storm.",
            "The storm track rises each round of the lighthouse game.",
            "Rye bread keeps fresh longer than wheat bread.",
            "Group commit shares one fsync among many transactions.",
        ]
    )
]


class TestFaissVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        store = FaissVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.delete(None)


class TestFaissHNSWVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        store = FaissVectorStore(self.get_embeddings(), index=HNSWIndex(m=8, ef_construction=32, ef_search=16))
        try:
            yield store
        finally:
            store.delete(None)


class TestBM25RetrieverStandard(RetrieversIntegrationTests):
    # The suite's properties, overridden by plain values where they are constants.
    retriever_constructor = BM25Retriever
    retriever_constructor_params = {"documents": CORPUS}
    retriever_query_example = "lighthouse storm"


class TestHybridRetrieverStandard(RetrieversIntegrationTests):
    retriever_constructor = HybridRetriever
    retriever_query_example = "lighthouse storm"

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        store = FaissVectorStore(DeterministicFakeEmbedding(size=16))
        store.add_documents(CORPUS)
        return {"vectorstore": store, "documents": CORPUS}
