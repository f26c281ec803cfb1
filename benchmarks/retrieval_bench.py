"""Retrieval benchmark: embedding back ends (chunks/s, agreement, recall), QA retrieval recall before and
after contextual headers and score fusion, ingest throughput, flat vs HNSW query latency and recall.

Run from the repository root (offline):

    .venv/bin/python benchmarks/retrieval_bench.py --quick      # back ends and recall, a few minutes
    .venv/bin/python benchmarks/retrieval_bench.py              # everything, ~25 min on 2 busy cores
    .venv/bin/python benchmarks/retrieval_bench.py --parts reingest   # re-ingest times, 20 MiB file's peak RSS

Timings on a shared machine are noisy: the back ends are timed in interleaved rounds (each round
runs every back end once, in a rotating order) and compared by their ratio to PyTorch within the
same round, and by chunks per CPU-second of this process, which other processes disturb less.
Prints Markdown tables and writes the figures as JSON (default bench-out/retrieval.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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
    BACKENDS,
    BM25Retriever,
    FaissVectorStore,
    FlatIndex,
    HNSWIndex,
    HybridRetriever,
    contextual_text,
    default_embeddings,
    embed_chunks,
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
    setup: str
    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    mrr_at_10: float


@dataclass
class BackendResult:
    backend: str
    batch_size: int
    load_s: float
    best_chunks_per_s: float
    median_chunks_per_s: float
    median_ratio_to_torch: float
    chunks_per_cpu_s: float
    min_cosine_to_torch: float
    dense: tuple[float, float, float]
    hybrid: tuple[float, float, float]
    dense_on_torch_index: tuple[float, float, float]


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


# --- QA retrieval recall ---------------------------------------------------------------------

TOP_K = 10


def _questions() -> list[dict]:
    return json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]


def _relevant(chunk, question: dict) -> bool:
    return Path(chunk.metadata["source"]).name == question["source"] and question["span"] in chunk.page_content


def _rank_stats(ranks: list[int | None]) -> tuple[float, float, float, float]:
    """recall@1, @5, @10 and MRR@10 from the rank of the first relevant chunk (None: not in the top 10)."""
    r = [x if x is not None else TOP_K + 1 for x in ranks]
    return (
        float(np.mean([x == 1 for x in r])),
        float(np.mean([x <= 5 for x in r])),
        float(np.mean([x <= 10 for x in r])),
        float(np.mean([1 / x if x <= TOP_K else 0.0 for x in r])),
    )


def _ranks(search, questions: list[dict]) -> list[int | None]:
    out = []
    for q in questions:
        got = search(q["question"])
        out.append(next((i for i, c in enumerate(got, 1) if _relevant(c, q)), None))
    return out


def _dense_store(embeddings, chunks, headers: bool) -> FaissVectorStore:
    """A flat store of the chunks; their vectors are of `contextual_text` (`embed_chunks`) with
    `headers`, of the chunk's text alone without."""
    store = FaissVectorStore(embeddings)
    texts = [c.page_content for c in chunks]
    vectors = embed_chunks(embeddings, chunks) if headers else embeddings.embed_documents(texts)
    store.add_embeddings(texts, vectors, [c.metadata for c in chunks], [c.id for c in chunks])
    return store


def bench_recall(chunk_sizes: list[int], after_backend: str) -> list[RecallResult]:
    """Dense, BM25 and hybrid recall before (torch, no headers, RRF) and after (default back end,
    contextual headers, relative score fusion), plus each change on its own."""
    questions = _questions()
    loaded = load_documents(CORPUS)
    results: list[RecallResult] = []
    for size in chunk_sizes:
        plain = split_documents(loaded.documents, chunk_size=size, chunk_overlap=size // 8, headers=False)
        headed = split_documents(loaded.documents, chunk_size=size, chunk_overlap=size // 8)
        before_store = _dense_store(default_embeddings("torch"), plain, headers=False)
        after_store = _dense_store(default_embeddings(after_backend), headed, headers=True)
        no_dense_header = _dense_store(default_embeddings(after_backend), headed, headers=False)

        def hybrid(store, chunks, fusion):
            return HybridRetriever(vectorstore=store, documents=chunks, k=TOP_K, fusion=fusion).invoke

        setups = [
            ("dense", "before", lambda q: before_store.similarity_search(q, k=TOP_K), plain),
            ("dense", "after", lambda q: after_store.similarity_search(q, k=TOP_K), headed),
            ("BM25", "before", BM25Retriever(documents=plain, k=TOP_K).invoke, plain),
            ("BM25", "after", BM25Retriever(documents=headed, k=TOP_K).invoke, headed),
            ("hybrid", "before", hybrid(before_store, plain, "rrf"), plain),
            ("hybrid", "after", hybrid(after_store, headed, "relative_score"), headed),
            ("hybrid", "headers only (RRF)", hybrid(after_store, headed, "rrf"), headed),
            ("hybrid", "score fusion only (no headers)", hybrid(_dense_store(default_embeddings(after_backend), plain, False), plain, "relative_score"), plain),
            ("hybrid", "after, dense without header", hybrid(no_dense_header, headed, "relative_score"), headed),
        ]
        for method, setup, search, chunks in setups:
            results.append(RecallResult(size, len(chunks), method, setup, *_rank_stats(_ranks(search, questions))))
    return results


# --- embedding back ends -----------------------------------------------------------------------


class _OtherLoad:
    """Share of the machine's CPU time that other processes used between two calls (Linux /proc/stat)."""

    def __init__(self) -> None:
        self.mark()

    @staticmethod
    def _busy_s() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:8]]
        except (OSError, ValueError):
            return None
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    def mark(self) -> None:
        self.busy, self.ours, self.wall = self._busy_s(), time.process_time(), time.perf_counter()

    def since_mark(self) -> float | None:
        busy, ours, wall = self._busy_s(), time.process_time(), time.perf_counter()
        if busy is None or self.busy is None:
            return None
        share = ((busy - self.busy) - (ours - self.ours)) / max(1e-9, (wall - self.wall) * (os.cpu_count() or 1))
        self.mark()
        return max(0.0, share)


def bench_backends(backends: list[str], rounds: int, passes: int) -> tuple[list[BackendResult], dict]:
    """Time each back end on the corpus chunks (default size, as embedded: header + text) in
    interleaved rounds; check its vectors against PyTorch's; measure its recall."""
    questions = _questions()
    chunks = split_documents(load_documents(CORPUS).documents)
    texts = [contextual_text(c) for c in chunks]
    workload = texts * passes  # the encoders cache nothing, so repeats cost the same
    configs = [("torch", 32)] + [(b, 32) for b in backends if b != "torch"]
    if "torch" in backends:
        configs.insert(1, ("torch", 64))  # a larger batch (sentence-transformers already sorts by length)
    models, load_s = {}, {}
    for name, batch in configs:
        t0 = time.perf_counter()
        emb = default_embeddings(name)
        emb.batch_size = batch
        emb.show_progress = False
        emb.embed_query("warm up")  # exports once if needed, loads, and builds kernels for this shape
        emb.embed_documents(texts[:8])
        models[(name, batch)], load_s[(name, batch)] = emb, time.perf_counter() - t0
    wall: dict = {c: [] for c in configs}
    cpu: dict = {c: [] for c in configs}
    shares = []
    others = _OtherLoad()
    for r in range(rounds):
        for i in range(len(configs)):
            config = configs[(i + r) % len(configs)]
            t0, c0 = time.perf_counter(), time.process_time()
            models[config].embed_documents(workload)
            wall[config].append(len(workload) / (time.perf_counter() - t0))
            cpu[config].append(len(workload) / (time.process_time() - c0))
        shares.append(others.since_mark())
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n}/{b} {wall[(n, b)][-1]:.1f}" for n, b in configs), flush=True)

    reference = models[("torch", 32)]
    ref_chunks = np.array(reference.embed_documents(texts))
    ref_queries = np.array(reference.embed_documents([q["question"] for q in questions]))
    torch_index = _dense_store(reference, chunks, headers=True)
    base = wall[("torch", 32)]
    results = []
    for (name, batch), emb in models.items():
        vectors = np.array(emb.embed_documents(texts))
        queries = np.array(emb.embed_documents([q["question"] for q in questions]))
        cosine = float(min(np.min(np.sum(vectors * ref_chunks, 1)), np.min(np.sum(queries * ref_queries, 1))))
        store = _dense_store(emb, chunks, headers=True)
        dense = _rank_stats(_ranks(lambda q: store.similarity_search(q, k=TOP_K), questions))[:3]
        hybrid_search = HybridRetriever(vectorstore=store, documents=chunks, k=TOP_K).invoke
        hybrid = _rank_stats(_ranks(hybrid_search, questions))[:3]
        by_vector = {q["question"]: v for q, v in zip(questions, queries)}
        mixed = _rank_stats(_ranks(lambda q: [d for d, _ in torch_index.similarity_search_with_score_by_vector(by_vector[q], k=TOP_K)], questions))[:3]
        results.append(BackendResult(
            name, batch, load_s[(name, batch)], max(wall[(name, batch)]), statistics.median(wall[(name, batch)]),
            statistics.median(w / b for w, b in zip(wall[(name, batch)], base)), statistics.median(cpu[(name, batch)]),
            cosine, dense, hybrid, mixed,
        ))
    context = {"texts": len(workload), "chunks": len(chunks), "rounds": rounds, "other_processes_cpu_share_per_round": shares,
               "mean_tokens": float(np.mean([len(t.split()) for t in texts]))}
    return results, context


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


def _fmt(triple: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in triple)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="back ends and recall only, fewer rounds (a few minutes)")
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5, quick 3)")
    parser.add_argument("--embed-passes", type=int, default=None, help="times the corpus is embedded per round (default 4, quick 2)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="index sizes for latency")
    parser.add_argument("--queries", type=int, default=200, help="queries per latency measurement")
    parser.add_argument("--passes", type=int, default=4, help="times the corpus chunks are embedded for ingest throughput")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=None, help="for recall (default 256 128, quick 256)")
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--ef-search", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads for the timed queries (1: no sync overhead)")
    parser.add_argument("--data", nargs="+", choices=["random", "clustered"], default=["random", "clustered"])
    parts = ["backends", "recall", "ingest", "reingest", "latency"]
    parser.add_argument("--parts", nargs="+", choices=parts, default=None, help="default: all (quick: backends recall)")
    parser.add_argument("--reingest-files", type=int, default=200, help="files in the generated folder for re-ingest (default 200)")
    parser.add_argument("--big-file-mb", type=float, default=20.0, help="size of the repetitive file for peak RSS (default 20)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "retrieval.json")
    args = parser.parse_args()
    quick = args.quick
    args.parts = args.parts or (["backends", "recall"] if quick else parts)
    args.rounds = args.rounds or (3 if quick else 5)
    args.embed_passes = args.embed_passes or (2 if quick else 4)
    args.chunk_sizes = args.chunk_sizes or ([256] if quick else [256, 128])

    print(f"# Retrieval benchmark ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads)\n")
    print(f"command: {' '.join(['python', *sys.argv])}\n")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load:
        print(f"load average at start: {load[0]:.1f} (figures are noisy when it exceeds the CPU count)\n")

    backend_results, backend_context = [], {}
    if "backends" in args.parts:
        print(f"## Embedding back ends (all-MiniLM-L6-v2, chunk_size 256, {args.rounds} interleaved rounds)\n", flush=True)
        backend_results, backend_context = bench_backends(args.backends, args.rounds, args.embed_passes)
        busy = [b for b in backend_context["other_processes_cpu_share_per_round"] if b is not None]
        share = f"; other processes used {min(busy):.0%}-{max(busy):.0%} of the CPUs during the rounds" if busy else ""
        print(f"\n{backend_context['texts']} texts per timing ({backend_context['chunks']} chunks x {args.embed_passes}){share}\n")
        print("| back end | batch | chunks/s best | chunks/s median | x torch (median of rounds) | chunks per CPU-s | "
              "min cosine to torch | dense R@1/5/10 | hybrid R@1/5/10 | its queries on a torch index R@1/5/10 | load s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in backend_results:
            print(f"| {r.backend} | {r.batch_size} | {r.best_chunks_per_s:.1f} | {r.median_chunks_per_s:.1f} | "
                  f"{r.median_ratio_to_torch:.2f} | {r.chunks_per_cpu_s:.1f} | {r.min_cosine_to_torch:.5f} | "
                  f"{_fmt(r.dense)} | {_fmt(r.hybrid)} | {_fmt(r.dense_on_torch_index)} | {r.load_s:.1f} |")
        print(flush=True)

    recall = []
    if "recall" in args.parts:
        after_backend = default_embeddings().resolved_backend
        recall = bench_recall(args.chunk_sizes, after_backend)
        print(f"## Retrieval recall on retrievers/data/questions.json ({len(_questions())} questions)\n")
        print("before: torch, chunks without headers, hybrid by RRF; "
              f"after: {after_backend}, contextual headers (embedded and BM25-indexed), hybrid by relative score fusion\n")
        print("| chunk size | chunks | method | setup | recall@1 | recall@5 | recall@10 | MRR@10 |\n|---|---|---|---|---|---|---|---|")
        for r in recall:
            print(f"| {r.chunk_size} | {r.chunks} | {r.method} | {r.setup} | {r.recall_at_1:.3f} | {r.recall_at_5:.3f} | "
                  f"{r.recall_at_10:.3f} | {r.mrr_at_10:.3f} |")
        print(flush=True)

    ingest = bench_ingest(args.passes) if "ingest" in args.parts else None
    if ingest:
        print(f"## Ingest (default embeddings, chunk_size 256)\n")
        print(f"- {ingest.documents} documents loaded and split into {ingest.chunks_per_pass} chunks in {ingest.load_split_s:.2f} s")
        print(f"- model load {ingest.model_load_s:.1f} s (once per process)")
        print(f"- embed + index {ingest.chunks_per_pass * ingest.passes} chunks in {ingest.embed_index_s:.1f} s: "
              f"**{ingest.chunks_per_s:.1f} chunks/s**\n", flush=True)

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
        "command": sys.argv,
        "load_average_at_start": load[0] if load else None,
        "backends": [asdict(r) for r in backend_results],
        "backends_context": backend_context,
        "recall": [asdict(r) for r in recall],
        "ingest": asdict(ingest) if ingest else None,
        "reingest": [asdict(r) for r in reingest],
        "latency": [asdict(r) for r in latency],
    }, indent=2))
    print(f"\nfigures written to {args.out}")


if __name__ == "__main__":
    main()
