"""Embedding back ends: exported runtimes against PyTorch, the export cache, back end names, fingerprints.

The fast tests use a tiny randomly initialised BERT saved as a sentence-transformers model
(with the default model's tokenizer), so they export and run every back end in seconds,
offline. Tests marked ``integration`` use the bundled all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from langchain_core.documents import Document

import retrievers.embeddings as emb_mod
from retrievers import (
    BACKENDS,
    DEFAULT_MODEL_ID,
    EmbeddingModelError,
    FaissVectorStore,
    IndexMismatchError,
    SentenceTransformerEmbeddings,
    default_embeddings,
    default_model_path,
    embed_chunks,
    embeddings_fingerprint,
    split_documents,
)
from retrievers.chunking import default_max_tokens
from tests.helpers import run_in_threads

EXPORTED = [name for name in BACKENDS if name != "torch"]
TEXTS = [
    "The lighthouse keeper trims the lamp wick every evening.",
    "short",
    "",
    "Rye bread is denser than wheat bread; rye holds more water. " * 3,
    "word " * 200,  # longer than the tiny model's max_seq_length: truncated alike by every back end
]


def make_tiny_model(path: Path, seed: int = 0, max_seq_length: int = 64) -> Path:
    """A 2-layer BERT with random weights as a sentence-transformers directory (mean pooling, normalized)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-st")


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh export cache and an empty in-process model cache, restored afterwards."""
    monkeypatch.setenv("RAGSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(emb_mod, "_MODEL_CACHE", {})
    return tmp_path / "cache" / "embeddings"


@pytest.fixture()
def export_counter(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every real export (fp32 graph or int8 quantization)."""
    calls: list[str] = []
    real_export, real_quantize = emb_mod._export_onnx, emb_mod._quantize_int8

    def export(spec, out):
        calls.append("onnx")
        return real_export(spec, out)

    def quantize(source, out):
        calls.append("onnx-int8")
        return real_quantize(source, out)

    monkeypatch.setattr(emb_mod, "_export_onnx", export)
    monkeypatch.setattr(emb_mod, "_quantize_int8", quantize)
    return calls


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One export cache for the tests that only read from it."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("shared-cache")
        patch.setenv("RAGSPEC_CACHE_DIR", str(path))
        patch.setattr(emb_mod, "_MODEL_CACHE", {})
        yield path


@pytest.mark.parametrize(("backend", "min_cosine"), [("onnx", 0.9999), ("openvino", 0.9999), ("openvino-bf16", 0.999), ("onnx-int8", 0.999), ("openvino-int8", 0.99)])
def test_exported_backends_agree_with_torch(tiny_model: Path, shared_cache: Path, backend: str, min_cosine: float) -> None:
    torch_vectors = np.array(SentenceTransformerEmbeddings(str(tiny_model), backend="torch", device="cpu").embed_documents(TEXTS))
    got = np.array(SentenceTransformerEmbeddings(str(tiny_model), backend=backend).embed_documents(TEXTS))
    assert got.shape == torch_vectors.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosines(got, torch_vectors).min() >= min_cosine


def test_batching_and_length_sorting_keep_the_input_order(tiny_model: Path, shared_cache: Path) -> None:
    emb = SentenceTransformerEmbeddings(str(tiny_model), backend="onnx", batch_size=2)
    texts = [f"{'word ' * n}end {n}" for n in (7, 1, 30, 3, 3, 12, 0)]  # 7 texts: batches of 2, 2, 2 and 1
    together = np.array(emb.embed_documents(texts))
    one_by_one = np.array([emb.embed_query(t) for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)  # padding does not leak into the pooling
    assert emb.embed_documents([]) == []


def test_static_int8_gives_a_text_the_same_vector_whatever_it_is_batched_with(tiny_model: Path, shared_cache: Path) -> None:
    """openvino-int8's activation scales are calibrated once, so a vector does not depend on its batch."""
    emb = SentenceTransformerEmbeddings(str(tiny_model), backend="openvino-int8", batch_size=3)
    texts = [f"{'word ' * n}end {n}" for n in (7, 1, 30, 3, 12)] + TEXTS
    together = np.array(emb.embed_documents(texts))
    one_by_one = np.array([emb.embed_query(t) for t in texts])
    assert cosines(together, one_by_one).min() > 0.9999
    directory = emb_mod.export_dir(str(tiny_model), "openvino-int8")
    assert directory.name.split("-")[-2:-1] == ["qdq"]
    assert b"DequantizeLinear" in (directory / "model.onnx").read_bytes()


def test_batches_are_balanced_over_the_runtime_lanes(tiny_model: Path, shared_cache: Path) -> None:
    """With two lanes (OpenVINO streams), 33 texts go as 17 + 16, not 32 + 1 that would idle a core."""
    seen: list[list[int]] = []

    class TwoLanes:
        parallelism = 2

        def __call__(self, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
            seen.append([b["input_ids"].shape[0] for b in batches])
            return [np.ones((b["input_ids"].shape[0], 4), dtype=np.float32) for b in batches]

    encoder = emb_mod._ExportedEncoder(emb_mod.export_dir(str(tiny_model), "onnx"), TwoLanes())
    for n, batch_size, expected in [(33, 32, [[17, 16]]), (66, 32, [[17, 17, 16, 16]]), (3, 32, [[2, 1]]), (1, 32, [[1]]),
                                    (200, 16, [[15] * 4 + [14] * 4, [14] * 6])]:
        seen.clear()
        assert encoder.encode(["some text"] * n, batch_size, False).shape == (n, 4)
        assert seen == expected, n


def test_export_happens_once_and_is_reused(tiny_model: Path, cache_dir: Path, export_counter: list[str]) -> None:
    first = np.array(SentenceTransformerEmbeddings(str(tiny_model), backend="openvino").embed_documents(TEXTS))
    assert export_counter == ["onnx"]
    (entry,) = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    assert entry.name.startswith("tiny-st-onnx-")
    mtime = (entry / "model.onnx").stat().st_mtime_ns

    emb_mod._MODEL_CACHE.clear()  # as in a new process: only the disk cache is left
    again = np.array(SentenceTransformerEmbeddings(str(tiny_model), backend="openvino").embed_documents(TEXTS))
    SentenceTransformerEmbeddings(str(tiny_model), backend="onnx").embed_query("the same fp32 graph")
    assert export_counter == ["onnx"]
    assert (entry / "model.onnx").stat().st_mtime_ns == mtime
    np.testing.assert_allclose(again, first, atol=1e-6)

    SentenceTransformerEmbeddings(str(tiny_model), backend="onnx-int8").embed_query("quantized from the cached graph")
    assert export_counter == ["onnx", "onnx-int8"]
    assert sorted(p.name.split("-")[2] for p in cache_dir.iterdir() if not p.name.startswith(".")) == ["onnx", "onnx"]


def test_cache_is_keyed_by_the_model_files(tmp_path: Path, cache_dir: Path, export_counter: list[str]) -> None:
    model = make_tiny_model(tmp_path / "m", seed=1)
    before = np.array(SentenceTransformerEmbeddings(str(model), backend="onnx").embed_documents(TEXTS))
    make_tiny_model_weights = make_tiny_model(tmp_path / "other", seed=2)
    shutil.copy2(make_tiny_model_weights / "model.safetensors", model / "model.safetensors")  # same folder, new weights
    emb_mod._MODEL_CACHE.clear()
    after = np.array(SentenceTransformerEmbeddings(str(model), backend="onnx").embed_documents(TEXTS))
    assert export_counter == ["onnx", "onnx"]
    assert len([p for p in cache_dir.iterdir() if not p.name.startswith(".")]) == 2
    assert cosines(before, after).min() < 0.99  # not served the stale export
    reference = np.array(SentenceTransformerEmbeddings(str(model), backend="torch", device="cpu").embed_documents(TEXTS))
    assert cosines(after, reference).min() > 0.9999


def test_failed_export_leaves_no_entry(tiny_model: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path, pooled, tokenizer):
        raise EmbeddingModelError("the ONNX export disagrees with PyTorch")

    real = emb_mod._check_export
    monkeypatch.setattr(emb_mod, "_check_export", broken)
    with pytest.raises(EmbeddingModelError, match="disagrees"):
        SentenceTransformerEmbeddings(str(tiny_model), backend="onnx").embed_query("x")
    assert not cache_dir.exists() or list(cache_dir.iterdir()) == []  # no entry, not even a temporary one
    monkeypatch.setattr(emb_mod, "_check_export", real)
    assert len(SentenceTransformerEmbeddings(str(tiny_model), backend="onnx").embed_query("x")) == 32
    assert len(list(cache_dir.iterdir())) == 1


def test_unknown_backend_and_bad_device_are_rejected_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unknown embeddings backend 'onnxx'.*openvino-bf16"):
        SentenceTransformerEmbeddings("default", backend="onnxx")
    with pytest.raises(ValueError, match=r"unknown embeddings backend 'fast'.*RAGSPEC_EMBEDDINGS_BACKEND"):
        monkeypatch.setenv("RAGSPEC_EMBEDDINGS_BACKEND", "fast")
        default_embeddings()
    monkeypatch.setenv("RAGSPEC_EMBEDDINGS_BACKEND", "onnx")
    assert default_embeddings().backend == "onnx"
    assert default_embeddings(backend="torch").backend == "torch"  # an argument beats the variable
    with pytest.raises(ValueError, match="runs on the CPU"):
        SentenceTransformerEmbeddings("default", backend="openvino", device="cuda")
    assert SentenceTransformerEmbeddings("default", backend="auto", device="cuda").resolved_backend == "torch"
    assert SentenceTransformerEmbeddings("default", backend="auto", device="cpu").resolved_backend == emb_mod.cpu_backend()


AVX2_EPYC = frozenset("fpu sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2 sha_ni".split())  # the AMD EPYC: no AVX-512
SAPPHIRE_RAPIDS = AVX2_EPYC | {"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(AVX2_EPYC, "openvino"), (SAPPHIRE_RAPIDS, "openvino-bf16"), (AVX2_EPYC | {"amx_bf16"}, "openvino-bf16"), (frozenset(), "openvino")],
)
def test_auto_takes_bf16_only_on_a_cpu_that_computes_it(
    flags: frozenset[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert emb_mod.cpu_backend(flags) == expected
    monkeypatch.setattr(emb_mod, "cpu_flags", lambda: flags)  # the probe, faked
    assert emb_mod.cpu_backend() == expected
    assert SentenceTransformerEmbeddings("default", backend="auto", device="cpu").resolved_backend == expected
    assert SentenceTransformerEmbeddings("default", backend="openvino-bf16").resolved_backend == "openvino-bf16"  # asked for: kept


def test_the_cpu_probe_reads_this_machines_flags() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        assert emb_mod.cpu_flags() == frozenset()
        return
    line = next((x for x in cpuinfo.read_text().splitlines() if x.startswith(("flags", "Features"))), "")
    assert emb_mod.cpu_flags() == frozenset(line.partition(":")[2].split())


def test_models_the_exported_backends_cannot_reproduce_are_refused(tiny_model: Path, tmp_path: Path, cache_dir: Path) -> None:
    model = tmp_path / "dense-head"
    shutil.copytree(tiny_model, model)
    modules = json.loads((model / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (model / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(EmbeddingModelError, match=r"Dense.*backend='torch'"):
        SentenceTransformerEmbeddings(str(model), backend="openvino").embed_query("x")


def test_fingerprint_names_the_model_not_the_backend(tiny_model: Path, tmp_path: Path, cache_dir: Path) -> None:
    prints = {b: embeddings_fingerprint(SentenceTransformerEmbeddings("default", backend=b)) for b in BACKENDS}
    assert set(prints.values()) == {DEFAULT_MODEL_ID}
    # Two local models in folders of the same name are told apart by their files.
    other = make_tiny_model(tmp_path / "elsewhere" / tiny_model.name, seed=3)
    a = embeddings_fingerprint(SentenceTransformerEmbeddings(str(tiny_model), backend="onnx"))
    b = embeddings_fingerprint(SentenceTransformerEmbeddings(str(other), backend="onnx"))
    assert a.startswith("tiny-st@") and b.startswith("tiny-st@") and a != b
    assert a == embeddings_fingerprint(SentenceTransformerEmbeddings(str(tiny_model), backend="torch"))


def test_an_index_built_with_torch_loads_and_searches_with_openvino(tiny_model: Path, tmp_path: Path, cache_dir: Path) -> None:
    docs = [Document(id=f"d{i}", page_content=t) for i, t in enumerate(TEXTS[:4] + ["bread and water", "lamp oil"])]
    store = FaissVectorStore(SentenceTransformerEmbeddings(str(tiny_model), backend="torch", device="cpu"))
    store.add_documents(docs)
    store.save(tmp_path / "index")
    loaded = FaissVectorStore.load(tmp_path / "index", SentenceTransformerEmbeddings(str(tiny_model), backend="openvino"))
    for doc in docs:
        assert loaded.similarity_search(doc.page_content, k=1)[0].id == doc.id
    other = make_tiny_model(tmp_path / "other-model", seed=4)
    with pytest.raises(IndexMismatchError):
        FaissVectorStore.load(tmp_path / "index", SentenceTransformerEmbeddings(str(other), backend="openvino"))


def test_embed_chunks_embeds_the_header_and_text() -> None:
    class Recording:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.seen += texts
            return [[float(len(t)), 1.0] for t in texts]

    doc = Document(page_content="Replay starts at the last checkpoint.", metadata={"source": "notes/ledgerline-wal.txt"})
    (chunk,) = split_documents([doc], chunk_size=64, chunk_overlap=0)
    recorder = Recording()
    embed_chunks(recorder, [chunk])  # type: ignore[arg-type]
    assert recorder.seen == ["ledgerline wal\n\nReplay starts at the last checkpoint."]
    assert chunk.page_content == doc.page_content


@pytest.mark.integration
def test_default_backend_matches_torch_on_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv(emb_mod.BACKEND_ENV, raising=False)
    default = default_embeddings()
    assert default.resolved_backend == ("torch" if torch.cuda.is_available() else emb_mod.cpu_backend())
    chunks = split_documents([Document(page_content=("A long passage about lighthouses and bread. " * 80), metadata={"source": "x.txt"})])
    texts = [TEXTS[0], "How do I restore a snapshot?", chunks[0].page_content]
    reference = np.array(default_embeddings("torch").embed_documents(texts))
    for backend in ("openvino-bf16", "openvino", "onnx"):
        got = np.array(default_embeddings(backend).embed_documents(texts))
        assert cosines(got, reference).min() >= 0.99, backend
    int8 = np.array(default_embeddings("onnx-int8").embed_documents(texts))
    assert cosines(int8, reference).min() >= 0.95
    assert default_embeddings("openvino-bf16").client.max_seq_length == default_max_tokens() == 256



@pytest.mark.timeout(300)
def test_openvino_encoders_are_freed_and_shared_between_threads_without_deadlock(tiny_model: Path, shared_cache: Path) -> None:
    """Encoders dropped while others run (the export-cache test hung on this once: a Python
    callback on OpenVINO's stream threads waited for the GIL that the freeing thread held), and
    one encoder used from several threads at once."""
    texts = [f"text number {i} " * (1 + i % 5) for i in range(40)]
    for _ in range(6):
        emb_mod._MODEL_CACHE.clear()  # the previous encoder is freed while a new one is built and used
        emb = SentenceTransformerEmbeddings(str(tiny_model), backend="openvino", batch_size=8)
        want = np.array(emb.embed_documents(texts))

    def use() -> None:
        for _ in range(3):
            np.testing.assert_allclose(np.array(emb.embed_documents(texts)), want, atol=1e-5)
            emb.embed_query("a query while another thread embeds")

    assert run_in_threads(use, use, use) == []
