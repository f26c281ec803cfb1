"""Recall parity: hybrid search inside PostgreSQL (pgvector HNSW + BM25 on full-text search) against the FAISS
hybrid (FAISS + bm25s) on the 39 bundled questions, the same chunks and the same vectors of the default model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrievers import FaissVectorStore, HybridRetriever, default_embeddings, embed_chunks, load_documents, split_documents

pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

from retrievers.pg_retriever import PgHybridRetriever  # noqa: E402
from retrievers.pg_store import PgVectorStore  # noqa: E402

TOP_K = 10


def recall(search, questions: list[dict]) -> tuple[float, float]:
    """r@1 and r@5: the share of questions whose first relevant chunk (its file, holding the answer's span) ranks there."""
    ranks = []
    for q in questions:
        found = search(q["question"])
        ranks.append(next((i for i, c in enumerate(found, 1) if Path(c.metadata["source"]).name == q["source"]
                           and q["span"] in c.page_content), TOP_K + 1))  # fmt: skip
    return sum(r == 1 for r in ranks) / len(ranks), sum(r <= 5 for r in ranks) / len(ranks)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_hybrid_recall_in_postgresql_equals_the_faiss_hybrid(corpus_dir: Path, questions_path: Path, pg_url: str) -> None:
    questions = json.loads(questions_path.read_text(encoding="utf-8"))["questions"]
    assert len(questions) == 39
    chunks = split_documents(load_documents(corpus_dir).documents)
    embeddings = default_embeddings()
    vectors = embed_chunks(embeddings, chunks)
    texts, metadatas, ids = [c.page_content for c in chunks], [c.metadata for c in chunks], [str(c.id) for c in chunks]
    faiss_store = FaissVectorStore(embeddings)
    faiss_store.add_embeddings(texts, vectors, metadatas, ids)
    pg_store = PgVectorStore(pg_url, embeddings)
    pg_store.add_embeddings(texts, vectors, metadatas, ids)
    faiss_hybrid = HybridRetriever(vectorstore=faiss_store, documents=chunks, k=TOP_K)
    pg_hybrid = PgHybridRetriever(store=pg_store, k=TOP_K)
    faiss_r1, faiss_r5 = recall(faiss_hybrid.invoke, questions)
    pg_r1, pg_r5 = recall(pg_hybrid.invoke, questions)
    print(f"r@1 FAISS {faiss_r1:.3f} PostgreSQL {pg_r1:.3f}; r@5 FAISS {faiss_r5:.3f} PostgreSQL {pg_r5:.3f}")
    assert abs(pg_r1 - faiss_r1) <= 0.02 + 1e-9 and abs(pg_r5 - faiss_r5) <= 0.02 + 1e-9
    assert faiss_r5 >= 0.8  # the comparison is between two working retrievers
    pg_store.close()
