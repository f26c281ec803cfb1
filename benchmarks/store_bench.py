"""Vector store benchmark: FAISS (in this process) against PostgreSQL with pgvector (a local server from the
postgres extra), on synthetic chunks: ingest throughput, query latency p50/p95, HNSW recall@10 against exact
search, and memory (this process's RSS growth for FAISS; table and index sizes for PostgreSQL).

Run from the repository root (offline; needs ``pip install 'ragspec[postgres]'``):

    .venv/bin/python benchmarks/store_bench.py --sizes 10000            # ~2 min on 2 cores
    .venv/bin/python benchmarks/store_bench.py --sizes 10000 100000     # ~20 min on 2 cores

Vectors are clustered Gaussians (384 dimensions, as the default embedding model's; neighbours much
closer than random pairs, as sentence embeddings are), texts Zipf-distributed words. Vectors are
given, not embedded: this measures the stores, not the model. Queries run one at a time through the
stores' APIs: ``similarity_search_with_score_by_vector`` (dense) and, for PostgreSQL,
``hybrid_search`` (dense and BM25 in one statement). Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from langchain_core.embeddings import Embeddings  # noqa: E402

from retrievers import FaissVectorStore, FlatIndex, HNSWIndex  # noqa: E402

DIM = 384
VOCABULARY = 20000


@dataclass
class Row:
    store: str
    n: int
    ingest_s: float
    chunks_per_s: float
    p50_ms: float
    p95_ms: float
    recall_at_10: float
    memory_mib: float
    """FAISS: growth of this process's RSS; PostgreSQL: the chunks table with its indexes."""


class GivenVectors(Embeddings):
    """Embeds a query as the vector registered for its text (the benchmark's queries are precomputed)."""

    def __init__(self) -> None:
        self.table: dict[str, list[float]] = {}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.table[text]


def corpus(n: int, n_queries: int, seed: int) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, n // 100), DIM)).astype("float32")

    def draw(m: int) -> np.ndarray:
        return (centers[rng.integers(len(centers), size=m)] + 0.5 * rng.standard_normal((m, DIM))).astype("float32")

    words = np.minimum(rng.zipf(1.3, size=(n + n_queries) * 40), VOCABULARY)
    texts = [" ".join(f"w{w}" for w in words[i * 40 : (i + 1) * 40]) for i in range(n + n_queries)]
    return draw(n), texts[:n], draw(n_queries), [" ".join(t.split()[:6]) for t in texts[n:]]


def exact_top10(data: np.ndarray, queries: np.ndarray) -> list[set[int]]:
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    scores = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ unit.T
    return [set(np.argsort(-row)[:10].tolist()) for row in scores]


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def timed(fn, queries: list) -> tuple[list[float], list]:
    ms, results = [], []
    for q in queries:
        t0 = time.perf_counter()
        results.append(fn(q))
        ms.append((time.perf_counter() - t0) * 1000)
    return ms, results


def bench_faiss(n: int, data: np.ndarray, texts: list[str], queries: np.ndarray, truth: list[set[int]]) -> list[Row]:
    rows = []
    ids = [str(i) for i in range(n)]
    for name, config in (("FAISS flat", FlatIndex()), ("FAISS HNSW", HNSWIndex(m=16, ef_construction=64, ef_search=100))):
        before = rss_mib()
        store = FaissVectorStore(GivenVectors(), index=config)
        t0 = time.perf_counter()
        store.add_embeddings(texts, data, None, ids)
        ingest = time.perf_counter() - t0
        ms, results = timed(lambda q: store.similarity_search_with_score_by_vector(q, k=10), list(queries))
        recall = float(np.mean([len({int(d.id) for d, _ in r} & t) / 10 for r, t in zip(results, truth)]))
        rows.append(Row(name, n, ingest, n / ingest, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), recall,
                        rss_mib() - before))  # fmt: skip
        del store
    return rows


def bench_postgres(
    url: str, n: int, data: np.ndarray, texts: list[str], queries: np.ndarray, query_texts: list[str], truth: list[set[int]]
) -> list[Row]:
    import psycopg

    from retrievers.pg_store import HnswSettings, PgVectorStore

    embeddings = GivenVectors()
    for text, vector in zip(query_texts, queries):
        embeddings.table[text] = vector.tolist()
    store = PgVectorStore(url, embeddings, collection=f"bench-{n}", hnsw=HnswSettings(m=16, ef_construction=64, ef_search=100))
    ids = [str(i) for i in range(n)]
    t0 = time.perf_counter()
    for start in range(0, n, 1000):  # one transaction per 1000 chunks, as an ingest of many files commits
        store.add_embeddings(texts[start : start + 1000], data[start : start + 1000], None, ids[start : start + 1000])
    ingest = time.perf_counter() - t0
    with psycopg.connect(url) as conn:
        size = conn.execute("SELECT pg_total_relation_size(%s)", (f"ragspec_chunks_{store.collection_id}",)).fetchone()
    memory = float(size[0]) / 2**20 if size else 0.0
    rows = []
    ms, results = timed(lambda q: store.similarity_search_with_score_by_vector(q, k=10), list(queries))
    recall = float(np.mean([len({int(d.id) for d, _ in r} & t) / 10 for r, t in zip(results, truth)]))
    rows.append(Row("PostgreSQL HNSW", n, ingest, n / ingest, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), recall, memory))
    ms, results = timed(lambda q: store.hybrid_search(q, k=10), query_texts)
    rows.append(Row("PostgreSQL hybrid (HNSW + BM25)", n, ingest, n / ingest, float(np.percentile(ms, 50)),
                    float(np.percentile(ms, 95)), float("nan"), memory))  # fmt: skip
    store.delete(None)
    store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000], help="chunks per run (default: 10000)")
    parser.add_argument("--queries", type=int, default=200, help="queries per store (default: 200)")
    parser.add_argument("--url", default=None, help="a postgresql:// database to use (default: a local server from the postgres extra)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "store.json", help="JSON output")
    args = parser.parse_args(argv)
    if any(n < 10 for n in args.sizes) or args.queries < 1:
        parser.error("--sizes must be at least 10 and --queries at least 1")
    server = None
    url = args.url
    if url is None:
        from retrievers.pg_local import LocalPostgres

        server = LocalPostgres()
        url = server.start()
    rows: list[Row] = []
    try:
        for n in args.sizes:
            data, texts, queries, query_texts = corpus(n, args.queries, seed=n)
            truth = exact_top10(data, queries)
            rows += bench_faiss(n, data, texts, queries, truth)
            rows += bench_postgres(url, n, data, texts, queries, query_texts, truth)
    finally:
        if server is not None:
            server.stop()
    print("| store | chunks | ingest chunks/s | query p50 ms | query p95 ms | recall@10 vs exact | memory MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        recall = "-" if r.recall_at_10 != r.recall_at_10 else f"{r.recall_at_10:.3f}"
        print(f"| {r.store} | {r.n:,} | {r.chunks_per_s:,.0f} | {r.p50_ms:.1f} | {r.p95_ms:.1f} | {recall} | {r.memory_mib:.0f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
    args.out.write_text(json.dumps({"machine": machine, "rows": [asdict(r) for r in rows]}, indent=2, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
