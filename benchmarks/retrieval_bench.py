"""Retrieval benchmark: ingest throughput, flat vs HNSW query latency and recall, and QA retrieval recall.

Run from the repository root (offline; about 10 minutes on 2 busy CPU cores, most of it building HNSW at 100k):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_bench.py
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_bench.py --sizes 10000 --queries 100   # ~1.5 min
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_bench.py --parts reingest   # re-ingest times, 20 MiB file's peak RSS

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


# --- re-ingest: incremental updates, deduplication, memory -------------------------------------


@dataclass
class ReingestRow:
    what: str
    files: str
    passages: str
    seconds: float
    peak_rss_mib: float | None = None


def _reingest_folder(root: Path, n_files: int) -> Path:
    """`n_files` distinct documents: the corpus articles in turn, every paragraph tagged with its file's number."""
    articles = [p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.md")) + sorted(CORPUS.glob("*.txt"))]
    folder = root / "docs"
    folder.mkdir(parents=True)
    for i in range(n_files):
        paragraphs = articles[i % len(articles)].split("\n\n")
        (folder / f"doc{i:04d}.md").write_text("\n\n".join(f"[{i}] {p}" for p in paragraphs), encoding="utf-8")
    return folder


def _cli_ingest(folder: Path, index: Path) -> tuple[float, float, str]:
    """`ragspec ingest FOLDER --index INDEX` in a new process: (seconds, its peak RSS in MiB, its output)."""
    import subprocess

    # VmHWM: this process's own peak (ru_maxrss would include the benchmark's RSS at the fork on Linux).
    probe = ("import sys\nfrom apps.cli import main\ncode = main(sys.argv[1:])\n"
             "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM'))\n"
             "print('peak_rss_kib', hwm.split()[1])\nsys.exit(code)")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", probe, "ingest", str(folder), "--index", str(index), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"ragspec ingest failed: {done.stderr.strip()[-2000:]}")
    rss = next(int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("peak_rss_kib"))
    return seconds, rss / 1024, done.stdout


def _passages_line(output: str) -> str:
    return next((line.removeprefix("Passages: ") for line in output.splitlines() if line.startswith("Passages:")), "?")


def bench_reingest(n_files: int, big_mb: float) -> list[ReingestRow]:
    """Re-ingest times (unchanged folder, 1% of files changed) and a large repetitive file's time and peak RSS.

    A generated folder under a temporary directory; `sync_index` in this process (model loaded
    once) and `ragspec ingest` in new processes (what a user waits for: start-up, and the model
    load only when something is embedded).
    """
    import math
    import tempfile

    from retrievers import sync_index

    rows: list[ReingestRow] = []
    changed_per_run = max(1, math.ceil(n_files / 100))
    with tempfile.TemporaryDirectory(prefix="ragspec-reingest-") as tmp:
        root = Path(tmp)
        folder = _reingest_folder(root, n_files)
        index = root / "index"
        emb = default_embeddings()
        emb.embed_query("warm up")  # the model load is not part of the figures below

        def timed_sync(what: str) -> None:
            t0 = time.perf_counter()
            _, report = sync_index(folder, index, emb)
            seconds = time.perf_counter() - t0
            rows.append(ReingestRow(what, report.files_line(), f"{report.embedded} embedded of {report.chunks_read} read", seconds))
            print(f"  {what}: {seconds:.2f} s", flush=True)

        def change(run: int) -> None:
            for i in range(changed_per_run):
                path = folder / f"doc{(run * changed_per_run + i) % n_files:04d}.md"
                path.write_text(path.read_text(encoding="utf-8") + f"\n\nRevision {run}: one more paragraph.\n", encoding="utf-8")

        timed_sync(f"first ingest, {n_files} files (sync_index)")
        timed_sync("unchanged folder (sync_index)")
        seconds, rss, out = _cli_ingest(folder, index)
        rows.append(ReingestRow("unchanged folder (`ragspec ingest`, new process)", f"{n_files} unchanged", _passages_line(out), seconds, rss))
        change(1)
        timed_sync(f"{changed_per_run} of {n_files} files changed (sync_index)")
        change(2)
        seconds, rss, out = _cli_ingest(folder, index)
        rows.append(ReingestRow(f"{changed_per_run} of {n_files} files changed (`ragspec ingest`, new process)",
                                f"{changed_per_run} changed", _passages_line(out), seconds, rss))

        small = root / "small"
        small.mkdir()
        (small / "one.md").write_text(sorted(CORPUS.glob("*.md"))[0].read_text(encoding="utf-8"), encoding="utf-8")
        seconds, rss, out = _cli_ingest(small, root / "small-index")
        rows.append(ReingestRow("baseline: one 7 KB file (`ragspec ingest`, new process)", "1 new", _passages_line(out), seconds, rss))
        big = root / "big"
        big.mkdir()
        text = (CORPUS / "ledgerline-recovery-note.txt").read_text(encoding="utf-8") + "\n\n"
        with open(big / "big.txt", "w", encoding="utf-8") as f:
            for _ in range(int(big_mb * 2**20) // len(text) + 1):
                f.write(text)
        size = (big / "big.txt").stat().st_size / 2**20
        print(f"  ingesting a {size:.1f} MiB file...", flush=True)
        seconds, rss, out = _cli_ingest(big, root / "big-index")
        rows.append(ReingestRow(f"one {size:.0f} MiB file: one article repeated (`ragspec ingest`, new process)",
                                "1 new", _passages_line(out), seconds, rss))
    return rows


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
    parts = ["ingest", "recall", "reingest", "latency"]
    parser.add_argument("--parts", nargs="+", choices=parts, default=parts)
    parser.add_argument("--reingest-files", type=int, default=200, help="files in the generated folder for re-ingest (default 200)")
    parser.add_argument("--big-file-mb", type=float, default=20.0, help="size of the repetitive file for peak RSS (default 20)")
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

    reingest: list[ReingestRow] = []
    if "reingest" in args.parts:
        print(f"## Re-ingest and memory (default embeddings, chunk_size 256; a generated folder of {args.reingest_files} files)\n", flush=True)
        reingest = bench_reingest(args.reingest_files, args.big_file_mb)
        print("\n| run | files | passages | seconds | peak RSS MiB |\n|---|---|---|---|---|")
        for row in reingest:
            rss = "" if row.peak_rss_mib is None else f"{row.peak_rss_mib:.0f}"
            print(f"| {row.what} | {row.files} | {row.passages} | {row.seconds:.1f} | {rss} |")
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
        "reingest": [asdict(r) for r in reingest],
        "latency": [asdict(r) for r in latency],
        "recall": [asdict(r) for r in recall],
    }, indent=2))
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
