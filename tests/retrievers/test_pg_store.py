"""`PgVectorStore` on a real PostgreSQL with pgvector (the session's `pg_server`), against brute-force references:
filters against `matches_filter`, BM25 against the formula over the stored lexemes, dense search against numpy,
HNSW against exact search, hybrid against `relative_score_fusion` of the two sides; collections, hostile input."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings

from retrievers.errors import DimensionMismatchError, FilterError, IndexMismatchError
from retrievers.hybrid import reciprocal_rank_fusion, relative_score_fusion
from retrievers.types import matches_filter

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

from retrievers.pg_filters import filter_sql  # noqa: E402
from retrievers.pg_retriever import PgHybridRetriever  # noqa: E402
from retrievers.pg_store import HnswSettings, PgStoreError, PgVectorStore  # noqa: E402

pytestmark = pytest.mark.timeout(300)

WORDS = ("lighthouse lamp oil keeper storm harbour ferry ticket bread rye wheat commit fsync journal "
         "snapshot restore key rotate trial period refund winter timetable engine piston valve").split()  # fmt: skip


class VectorsById(Embeddings):
    """Embeddings whose vectors a test sets per text (queries too): exact expectations."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.table[text]


def random_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# -- filters -----------------------------------------------------------------------------------


HOSTILE = ["x'); DROP TABLE ragspec_collections; --", 'a" OR 1=1 --', "50%_\\", "$eq", "ünï ❄", ""]
VALUES = [0, 1, 2, 2.5, -3, True, False, None, "a", "b", "B", "ä", "a'b", *HOSTILE, [1, 2], {"k": 1}]


def random_metadata(rng: random.Random) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key in ("n", "s", "flag", HOSTILE[0], "nested"):
        if rng.random() < 0.8:
            metadata[key] = rng.choice(VALUES)
    return metadata


def random_condition(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        return {rng.choice(["$and", "$or"]): [random_condition(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    key = rng.choice(["n", "s", "flag", HOSTILE[0], HOSTILE[1], "missing", "nested"])
    op = rng.choice(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", None])
    if op is None:  # the shorthand for $eq (a dict there would be read as operators)
        return {key: rng.choice([v for v in VALUES if not isinstance(v, dict)])}
    if op in ("$in", "$nin"):
        return {key: {op: rng.sample(VALUES, rng.randint(0, 4))}}
    if op in ("$gt", "$gte", "$lt", "$lte"):
        return {key: {op: rng.choice([0, 1, 2, 2.5, -3, "a", "b", "B", "ä", HOSTILE[0]])}}
    return {key: {op: rng.choice(VALUES)}}


def test_filters_select_exactly_what_matches_filter_selects(pg_url: str) -> None:
    rng = random.Random(7)
    docs = [Document(id=f"d{i}", page_content=random_text(rng, 6), metadata=random_metadata(rng)) for i in range(60)]
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    store.add_documents(docs)
    checked = 0
    for _ in range(400):
        condition = random_condition(rng)
        expected = sorted(d.id for d in docs if matches_filter(d.metadata, condition))
        assert [d.id for d in store.documents(condition)] == expected, condition
        checked += bool(expected)
    assert checked > 100  # most filters select something: the comparison is not vacuous
    store.close()


def test_filter_keys_and_values_are_bound_parameters_never_sql_text() -> None:
    condition = {"$or": [{HOSTILE[0]: {"$in": [HOSTILE[1], 3]}}, {"s": {"$gte": HOSTILE[0]}}]}
    where, params = filter_sql(condition)
    text = where.as_string(None)
    assert "DROP" not in text and "1=1" not in text and "%(f" in text
    assert {HOSTILE[0], "s"} <= {v for v in params.values() if isinstance(v, str)}


def test_filters_the_database_cannot_run_are_refused_clearly(pg_url: str) -> None:
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    store.add_texts(["a b c"], [{"n": 1}])
    with pytest.raises(FilterError, match="callable"):
        store.documents(lambda m: True)
    with pytest.raises(FilterError, match="unsupported filter operator"):
        store.documents({"n": {"$regex": "."}})
    with pytest.raises(FilterError, match="NUL"):
        store.documents({"n": "a\x00b"})
    with pytest.raises(FilterError, match="finite"):
        store.documents({"n": {"$gt": float("nan")}})
    assert len(store) == 1
    store.close()


# -- dense, keyword and hybrid search against references -----------------------------------------------


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_dense_search_is_the_cosine_top_k_under_a_filter(pg_url: str) -> None:
    rng = np.random.default_rng(3)
    n, dim = 300, 24
    vectors = rng.standard_normal((n, dim)).astype("float32")
    texts = [f"t{i}" for i in range(n)]
    table = {t: v.tolist() for t, v in zip(texts, vectors)}
    query = rng.standard_normal(dim).astype("float32")
    table["q"] = query.tolist()
    store = PgVectorStore(pg_url, VectorsById(table))
    store.add_embeddings(texts, vectors, [{"i": i, "even": i % 2 == 0} for i in range(n)], texts)
    cosine = unit(vectors) @ unit(query)
    for condition, allowed in ((None, range(n)), ({"even": True}, range(0, n, 2)), ({"i": {"$lt": 40}}, range(40))):
        order = sorted(allowed, key=lambda i: -cosine[i])[:10]
        for exact in (True, False):
            hits = store.similarity_search_with_score_by_vector(query, k=10, filter=condition, exact=exact)
            assert [int(d.metadata["i"]) for d, _ in hits] == order, (condition, exact)
            assert np.allclose([s for _, s in hits], cosine[order], atol=1e-5)
    assert [d.id for d in store.similarity_search("q", k=3)] == [f"t{i}" for i in np.argsort(-cosine)[:3]]
    store.close()


def test_hnsw_recall_against_exact_search(pg_url: str) -> None:
    rng = np.random.default_rng(11)
    n, dim = 3000, 32
    centers = rng.standard_normal((30, dim))
    vectors = (centers[rng.integers(30, size=n)] + 0.5 * rng.standard_normal((n, dim))).astype("float32")
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=dim), hnsw=HnswSettings(m=16, ef_construction=64, ef_search=64))
    store.add_embeddings([""] * n, vectors, None, [str(i) for i in range(n)])
    found = []
    for query in (centers[rng.integers(30, size=40)] + 0.5 * rng.standard_normal((40, dim))).astype("float32"):
        approx = {d.id for d, _ in store.similarity_search_with_score_by_vector(query, k=10)}
        exact = {d.id for d, _ in store.similarity_search_with_score_by_vector(query, k=10, exact=True)}
        found.append(len(approx & exact) / 10)
    assert float(np.mean(found)) >= 0.95
    store.close()


def bm25_reference(conn: Any, table: str, query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """BM25 (Lucene's idf, bm25s' formula) computed here from the lexemes PostgreSQL stored for each row."""
    rows = conn.execute(f'SELECT c.id, u.lexeme, array_length(u.positions, 1) FROM "{table}" c, unnest(c.tsv) u').fetchall()
    terms: dict[str, dict[str, int]] = {}
    for doc_id, lexeme, tf in rows:
        terms.setdefault(doc_id, {})[lexeme] = tf
    everyone = [r[0] for r in conn.execute(f'SELECT id FROM "{table}"').fetchall()]
    lengths = {doc_id: sum(terms.get(doc_id, {}).values()) for doc_id in everyone}
    n, avgdl = len(everyone), sum(lengths.values()) / len(everyone)
    words = [r[0] for r in conn.execute("SELECT unnest(tsvector_to_array(to_tsvector('english', %s)))", (query,)).fetchall()]
    df = {w: sum(1 for d in terms.values() if w in d) for w in words}
    scores: dict[str, float] = {}
    for doc_id in everyone:
        score = 0.0
        for w in words:
            tf = terms.get(doc_id, {}).get(w, 0)
            if tf and df[w]:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                score += idf * tf / (tf + k1 * (1 - b + b * lengths[doc_id] / avgdl))
        if score > 0:
            scores[doc_id] = score
    return scores


def test_keyword_search_is_bm25_over_the_stored_lexemes_and_follows_every_write(pg_url: str) -> None:
    rng = random.Random(5)
    docs = [Document(id=f"d{i}", page_content=random_text(rng, rng.randint(3, 40)), metadata={"i": i}) for i in range(80)]
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    store.add_documents(docs)
    store.delete([f"d{i}" for i in range(0, 80, 7)])  # the statistics must follow deletions...
    store.add_documents([Document(id="d3", page_content="ferry ferry ferry ticket")])  # ...and replacements
    table = f"ragspec_chunks_{store.collection_id}"
    with psycopg.connect(pg_url) as conn:
        for query in ("ferry ticket", "the lighthouse keeper's storm lamp", "Restoring snapshots!", "zebra", "oil"):
            reference = bm25_reference(conn, table, query)
            hits = store.keyword_search(query, k=100)
            assert {h.document.id for h in hits} == set(reference), query
            for hit in hits:
                assert hit.score == pytest.approx(reference[hit.document.id], rel=1e-9), query
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    store.close()


def test_a_term_in_most_of_a_large_collection_does_not_make_candidates_alone(pg_url: str) -> None:
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    filler = [f"alpha filler{i}" for i in range(2100)]
    store.add_embeddings([*filler, "alpha beta one", "alpha beta two"], np.ones((2102, 8)), None,
                         [*(f"f{i}" for i in range(2100)), "b1", "b2"])  # fmt: skip
    hits = store.keyword_search("alpha beta", k=10)
    assert [h.document.id for h in hits] == ["b1", "b2"]  # "alpha" (in every chunk) still scores them
    assert hits[0].score > store.keyword_search("beta", k=1)[0].score
    assert len(store.keyword_search("alpha", k=10)) == 10  # a query of common terms only still finds chunks
    store.close()


@pytest.mark.parametrize("fusion", ["relative_score", "rrf"])
def test_hybrid_search_fuses_the_two_sides_as_the_faiss_hybrid_does(pg_url: str, fusion: str) -> None:
    rng = random.Random(9)
    docs = [Document(id=f"d{i}", page_content=random_text(rng, 12), metadata={"i": i, "title": f"Doc {i % 5}"}) for i in range(120)]
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=16))
    store.add_documents(docs)
    for query in ("ferry ticket refund", "keeper lamp", "Doc 3 engine"):
        for condition in (None, {"i": {"$gte": 30}}):
            dense = store.similarity_search_with_relevance_scores(query, k=20, filter=condition)
            lexical = store.keyword_search(query, k=20, filter=condition)
            if fusion == "rrf":
                expected = reciprocal_rank_fusion([[d.id for d, _ in dense], [h.document.id for h in lexical]])
            else:
                expected = relative_score_fusion([[(d.id, s) for d, s in dense], [(h.document.id, h.score) for h in lexical]])
            got = store.hybrid_search(query, k=8, filter=condition, fusion=fusion)  # type: ignore[arg-type]
            assert [(h.document.id, round(h.score, 9)) for h in got] == [(key, round(s, 9)) for key, s in expected[:8]]
            retriever = PgHybridRetriever(store=store, k=8, fusion=fusion)  # type: ignore[arg-type]
            assert [d.id for d in retriever.invoke(query, filter=condition)] == [h.document.id for h in got]
    store.close()


# -- collections ---------------------------------------------------------------------------------


def test_collections_are_isolated(pg_url: str) -> None:
    emb = DeterministicFakeEmbedding(size=8)
    a = PgVectorStore(pg_url, emb, collection="a")
    b = PgVectorStore(pg_url, emb, collection="x'); DROP TABLE ragspec_collections; --")
    a.add_documents([Document(id="same", page_content="lighthouse keeper in collection a", metadata={"c": "a"})])
    b.add_documents([Document(id="same", page_content="bread recipe in collection b", metadata={"c": "b"}),
                     Document(id="only-b", page_content="lighthouse lighthouse lighthouse", metadata={"c": "b"})])  # fmt: skip
    for query in ("lighthouse", "bread", "collection"):
        assert {d.metadata["c"] for d in a.similarity_search(query, k=10)} == {"a"}
        assert {h.document.metadata["c"] for h in a.hybrid_search(query, k=10)} <= {"a"}
        assert {h.document.metadata["c"] for h in b.keyword_search(query, k=10)} <= {"b"}
    assert a.get_by_ids(["same", "only-b"])[0].page_content.endswith("collection a") and len(a.get_by_ids(["only-b"])) == 0
    b.delete(None)
    assert len(b) == 0 and len(a) == 1
    other_dim = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=12), collection="twelve", check_embeddings=False)
    other_dim.add_texts(["a twelve-dimensional collection"])
    assert len(other_dim) == 1 and len(a) == 1
    with pytest.raises(IndexMismatchError, match="built with embeddings"):
        PgVectorStore(pg_url, DeterministicFakeEmbedding(size=12), collection="a")
    with pytest.raises(DimensionMismatchError):
        a.add_embeddings(["wrong"], [[0.0] * 12])
    for store in (a, b, other_dim):
        store.close()


# -- hostile and awkward input -----------------------------------------------------------------------


def test_hostile_text_and_metadata_are_stored_intact_or_refused_clearly(pg_url: str) -> None:
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    nasty = "Robert'); DROP TABLE ragspec_collections;-- \\x00 is not NUL; $$ E'\\\\' %s %(x)s ünï ❄ \u2028"
    ids = store.add_texts([nasty], [{"source": "it's \"x\"; DROP--.md", "page": 3, "start_index": 17}], ids=["id'; --"])
    assert store.get_by_ids(ids)[0].page_content == nasty
    assert store.get_by_ids(ids)[0].metadata == {"source": "it's \"x\"; DROP--.md", "page": 3, "start_index": 17}
    assert [d.id for d in store.documents({"source": "it's \"x\"; DROP--.md"})] == ["id'; --"]
    assert store.keyword_search("Robert'); DROP TABLE", k=1)[0].document.id == "id'; --"
    with pytest.raises(ValueError, match="NUL character"):
        store.add_texts(["a\x00b"])
    with pytest.raises(ValueError, match="NUL character"):
        store.add_texts(["fine"], [{"k": "a\x00b"}])
    with pytest.raises(ValueError, match="JSON"):
        store.add_texts(["fine"], [{"k": float("nan")}])
    with pytest.raises(ValueError, match="NUL"):
        store.keyword_search("a\x00b")
    assert len(store) == 1
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM ragspec_collections").fetchone()[0] == 1
    store.close()


def test_a_ten_megabyte_chunk_is_stored_intact_or_refused_without_a_trace(pg_url: str) -> None:
    store = PgVectorStore(pg_url, DeterministicFakeEmbedding(size=8))
    store.add_texts(["small"], ids=["small"])
    repetitive = "lighthouse keeper " * (10 * 2**20 // 18)
    store.add_texts([repetitive], ids=["big"])
    assert store.get_by_ids(["big"])[0].page_content == repetitive
    assert store.keyword_search("keeper", k=1)[0].document.id == "big"
    rng = random.Random(1)
    varied = " ".join(f"w{rng.getrandbits(40):x}" for _ in range(10 * 2**20 // 12))  # too many lexemes for a tsvector
    with pytest.raises(PgStoreError, match="too large for PostgreSQL's full-text index"):
        store.add_texts([varied, "next"], ids=["varied", "next"])
    assert sorted(d.id for d in store.documents()) == ["big", "small"]  # the failed batch left nothing behind
    store.close()


def test_a_second_replica_searches_what_the_first_wrote_without_a_rebuild(pg_url: str) -> None:
    emb = DeterministicFakeEmbedding(size=8)
    writer = PgVectorStore(pg_url, emb, collection="shared")
    reader = PgVectorStore(pg_url, emb, collection="shared")  # another pool: as another `ragspec serve --store`
    retriever = PgHybridRetriever(store=reader, k=2)
    assert retriever.invoke("lighthouse keeper") == []
    writer.add_documents([Document(id="l", page_content="the lighthouse keeper trims the wick")])
    assert [d.id for d in retriever.invoke("lighthouse keeper")] == ["l"]
    writer.delete(["l"])
    assert retriever.invoke("lighthouse keeper") == []
    writer.close()
    reader.close()


def test_the_memo_is_shared_bounded_and_per_collection(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import retrievers.pg_store as pg_store

    monkeypatch.setattr(pg_store, "MEMO_ENTRIES", 3)
    emb = DeterministicFakeEmbedding(size=8)
    one, other = PgVectorStore(pg_url, emb, collection="one"), PgVectorStore(pg_url, emb, collection="other")
    for store in (one, other):
        store.add_texts(["a passage"])
    passage = Document(id="p'; --", page_content="the ferry leaves at noon", metadata={"source": "a.md", "page": 2})
    for i in range(5):
        one.remember(f"k{i}", [passage])
    assert [one.recall(f"k{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert one.recall("k4") == [passage] and other.recall("k4") is None
    one.close()
    other.close()
