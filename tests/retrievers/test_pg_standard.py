"""LangChain's standard vector store suite on `PgVectorStore` (a real server, one fresh database per test), unchanged."""

from __future__ import annotations

from collections.abc import Generator

import pytest
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

from retrievers.pg_store import PgVectorStore  # noqa: E402


class TestPgVectorStoreStandard(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self, pg_url: str) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        store = PgVectorStore(pg_url, self.get_embeddings())
        try:
            yield store
        finally:
            store.close()
