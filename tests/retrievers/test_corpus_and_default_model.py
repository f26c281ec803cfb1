"""The bundled corpus and question set, and the real default embedding model (integration)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retrievers import (
    DEFAULT_MODEL_ID,
    EmbeddingModelError,
    FaissVectorStore,
    HybridRetriever,
    SentenceTransformerEmbeddings,
    default_embeddings,
    load_documents,
    split_documents,
)


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path):
    result = load_documents(corpus_dir)
    return result, split_documents(result.documents)


@pytest.fixture(scope="module")
def questions(questions_path: Path) -> list[dict]:
    return json.loads(questions_path.read_text(encoding="utf-8"))["questions"]


def relevant(chunk, question: dict) -> bool:
    return Path(chunk.metadata["source"]).name == question["source"] and question["span"] in chunk.page_content


def test_corpus_documents_are_real_length_and_load_cleanly(corpus) -> None:
    result, _ = corpus
    assert result.skipped == []
    assert {d.metadata["file_type"] for d in result.documents} == {"md", "html", "txt"}
    assert 4 <= len(result.documents) <= 6
    for doc in result.documents:
        assert 600 <= len(doc.page_content.split()) <= 1500, doc.metadata["source"]


def test_every_question_is_answerable_from_one_chunk(corpus, questions) -> None:
    result, chunks = corpus
    assert len(questions) >= 30 and len({q["id"] for q in questions}) == len(questions)
    assert {q["kind"] for q in questions} == {"extractive", "explanatory"}
    texts = {Path(d.metadata["source"]).name: d.page_content for d in result.documents}
    for q in questions:
        assert q["question"].strip() and q["answer"].strip()
        assert q["span"] in texts[q["source"]], q["id"]
        assert any(relevant(c, q) for c in chunks), q["id"]


def test_unknown_model_fails_offline_with_a_fix() -> None:
    with pytest.raises(EmbeddingModelError, match="local model directory") as info:
        SentenceTransformerEmbeddings("no-such-org/no-such-model").embed_query("x")
    assert info.value.__cause__ is not None


@pytest.mark.integration
def test_default_embeddings_are_normalized_cached_and_semantic() -> None:
    emb = default_embeddings()
    assert emb.model_id == DEFAULT_MODEL_ID
    vectors = np.array(emb.embed_documents(["The cat sat on the mat.", "A kitten rested on the rug.", "Tax law in 1850."]))
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert SentenceTransformerEmbeddings("default", batch_size=4).client is emb.client  # one model per process
    np.testing.assert_allclose(emb.embed_query("The cat sat on the mat."), vectors[0], atol=1e-5)


@pytest.mark.integration
def test_hybrid_retrieval_on_the_bundled_corpus(corpus, questions, tmp_path: Path) -> None:
    _, chunks = corpus
    store = FaissVectorStore(default_embeddings())
    store.add_documents(chunks)
    store.save(tmp_path / "index")
    store = FaissVectorStore.load(tmp_path / "index", default_embeddings())
    hybrid = HybridRetriever(vectorstore=store, k=5)
    hit_at_5 = sum(any(relevant(c, q) for c in hybrid.invoke(q["question"])) for q in questions)
    assert hit_at_5 / len(questions) >= 0.9
    first = hybrid.invoke("How many players can play Harbour Lights?", k=1)[0]
    assert first.metadata["title"] == "Harbour Lights: Rules of Play" and first.metadata["start_index"] >= 0
