"""BM25 against a hand-written BM25, contextual headers, rank and score fusion against brute force, hybrid retrieval, reranking."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import VectorStore
from pydantic import ValidationError

from retrievers import (
    HEADER_KEY,
    BM25Retriever,
    CrossEncoderReranker,
    EmbeddingModelError,
    FaissVectorStore,
    HybridRetriever,
    contextual_text,
    default_model_path,
    reciprocal_rank_fusion,
    relative_score_fusion,
    split_documents,
)

DOCS = [
    Document(id="d0", page_content="The lighthouse keeper trims the lamp wick every evening.", metadata={"topic": "sea"}),
    Document(id="d1", page_content="Boats return to the harbour when the lamp of the lighthouse is lit.", metadata={"topic": "sea"}),
    Document(id="d2", page_content="Sourdough bread needs a lively starter and a long, slow rise.", metadata={"topic": "bread"}),
    Document(id="d3", page_content="Rye bread is denser than wheat bread; rye holds more water.", metadata={"topic": "bread"}),
    Document(id="d4", page_content="A write-ahead log makes every commit durable before the data pages change.", metadata={"topic": "db"}),
    Document(id="d5", page_content="Checkpoints bound the amount of log replayed during crash recovery.", metadata={"topic": "db"}),
]


def reference_bm25(docs: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Lucene BM25 by hand: idf = ln(1 + (N - df + .5) / (df + .5)) times tf / (tf + k1 (1 - b + b dl / avgdl)).

    (Lucene, and so bm25s's "lucene" method, drops the constant (k1 + 1) factor of the textbook formula.)
    """
    tokenized = bm25s.tokenize(docs, stopwords="en", return_ids=False, show_progress=False)
    query_tokens = set(bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0])
    n = len(docs)
    avgdl = sum(len(t) for t in tokenized) / n
    scores = np.zeros(n)
    for term in query_tokens:
        df = sum(term in t for t in tokenized)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, toks in enumerate(tokenized):
            tf = toks.count(term)
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(toks) / avgdl)) if tf else 0.0
    return scores


@pytest.mark.parametrize("query", ["lighthouse lamp", "rye bread water", "commit log recovery", "bread"])
def test_bm25_scores_match_reference(query: str) -> None:
    retriever = BM25Retriever(documents=DOCS, k=len(DOCS))
    expected = reference_bm25([d.page_content for d in DOCS], query)
    hits = retriever.search(query)
    assert [h.document.id for h in hits] == [DOCS[i].id for i in np.argsort(-expected, kind="stable") if expected[i] > 0]
    np.testing.assert_allclose([h.score for h in hits], sorted(expected[expected > 0], reverse=True), rtol=1e-4)


def test_bm25_k_filter_and_no_match() -> None:
    retriever = BM25Retriever(documents=DOCS, k=1)
    assert [d.id for d in retriever.invoke("bread")] == ["d3"]  # "bread" twice in d3
    assert len(retriever.invoke("bread lamp log", k=3)) == 3
    assert [d.id for d in retriever.invoke("lamp bread", k=5, filter={"topic": "bread"})] == ["d3", "d2"]
    assert retriever.invoke("zebra quantum") == [] and retriever.invoke("the and of") == []
    assert BM25Retriever(documents=[]).invoke("anything") == []
    with pytest.raises(ValidationError):
        BM25Retriever(documents=DOCS, k=0)


def test_reciprocal_rank_fusion_by_hand() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=10))
    assert fused == pytest.approx({"a": 1 / 11 + 1 / 12, "b": 1 / 12, "c": 1 / 13 + 1 / 11, "d": 1 / 13})
    assert [key for key, _ in reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=10)] == ["a", "c", "b", "d"]
    weighted = reciprocal_rank_fusion([["x", "y"], ["y", "x"]], k=0, weights=[3.0, 1.0])
    assert weighted == [("x", 3.0 + 0.5), ("y", 1.5 + 1.0)]
    assert reciprocal_rank_fusion([["a", "a", "b"]], k=0) == [("a", 1.0), ("b", 1 / 3)]  # repeats count once
    assert reciprocal_rank_fusion([["p", "q"], ["q", "p"]], k=5)[0][0] == "p"  # a tie keeps first-seen order
    with pytest.raises(ValueError, match="weights"):
        reciprocal_rank_fusion([["a"]], weights=[1.0, 2.0])


class ListStore(VectorStore):
    """A stub dense side returning a fixed ranking, to check the fusion exactly."""

    def __init__(self, ranking: list[Document]) -> None:
        self.ranking = ranking
        self.calls: list[dict[str, Any]] = []

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        self.calls.append({"k": k, **kwargs})
        return self.ranking[:k]

    @classmethod
    def from_texts(cls, texts, embedding, metadatas=None, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError


def test_hybrid_equals_rrf_of_both_sides() -> None:
    dense = [DOCS[5], DOCS[2], DOCS[0]]
    store = ListStore(dense)
    hybrid = HybridRetriever(vectorstore=store, documents=DOCS, k=4, fetch_k=3, fusion="rrf", rrf_k=60)
    query = "lighthouse lamp"
    lexical = [h.document.id for h in hybrid.bm25.search(query, k=3)]
    expected = reciprocal_rank_fusion([[d.id for d in dense], lexical], k=60)[:4]
    hits = hybrid.search(query)
    assert [(h.document.id, h.score) for h in hits] == expected
    assert "d1" in [h.document.id for h in hits]  # found by BM25 only
    hybrid.invoke(query, k=2, filter={"topic": "sea"})
    assert store.calls[-1] == {"k": 3, "filter": {"topic": "sea"}}
    assert len(hybrid.invoke(query, k=2)) == 2


def test_hybrid_defaults_to_the_store_documents_and_filters_both_sides() -> None:
    store = FaissVectorStore(DeterministicFakeEmbedding(size=12))
    store.add_documents(DOCS)
    hybrid = HybridRetriever(vectorstore=store, k=6)
    assert {d.id for d in hybrid.bm25.documents} == {d.id for d in DOCS}
    got = hybrid.invoke("bread", filter={"topic": "db"})
    assert {d.id for d in got} == {"d4", "d5"}
    exact = hybrid.invoke("Checkpoints bound the amount of log replayed during crash recovery.", k=1)
    assert [d.id for d in exact] == ["d5"]  # first on both sides


def test_score_fusion_needs_scores_from_the_dense_side() -> None:
    with pytest.raises(TypeError, match="fusion='rrf'"):
        HybridRetriever(vectorstore=ListStore(DOCS), documents=DOCS).invoke("bread")
    with pytest.raises(ValidationError):
        HybridRetriever(vectorstore=ListStore(DOCS), documents=DOCS, fusion="max")


def test_bm25_indexes_the_header_but_returns_the_chunk_text() -> None:
    doc = Document(page_content="Each segment file holds 64 MiB of records.", metadata={"source": "ledgerline-note.txt"})
    other = Document(page_content="Segment files of the tidepool cache are small.", metadata={"source": "tidepool.md"})
    chunks = split_documents([doc, other], chunk_size=64, chunk_overlap=0)
    hits = BM25Retriever(documents=chunks).search("ledgerline segment size")
    assert [h.document.page_content for h in hits][0] == doc.page_content  # found by its header's word
    assert hits[0].document.metadata[HEADER_KEY] == "ledgerline note"
    bare = split_documents([doc, other], chunk_size=64, chunk_overlap=0, headers=False)
    assert [h.document.metadata["source"] for h in BM25Retriever(documents=bare).search("ledgerline")] == []
    # The index holds exactly the contextual texts: scores equal the hand-written BM25 over them.
    expected = reference_bm25([contextual_text(c) for c in chunks], "ledgerline segment size")
    np.testing.assert_allclose(sorted((h.score for h in hits), reverse=True), sorted(expected[expected > 0], reverse=True), rtol=1e-4)


def test_relative_score_fusion_by_hand() -> None:
    fused = relative_score_fusion([[("a", 0.9), ("b", 0.5), ("c", 0.1)], [("c", 12.0), ("d", 2.0)]])
    assert dict(fused) == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.0 + 1.0, "d": 0.0})
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]  # a tie keeps first-seen order
    weighted = relative_score_fusion([[("x", 3.0), ("y", 1.0)], [("y", 5.0), ("x", 4.0)]], weights=[1.0, 3.0])
    assert weighted == [("y", 3.0), ("x", 1.0)]
    assert relative_score_fusion([[("a", 2.0), ("a", 5.0), ("b", 3.0)]]) == [("a", 1.0), ("b", 0.0)]  # best score counts
    assert relative_score_fusion([[("p", 0.4)], []]) == [("p", 1.0)]  # one candidate, or equal scores: all 1
    with pytest.raises(ValueError, match="weights"):
        relative_score_fusion([[("a", 1.0)]], weights=[1.0, 2.0])


def brute_force_fusion(results: list[list[tuple[str, float]]], weights: list[float]) -> list[tuple[str, float]]:
    """The definition, computed on a dense [lists, keys] matrix: min-max per row over present keys, absent = 0."""
    keys = list(dict.fromkeys(k for result in results for k, _ in result))
    if not keys:
        return []
    best = np.full((len(results), len(keys)), -np.inf)
    for r, result in enumerate(results):
        for key, score in result:
            best[r, keys.index(key)] = max(best[r, keys.index(key)], score)
    present = np.isfinite(best)
    low = np.where(present, best, np.inf).min(axis=1, keepdims=True)
    high = np.where(present, best, -np.inf).max(axis=1, keepdims=True)
    span = np.where(high > low, high - low, 1.0)
    norm = np.where(present, np.where(high > low, (best - low) / span, 1.0), 0.0)
    total = (np.asarray(weights)[:, None] * norm).sum(axis=0)
    order = np.lexsort((np.arange(len(keys)), -total))  # by score, then first seen
    return [(keys[i], float(total[i])) for i in order]


scored_lists = st.lists(
    st.lists(st.tuples(st.sampled_from("abcdefghijk"), st.sampled_from([-1.5, 0.0, 0.25, 0.3, 1.0, 7.0, 7.0, 40.0])), max_size=9),
    min_size=1, max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(results=scored_lists, data=st.data())
def test_relative_score_fusion_matches_brute_force(results: list[list[tuple[str, float]]], data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=len(results), max_size=len(results)))
    got = relative_score_fusion(results, weights=weights)
    want = brute_force_fusion(results, weights)
    assert [k for k, _ in got] == [k for k, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-12)


@pytest.mark.parametrize("fetch_k", [1, 3, 5, 7])
def test_hybrid_score_fusion_matches_brute_force_over_the_whole_store(fetch_k: int) -> None:
    from langchain_core.embeddings import DeterministicFakeEmbedding

    embedding = DeterministicFakeEmbedding(size=16)
    docs = [Document(id=d.id, page_content=d.page_content, metadata={**d.metadata, HEADER_KEY: f"notes on {d.metadata['topic']}"}) for d in DOCS]
    store = FaissVectorStore(embedding)
    store.add_documents(docs)
    hybrid = HybridRetriever(vectorstore=store, documents=docs, k=3, fetch_k=fetch_k, dense_weight=1.0, bm25_weight=2.0)
    fetch = max(fetch_k, 3)  # each side gives at least k candidates
    for query in ["lighthouse lamp", "notes on bread", "commit log recovery", "sea bread db"]:
        # Dense: cosine of every stored vector, exact; BM25: the hand-written formula; both over header + text.
        vectors = np.array(embedding.embed_documents([contextual_text(d) for d in docs]))
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        q = np.array(embedding.embed_query(query))
        cos = vectors @ (q / np.linalg.norm(q))
        dense = [(docs[i].id, float(cos[i])) for i in np.argsort(-cos, kind="stable")[:fetch]]
        lex_scores = reference_bm25([contextual_text(d) for d in docs], query)
        lex = [(docs[i].id, float(lex_scores[i])) for i in np.argsort(-lex_scores, kind="stable") if lex_scores[i] > 0][:fetch]
        want = brute_force_fusion([dense, lex], [1.0, 2.0])[:3]
        got = hybrid.search(query)
        assert [h.document.id for h in got] == [k for k, _ in want], query
        np.testing.assert_allclose([h.score for h in got], [s for _, s in want], atol=1e-4)


class LengthReranker:
    """Prefers short passages; records what it was given."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score(self, query: str, passages: list[str]) -> list[float]:
        self.seen = list(passages)
        return [-float(len(p)) for p in passages]


def test_injected_reranker_reorders_candidates() -> None:
    reranker = LengthReranker()
    hybrid = HybridRetriever(vectorstore=ListStore(DOCS[2:]), documents=DOCS, k=3, fusion="rrf", reranker=reranker, rerank_candidates=5)
    hits = hybrid.search("bread lamp")
    assert len(reranker.seen) == 5
    assert [h.score for h in hits] == sorted((-float(len(p)) for p in reranker.seen), reverse=True)[:3]
    assert [len(h.document.page_content) for h in hits] == sorted(len(p) for p in reranker.seen)[:3]


def test_reranker_validation() -> None:
    with pytest.raises((TypeError, ValidationError), match="score"):
        HybridRetriever(vectorstore=ListStore(DOCS), documents=DOCS, reranker=object())

    class Broken:
        def score(self, query, passages):
            return [1.0]

    with pytest.raises(ValueError, match="1 scores"):
        HybridRetriever(vectorstore=ListStore(DOCS), documents=DOCS, fusion="rrf", reranker=Broken()).invoke("bread")


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer BERT cross-encoder using the default model's tokenizer (offline)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=1,
    )
    path = tmp_path_factory.mktemp("tiny-cross-encoder")
    BertForSequenceClassification(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_cross_encoder_reranker_scores_like_the_model(tiny_cross_encoder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    reranker = CrossEncoderReranker(tiny_cross_encoder, device="cpu")
    passages = [d.page_content for d in DOCS]
    scores = reranker.score("how is bread made?", passages)
    model = BertForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_cross_encoder)
    with torch.no_grad():
        batch = tokenizer(["how is bread made?"] * len(passages), passages, padding=True, truncation=True, return_tensors="pt")
        logits = model(**batch).logits[:, 0]
    # CrossEncoder applies a sigmoid to single-label models by default.
    np.testing.assert_allclose(scores, torch.sigmoid(logits).numpy(), rtol=1e-4, atol=1e-5)
    assert reranker.score("q", []) == []
    hybrid = HybridRetriever(vectorstore=ListStore(DOCS), documents=DOCS, k=3, fusion="rrf", reranker=reranker)
    hits = hybrid.search("bread")
    assert [h.score for h in hits] == sorted([h.score for h in hits], reverse=True)


def test_cross_encoder_missing_model_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match="offline") as info:
        CrossEncoderReranker(tmp_path / "no-such-model").score("q", ["p"])
    assert info.value.__cause__ is not None
    with pytest.raises(ValueError, match="batch_size"):
        CrossEncoderReranker("x", batch_size=0)


def test_documents_without_indexable_words_give_no_hits_not_an_error() -> None:
    from langchain_core.documents import Document as Doc

    from retrievers import BM25Retriever as BM25

    empty = BM25(documents=[Doc(page_content="the a"), Doc(page_content="I")])  # stopwords and one-letter words
    assert empty.invoke("the a") == [] and empty.invoke("ferries") == []
    mixed = BM25(documents=[Doc(page_content="the a"), Doc(page_content="ferries sail")])
    assert [d.page_content for d in mixed.invoke("ferries")] == ["ferries sail"]
