"""Vector store benchmark: FAISS (in this process) against PostgreSQL with pgvector (a local server from the
postgres extra), on synthetic chunks: ingest throughput, query latency p50/p95, HNSW recall@10 against exact
search, and memory (this process's RSS growth for FAISS; table and index sizes for PostgreSQL, and the
server's processes' memory, PSS summed, when the server runs on this machine).

PostgreSQL is measured three ways: through ``PgVectorStore`` (HNSW built row by row as chunks arrive, as
an ingest builds it; dense and hybrid queries), and on plain tables of the same vectors as ``vector`` and
as ``halfvec`` (half the bytes), each with its HNSW index built at once after loading (``build_s``: what
a bulk load of a large collection costs) and searched at ``ef_search`` 40, 100 and 200 (recall against
breadth, docs/scale-out.md).

Run from the repository root (offline; needs ``pip install 'ragspec[postgres]'``):

    .venv/bin/python benchmarks/store_bench.py --sizes 10000 --out bench-out/store-10k.json                 # ~1 min on 2 cores
    .venv/bin/python benchmarks/store_bench.py --sizes 100000 --queries 100 --out bench-out/store-100k.json  # ~8 min on 2 cores

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
    """FAISS: growth of this process's RSS; PostgreSQL: the table with its indexes."""
    ef_search: int | None = None
    """HNSW search breadth (None: exact search, or not HNSW)."""
    build_s: float | None = None
    """Building the HNSW index at once over the loaded table (the plain-table rows)."""
    server_mib: float | None = None
    """PostgreSQL: its processes' memory after the queries (PSS summed; None for a server on another machine)."""

EF_SEARCH = (40, 100, 200)
"""``hnsw.ef_search`` values the plain-table rows are searched at (pgvector's default is 40, ragspec's 100)."""


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
    rows.append(Row("PostgreSQL HNSW", n, ingest, n / ingest, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), recall,
                    memory, store.hnsw.ef_search))  # fmt: skip
    ms, results = timed(lambda q: store.hybrid_search(q, k=10), query_texts)
    rows.append(Row("PostgreSQL hybrid (HNSW + BM25)", n, ingest, n / ingest, float(np.percentile(ms, 50)),
                    float(np.percentile(ms, 95)), float("nan"), memory, store.hnsw.ef_search))  # fmt: skip
    for kind in ("vector", "halfvec"):
        rows += bench_plain_table(url, n, f"ragspec_chunks_{store.collection_id}", kind, queries, truth)
    store.delete(None)
    store.close()
    server = server_mib(url)
    for row in rows:
        row.server_mib = server
    return rows


def bench_plain_table(url: str, n: int, chunks: str, kind: str, queries: np.ndarray, truth: list[set[int]]) -> list[Row]:
    """The vectors of the store's `chunks` table copied into a plain table as `kind` (``vector`` or ``halfvec``),
    its HNSW index built at once (m 16, ef_construction 64, as the store's), searched at each of ``EF_SEARCH``."""
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql

    table, ops = sql.Identifier(f"bench_{kind}_{n}"), sql.SQL({"vector": "vector_cosine_ops", "halfvec": "halfvec_cosine_ops"}[kind])
    column = sql.SQL("{}({})").format(sql.SQL(kind), sql.Literal(DIM))  # kind is one of the two names above
    rows = []
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        t0 = time.perf_counter()
        conn.execute(sql.SQL("CREATE TABLE {} AS SELECT id::integer AS id, embedding::{} AS embedding FROM {}")
                     .format(table, column, sql.Identifier(chunks)))  # fmt: skip
        load = time.perf_counter() - t0
        conn.execute("SELECT set_config('maintenance_work_mem', '1GB', false)")
        t0 = time.perf_counter()
        conn.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (embedding {}) WITH (m = 16, ef_construction = 64)").format(table, ops))
        build = time.perf_counter() - t0
        size = conn.execute("SELECT pg_total_relation_size(%s)", (f"bench_{kind}_{n}",)).fetchone()
        search = sql.SQL("SELECT id FROM {} ORDER BY embedding <=> %s::{} LIMIT 10").format(table, column)
        for ef in EF_SEARCH:
            conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(ef),))
            ms, results = timed(lambda q: conn.execute(search, (q,)).fetchall(), list(queries))
            recall = float(np.mean([len({int(i) for (i,) in r} & t) / 10 for r, t in zip(results, truth)]))
            rows.append(Row(f"PostgreSQL {kind} table, HNSW built at once", n, load + build, n / (load + build),
                            float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), recall,
                            float(size[0]) / 2**20 if size else 0.0, ef, build))  # fmt: skip
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
    return rows


def server_mib(url: str) -> float | None:
    """The PostgreSQL server's processes' memory (PSS, which counts shared buffers once), or None when it
    runs on another machine or its processes cannot be read."""
    import psutil
    import psycopg

    try:
        with psycopg.connect(url) as conn:  # the backend serving this connection exits when it closes
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            postmaster = psutil.Process(int(row[0])).parent() if row else None
        if postmaster is None:
            return None
        return (postmaster.memory_full_info().pss + sum(_pss(p) for p in postmaster.children())) / 2**20
    except (psutil.Error, OSError, AttributeError):
        return None


def _pss(process) -> int:
    """A server process's PSS; 0 for one that ended meanwhile (a worker's life is short)."""
    import psutil

    try:
        return int(process.memory_full_info().pss)
    except psutil.NoSuchProcess:
        return 0


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
    print("| store | chunks | ef_search | ingest chunks/s | index build s | query p50 ms | query p95 ms | recall@10 vs exact "
          "| table+index MiB (FAISS: RSS growth) | server MiB (PSS) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        recall = "-" if r.recall_at_10 != r.recall_at_10 else f"{r.recall_at_10:.3f}"
        optional = ["-" if v is None else f"{v:{spec}}" for v, spec in ((r.ef_search, "d"), (r.build_s, ".1f"), (r.server_mib, ".0f"))]
        print(f"| {r.store} | {r.n:,} | {optional[0]} | {r.chunks_per_s:,.0f} | {optional[1]} | {r.p50_ms:.1f} | {r.p95_ms:.1f} "
              f"| {recall} | {r.memory_mib:.0f} | {optional[2]} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
    args.out.write_text(json.dumps({"machine": machine, "rows": [asdict(r) for r in rows]}, indent=2, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
