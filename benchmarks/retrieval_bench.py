"""Retrieval benchmark: ingest throughput, flat vs HNSW query latency and recall, and QA retrieval recall.

Run from the repository root (offline; about 10 minutes on 2 busy CPU cores, most of it building HNSW at 100k):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_bench.py
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_bench.py --sizes 10000 --queries 100   # ~1.5 min

Prints Markdown tables and writes the figures as JSON (default bench-out/retrieval.json).
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import faiss  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from retrievers import (  # noqa: E402
    BM25Retriever,
    FaissVectorStore,
    FlatIndex,
    HNSWIndex,
    HybridRetriever,
    default_embeddings,
    load_documents,
    split_documents,
)

CORPUS = REPO / "retrievers" / "data" / "corpus"
QUESTIONS = REPO / "retrievers" / "data" / "questions.json"


@dataclass
class IngestResult:
    documents: int
    chunks_per_pass: int
    passes: int
    load_split_s: float
    model_load_s: float
    embed_index_s: float
    chunks_per_s: float


@dataclass
class LatencyResult:
    data: str
    n: int
    index: str
    build_s: float
    p50_ms: float
    p95_ms: float
    recall_at_10: float | None


@dataclass
class RecallResult:
    chunk_size: int
    chunks: int
    method: str
    recall_at_1: float
    recall_at_5: float
    mrr_at_5: float


def bench_ingest(passes: int) -> IngestResult:
    t0 = time.perf_counter()
    loaded = load_documents(CORPUS)
    chunks = split_documents(loaded.documents)
    load_split = time.perf_counter() - t0
    emb = default_embeddings()
    t0 = time.perf_counter()
    emb.embed_query("warm up")  # loads the model once per process
    model_load = time.perf_counter() - t0
    texts = [c.page_content for c in chunks] * passes
    store = FaissVectorStore(emb)
    t0 = time.perf_counter()
    store.add_texts(texts)  # the same chunks several times: the encoder does not cache, so this is fair
    embed_index = time.perf_counter() - t0
    return IngestResult(
        len(loaded.documents), len(chunks), passes, load_split, model_load, embed_index, len(texts) / embed_index
    )


def make_vectors(kind: str, n: int, n_queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Data and queries. "random": isotropic Gaussian, the worst case for graph indexes.
    "clustered": a mixture of n/100 Gaussian clusters, data and queries drawn alike,
    closer to real sentence embeddings, whose neighbours are far closer than random pairs."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.standard_normal((n, dim)).astype("float32"), rng.standard_normal((n_queries, dim)).astype("float32")
    centers = rng.standard_normal((max(1, n // 100), dim)).astype("float32")

    def draw(m: int) -> np.ndarray:
        return (centers[rng.integers(len(centers), size=m)] + 0.5 * rng.standard_normal((m, dim))).astype("float32")

    return draw(n), draw(n_queries)


def bench_latency(
    n: int, n_queries: int, dim: int, hnsw: HNSWIndex, ef_values: list[int], threads: int, data_kind: str, seed: int = 0
) -> list[LatencyResult]:
    """Build flat and HNSW stores on the same vectors; time single queries through the store API."""
    data, queries = make_vectors(data_kind, n, n_queries, dim, seed)
    texts, ids = [""] * n, [str(i) for i in range(n)]
    build_threads = faiss.omp_get_max_threads()

    def build(config) -> tuple[FaissVectorStore, float]:
        faiss.omp_set_num_threads(build_threads)
        store = FaissVectorStore(default_embeddings(), index=config)  # embeddings unused: vectors are given
        t0 = time.perf_counter()
        store.add_embeddings(texts, data, ids=ids)
        return store, time.perf_counter() - t0

    def run(store: FaissVectorStore) -> tuple[np.ndarray, list[set[str]]]:
        faiss.omp_set_num_threads(threads)
        times, found = [], []
        for q in queries:
            t0 = time.perf_counter()
            hits = store.similarity_search_with_score_by_vector(q, k=10)
            times.append(time.perf_counter() - t0)
            found.append({d.id for d, _ in hits})
        return np.array(times) * 1000, found

    flat, flat_build = build(FlatIndex())
    ms, truth = run(flat)
    results = [LatencyResult(data_kind, n, "flat", flat_build, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), None)]
    del flat
    store, hnsw_build = build(hnsw)
    for ef in ef_values:
        store.index_config = HNSWIndex(m=hnsw.m, ef_construction=hnsw.ef_construction, ef_search=ef)
        ms, found = run(store)
        recall = float(np.mean([len(f & t) / 10 for f, t in zip(found, truth)]))
        name = f"hnsw m={hnsw.m} efC={hnsw.ef_construction} ef={ef}"
        results.append(LatencyResult(data_kind, n, name, hnsw_build, float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), recall))
    faiss.omp_set_num_threads(build_threads)
    return results


def bench_recall(chunk_sizes: list[int]) -> list[RecallResult]:
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    loaded = load_documents(CORPUS)
    results: list[RecallResult] = []
    for size in chunk_sizes:
        chunks = split_documents(loaded.documents, chunk_size=size, chunk_overlap=size // 8)
        store = FaissVectorStore(default_embeddings())
        store.add_documents(chunks)
        methods = {
            "dense": store.as_retriever(search_kwargs={"k": 5}),
            "bm25": BM25Retriever(documents=chunks, k=5),
            "hybrid (RRF)": HybridRetriever(vectorstore=store, documents=chunks, k=5),
        }
        for method, retriever in methods.items():
            ranks = []
            for q in questions:
                got = retriever.invoke(q["question"])
                rank = next((i for i, c in enumerate(got, 1) if _relevant(c, q)), None)
                ranks.append(rank)
            r1 = np.mean([r == 1 for r in ranks])
            r5 = np.mean([r is not None and r <= 5 for r in ranks])
            mrr = np.mean([1 / r if r else 0.0 for r in ranks])
            results.append(RecallResult(size, len(chunks), method, float(r1), float(r5), float(mrr)))
    return results


def _relevant(chunk, question: dict) -> bool:
    return Path(chunk.metadata["source"]).name == question["source"] and question["span"] in chunk.page_content


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="index sizes for latency")
    parser.add_argument("--queries", type=int, default=200, help="queries per latency measurement")
    parser.add_argument("--passes", type=int, default=4, help="times the corpus chunks are embedded for throughput")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--ef-search", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads for the timed queries (1: no sync overhead)")
    parser.add_argument("--data", nargs="+", choices=["random", "clustered"], default=["random", "clustered"])
    parser.add_argument("--parts", nargs="+", choices=["ingest", "recall", "latency"], default=["ingest", "recall", "latency"])
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "retrieval.json")
    args = parser.parse_args()

    print(f"# Retrieval benchmark ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads)\n")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"load average at start: {load[0]:.1f} (figures are noisy when it exceeds the CPU count)\n")

    ingest = bench_ingest(args.passes) if "ingest" in args.parts else None
    if ingest:
        print("## Ingest (default model all-MiniLM-L6-v2, chunk_size 256)\n")
        print(f"- {ingest.documents} documents loaded and split into {ingest.chunks_per_pass} chunks in {ingest.load_split_s:.2f} s")
        print(f"- model load {ingest.model_load_s:.1f} s (once per process)")
        print(f"- embed + index {ingest.chunks_per_pass * ingest.passes} chunks in {ingest.embed_index_s:.1f} s: "
              f"**{ingest.chunks_per_s:.1f} chunks/s**\n", flush=True)

    recall = bench_recall(args.chunk_sizes) if "recall" in args.parts else []
    if recall:
        print("## Retrieval recall on retrievers/data/questions.json\n")
        print("| chunk size | chunks | method | recall@1 | recall@5 | MRR@5 |\n|---|---|---|---|---|---|")
    for r in recall:
        print(f"| {r.chunk_size} | {r.chunks} | {r.method} | {r.recall_at_1:.2f} | {r.recall_at_5:.2f} | {r.mrr_at_5:.2f} |")
    print(flush=True)

    hnsw = HNSWIndex(m=args.m, ef_construction=args.ef_construction)
    latency: list[LatencyResult] = []
    if "latency" in args.parts:
        print(f"## Query latency, k=10, dim 384, one query at a time, {args.threads} thread(s)\n")
        print("| data | vectors | index | build s | p50 ms | p95 ms | recall@10 vs flat |\n|---|---|---|---|---|---|---|")
    for kind in args.data if "latency" in args.parts else []:
        for n in args.sizes:
            for r in bench_latency(n, args.queries, 384, hnsw, args.ef_search, args.threads, kind):
                latency.append(r)
                rec = "exact" if r.recall_at_10 is None else f"{r.recall_at_10:.3f}"
                print(f"| {r.data} | {r.n:,} | {r.index} | {r.build_s:.1f} | {r.p50_ms:.2f} | {r.p95_ms:.2f} | {rec} |", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "load_average_at_start": load[0] if load else None,
        "ingest": asdict(ingest) if ingest else None,
        "latency": [asdict(r) for r in latency],
        "recall": [asdict(r) for r in recall],
    }, indent=2))
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
