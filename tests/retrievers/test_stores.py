"""Stores by name: a folder stays a FAISS index, a ``postgresql://`` URL is a collection; URLs print without passwords."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

from retrievers import FaissVectorStore, HybridRetriever
from retrievers.store_url import is_database_url, safe_label
from retrievers.stores import open_hybrid_retriever


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("postgresql://rag:s3cret@db:5432/rag", "collection 'default' at postgresql://rag@db:5432/rag"),
        ("postgres://rag@db/rag?sslmode=require", "collection 'default' at postgres://rag@db/rag?sslmode=require"),
        ("postgresql://db/rag", "collection 'default' at postgresql://db/rag"),
        ("ragspec-index", "ragspec-index"),
    ],
)
def test_labels_never_show_a_password(target: str, expected: str) -> None:
    assert safe_label(target) == expected
    assert is_database_url(target) == target.startswith("postgres")


def test_a_folder_keeps_meaning_a_faiss_index(tmp_path: Path) -> None:
    embeddings = DeterministicFakeEmbedding(size=8)
    store = FaissVectorStore(embeddings)
    store.add_documents([Document(id="a", page_content="the harbour ferry", metadata={"source": "a.md"})])
    store.save(tmp_path / "idx")
    retriever = open_hybrid_retriever(str(tmp_path / "idx"), embeddings, k=1)
    assert isinstance(retriever, HybridRetriever) and [d.id for d in retriever.invoke("ferry")] == ["a"]
    with pytest.raises(ValueError, match="drop --collection"):
        open_hybrid_retriever(str(tmp_path / "idx"), embeddings, collection="x")
