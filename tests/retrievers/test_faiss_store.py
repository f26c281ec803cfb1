"""FaissVectorStore against numpy brute force; ids, upserts, deletes, filters, HNSW."""

from __future__ import annotations

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

from retrievers import DimensionMismatchError, FaissVectorStore, FlatIndex, HNSWIndex
from retrievers.types import MAX_FILTER_DEPTH

DIM = 16


def random_store(n: int, seed: int = 0, index=None) -> tuple[FaissVectorStore, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype("float32")
    store = FaissVectorStore(DeterministicFakeEmbedding(size=DIM), index=index)
    ids = [f"doc-{i}" for i in range(n)]
    store.add_embeddings([f"text {i}" for i in range(n)], vectors, [{"parity": i % 2, "i": i} for i in range(n)], ids)
    return store, vectors / np.linalg.norm(vectors, axis=1, keepdims=True), ids


def brute_force(vectors: np.ndarray, ids: list[str], query: np.ndarray, k: int, mask=None) -> list[tuple[str, float]]:
    scores = vectors @ (query / np.linalg.norm(query))
    order = [i for i in np.argsort(-scores, kind="stable") if mask is None or mask[i]]
    return [(ids[i], float(scores[i])) for i in order[:k]]


def assert_same_hits(got: list[tuple[Document, float]], expected: list[tuple[str, float]]) -> None:
    """Same ranking as brute force; ids may only differ where float rounding ties two scores."""
    assert len(got) == len(expected)
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], rtol=0, atol=1e-5)
    for (doc, score), (expected_id, expected_score) in zip(got, expected):
        assert doc.id == expected_id or abs(score - expected_score) < 1e-5
    assert len({d.id for d, _ in got}) == len(got)


@pytest.mark.parametrize("n", [1, 5, 17, 1000])
@pytest.mark.parametrize("k", [1, 3, 10, 1005])
def test_flat_search_equals_numpy_top_k(n: int, k: int) -> None:
    store, vectors, ids = random_store(n, seed=n)
    rng = np.random.default_rng(123)
    for query in rng.standard_normal((5, DIM)).astype("float32"):
        got = store.similarity_search_with_score_by_vector(query.tolist(), k=k)
        assert len(got) == min(k, n)
        assert_same_hits(got, brute_force(vectors, ids, query, k))


@pytest.mark.parametrize("n", [5, 17, 1000])
def test_filtered_search_equals_numpy_on_the_subset(n: int) -> None:
    store, vectors, ids = random_store(n, seed=7)
    query = np.random.default_rng(1).standard_normal(DIM).astype("float32")
    odd = np.array([i % 2 == 1 for i in range(n)])
    assert_same_hits(store.similarity_search_with_score_by_vector(query, k=7, filter={"parity": 1}), brute_force(vectors, ids, query, 7, odd))
    small = np.array([i < 3 for i in range(n)])
    got = store.similarity_search_with_score_by_vector(query, k=7, filter=lambda m: m["i"] < 3)
    assert_same_hits(got, brute_force(vectors, ids, query, 7, small))
    assert store.similarity_search_by_vector(query, k=3, filter={"parity": 5}) == []
    assert store.similarity_search_by_vector(query, k=3, filter={"missing-key": None}) == []


def test_hnsw_recall_against_flat() -> None:
    hnsw, vectors, ids = random_store(1000, seed=3, index=HNSWIndex(m=16, ef_construction=100, ef_search=64))
    queries = np.random.default_rng(9).standard_normal((50, DIM)).astype("float32")
    hits = 0
    for q in queries:
        truth = {i for i, _ in brute_force(vectors, ids, q, 10)}
        hits += len(truth & {d.id for d in hnsw.similarity_search_by_vector(q, k=10)})
    assert hits / (50 * 10) >= 0.95


@pytest.mark.parametrize("index", [FlatIndex(), HNSWIndex(m=8)], ids=["flat", "hnsw"])
def test_delete_and_upsert_by_id(index) -> None:
    store, vectors, ids = random_store(300, seed=5, index=index)
    gone = ids[:250]
    store.delete(gone + ["never-existed"])
    assert len(store) == 50
    assert store.get_by_ids(gone[:3]) == []
    query = vectors[10]  # a deleted document's own vector
    got = store.similarity_search_with_score_by_vector(query, k=60)
    assert len(got) == 50 and not {d.id for d, _ in got} & set(gone)
    assert_same_hits(got, brute_force(vectors[250:], ids[250:], query, 60))
    if isinstance(index, HNSWIndex):
        assert store._index.ntotal < 300  # tombstones outnumbered live vectors: the index was rebuilt

    # Upsert: same id, new text, metadata and vector.
    new_vector = -vectors[299]
    store.add_embeddings(["replaced"], [new_vector], [{"v": 2}], ["doc-299"])
    assert len(store) == 50
    (doc,) = store.get_by_ids(["doc-299"])
    assert doc.page_content == "replaced" and doc.metadata == {"v": 2}
    top, score = store.similarity_search_with_score_by_vector(new_vector, k=1)[0]
    assert top.id == "doc-299" and score == pytest.approx(1.0, abs=1e-5)

    store.delete(None)
    assert len(store) == 0 and store.similarity_search_by_vector(query, k=3) == []


def test_add_documents_ids_documents_are_copies_and_not_mutated() -> None:
    store = FaissVectorStore(DeterministicFakeEmbedding(size=DIM))
    docs = [Document(page_content="one", metadata={"m": [1]}), Document(id="given", page_content="two")]
    ids = store.add_documents(docs)
    assert ids[1] == "given" and ids[0] and ids[0] != "given"
    assert docs[0].id is None and docs[0].metadata == {"m": [1]}
    explicit = store.add_documents([Document(id="ignored", page_content="three")], ids=["kw"])
    assert explicit == ["kw"] and store.get_by_ids(["ignored"]) == []
    fetched = store.get_by_ids(["given", "nope", ids[0]])
    assert [d.id for d in fetched] == ["given", ids[0]]
    fetched[0].metadata["tampered"] = True
    assert "tampered" not in store.get_by_ids(["given"])[0].metadata
    with pytest.raises(ValueError, match="one id per document"):
        store.add_documents(docs, ids=["only-one"])
    # A repeated id within one call keeps the last occurrence.
    store.add_documents([Document(page_content="a"), Document(page_content="b")], ids=["dup", "dup"])
    assert [d.page_content for d in store.get_by_ids(["dup"])] == ["b"]
    assert len(store) == 4


def test_scores_relevance_mmr_and_edge_cases() -> None:
    emb = DeterministicFakeEmbedding(size=DIM)
    store = FaissVectorStore.from_texts(["apple", "banana", "cherry", "date"], emb, ids=["a", "b", "c", "d"])
    assert store.similarity_search("apple", k=0) == []
    (doc, score), *_ = store.similarity_search_with_score("apple", k=4)
    assert doc.id == "a" and score == pytest.approx(1.0, abs=1e-5)
    relevance = store.similarity_search_with_relevance_scores("apple", k=4)
    assert all(0.0 <= r <= 1.0 for _, r in relevance) and relevance[0][1] == pytest.approx(1.0, abs=1e-5)
    mmr = store.max_marginal_relevance_search("apple", k=3, fetch_k=4)
    assert len({d.id for d in mmr}) == 3 and mmr[0].id == "a"
    assert FaissVectorStore(emb).similarity_search("apple") == []
    with pytest.raises(TypeError, match="filter must be"):
        store.similarity_search("apple", filter="parity=1")  # type: ignore[arg-type]
    with pytest.raises(DimensionMismatchError, match="dimension 3"):
        store.add_embeddings(["x"], [[0.1, 0.2, 0.3]])
    with pytest.raises(DimensionMismatchError, match="query vector"):
        store.similarity_search_by_vector([0.1, 0.2, 0.3])
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": lambda m: True})
    assert [d.id for d in retriever.invoke("banana")][0] == "b"


def test_add_documents_embeds_chunks_with_their_header_as_ingest_does() -> None:
    """A chunk from ``split_documents`` gets the vector of its ``contextual_text`` (what ``ragspec
    ingest`` stores, so both paths build the same index); its text and metadata stay its own."""
    from retrievers import contextual_text, split_documents

    emb = DeterministicFakeEmbedding(size=16)
    doc = Document("The trial period is six months. " * 3, metadata={"source": "staff-handbook.md"})
    chunks = split_documents([doc], chunk_size=64, chunk_overlap=0)
    plain = Document("no header here", id="plain")
    store = FaissVectorStore(emb)
    store.add_documents([*chunks, plain])
    for chunk in chunks:
        assert contextual_text(chunk).startswith("staff handbook")
        hit, score = store.similarity_search_with_score_by_vector(emb.embed_query(contextual_text(chunk)), k=1)[0]
        assert hit.id == chunk.id and hit.page_content == chunk.page_content and score == pytest.approx(1.0, abs=1e-5)
    hit, score = store.similarity_search_with_score_by_vector(emb.embed_query("no header here"), k=1)[0]
    assert hit.id == "plain" and score == pytest.approx(1.0, abs=1e-5)


OPERATOR_CASES = [
    ({"i": {"$eq": 4}}, lambda m: m["i"] == 4),
    ({"parity": {"$ne": 1}}, lambda m: m["parity"] != 1),
    ({"i": {"$gt": 10}}, lambda m: m["i"] > 10),
    ({"i": {"$gte": 10, "$lt": 13}}, lambda m: 10 <= m["i"] < 13),
    ({"i": {"$lte": 2}}, lambda m: m["i"] <= 2),
    ({"i": {"$in": [1, 5, 99]}}, lambda m: m["i"] in (1, 5, 99)),
    ({"i": {"$nin": [0, 1, 2]}, "parity": 0}, lambda m: m["i"] not in (0, 1, 2) and m["parity"] == 0),
    ({"$or": [{"i": {"$lt": 2}}, {"name": {"$eq": "doc-7"}}]}, lambda m: m["i"] < 2 or m.get("name") == "doc-7"),
    ({"$and": [{"parity": 1}, {"$or": [{"i": 3}, {"i": {"$gte": 15}}]}]},
     lambda m: m["parity"] == 1 and (m["i"] == 3 or m["i"] >= 15)),
    ({"name": {"$gte": "doc-5"}}, lambda m: "name" in m and m["name"] >= "doc-5"),  # strings order as strings
    ({"name": {"$ne": "doc-7"}}, lambda m: "name" in m and m["name"] != "doc-7"),  # no field: no match, as in Chroma
    ({"i": {"$gt": "3"}}, lambda m: False),  # a number never orders against a string
]  # fmt: skip


@pytest.mark.parametrize(("where", "expected"), OPERATOR_CASES)
def test_filter_operators_equal_the_python_predicate(where: dict, expected) -> None:
    n = 17
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((n, DIM)).astype("float32")
    store = FaissVectorStore(DeterministicFakeEmbedding(size=DIM))
    metadata = [{"parity": i % 2, "i": i, **({"name": f"doc-{i}"} if i % 3 else {})} for i in range(n)]
    ids = [f"doc-{i}" for i in range(n)]
    store.add_embeddings([f"text {i}" for i in range(n)], vectors, metadata, ids)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    mask = np.array([bool(expected(m)) for m in metadata])
    query = rng.standard_normal(DIM).astype("float32")
    assert_same_hits(store.similarity_search_with_score_by_vector(query, k=n, filter=where), brute_force(unit, ids, query, n, mask))


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"i": {"$like": "doc%"}}, "unsupported filter operator '\\$like'"),
        ({"$not": {"i": 1}}, "unsupported filter operator '\\$not'"),
        ({"i": {}}, "is empty"),
        ({"$or": []}, "non-empty list"),
        ({"$and": {"i": 1}}, "non-empty list"),
        ({"i": {"$in": 3}}, "takes a list"),
        ({"i": {"$gt": [1]}}, "number or a string"),
    ],
)
def test_unknown_operators_and_malformed_conditions_are_refused(where: dict, message: str) -> None:
    from retrievers import BM25Retriever, FilterError

    store, _, _ = random_store(5)
    with pytest.raises(FilterError, match=message):
        store.similarity_search("apple", filter=where)
    with pytest.raises(FilterError, match=message):
        BM25Retriever.from_documents([Document("apple pie"), Document("pear")]).invoke("apple", filter=where)


def nested(op: str, depth: int) -> dict:
    """``{op: [{op: [... {"i": 1} ...]}]}`` with ``depth`` levels of ``op``."""
    where: dict = {"i": 1}
    for _ in range(depth):
        where = {op: [where]}
    return where


@pytest.mark.parametrize("op", ["$and", "$or"])
@pytest.mark.parametrize("depth", [MAX_FILTER_DEPTH + 1, 900, 5000])
def test_combinations_nested_too_deep_are_a_filter_error_on_every_retriever(op: str, depth: int) -> None:
    from retrievers import BM25Retriever, FilterError, HybridRetriever

    store, _, _ = random_store(5)
    docs = [Document("apple pie", metadata={"i": 1}), Document("pear", metadata={"i": 2})]
    where = nested(op, depth)
    searches = {
        "FaissVectorStore": lambda: store.similarity_search("apple", filter=where),
        "BM25Retriever": lambda: BM25Retriever.from_documents(docs).invoke("apple", filter=where),
        "HybridRetriever": lambda: HybridRetriever(vectorstore=store, documents=docs).invoke("apple", filter=where),
    }
    for name, search in searches.items():
        with pytest.raises(FilterError, match=f"nested more than {MAX_FILTER_DEPTH} levels"):
            search()
    malformed = {op: {"not": "a list"}}
    for _ in range(depth):
        malformed = {op: malformed}  # a dict where a list belongs, nested: its message must not recurse either
    with pytest.raises(FilterError, match="non-empty list"):
        store.similarity_search("apple", filter=malformed)


def test_combinations_nested_as_deep_as_allowed_match_as_the_flat_filter() -> None:
    store, _, _ = random_store(6)
    for op in ("$and", "$or"):
        got = store.similarity_search("apple", k=6, filter=nested(op, MAX_FILTER_DEPTH))
        assert [d.metadata["i"] for d in got] == [d.metadata["i"] for d in store.similarity_search("apple", k=6, filter={"i": 1})]
