"""Saving and loading FaissVectorStore: round trips, no pickle, clear errors, atomic saves."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import faiss
import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

from retrievers import (
    FORMAT_VERSION,
    DimensionMismatchError,
    FaissVectorStore,
    FlatIndex,
    HNSWIndex,
    IndexCorruptError,
    IndexLoadError,
    IndexMismatchError,
    IndexNotFoundError,
    IndexSaveError,
    IndexVersionError,
    SentenceTransformerEmbeddings,
)
from retrievers import persistence

EMB = DeterministicFakeEmbedding(size=8)
TEXTS = ["red apple", "green pear", "yellow banana", "purple plum", "orange orange"]


def build(index=None) -> FaissVectorStore:
    store = FaissVectorStore(EMB, index=index)
    store.add_documents(
        [Document(page_content=t, metadata={"n": i, "tags": ["fruit"], "nested": {"x": 1.5}}) for i, t in enumerate(TEXTS)],
        ids=[f"id{i}" for i in range(len(TEXTS))],
    )
    return store


def snapshot(store: FaissVectorStore) -> list[tuple[str | None, float]]:
    return [(d.id, round(s, 5)) for d, s in store.similarity_search_with_score("banana", k=10)]


@pytest.fixture
def no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle must not be used")

    for name in ("dump", "dumps", "load", "loads", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)


@pytest.mark.parametrize("index", [FlatIndex(), HNSWIndex(m=8, ef_construction=40, ef_search=16)], ids=["flat", "hnsw"])
def test_round_trip(tmp_path: Path, index, no_pickle) -> None:
    store = build(index)
    store.delete(["id1"])
    store.save(tmp_path / "idx")
    loaded = FaissVectorStore.load(tmp_path / "idx", EMB)
    assert loaded.index_config == index
    assert snapshot(loaded) == snapshot(store)
    assert loaded.get_by_ids(["id0", "id1"]) == store.get_by_ids(["id0"])
    assert loaded.get_by_ids(["id0"])[0].metadata == {"n": 0, "tags": ["fruit"], "nested": {"x": 1.5}}
    # Labels continue after a load: new and replaced documents do not collide with old ones.
    loaded.add_documents([Document(page_content="black cherry")], ids=["id9"])
    loaded.add_documents([Document(page_content="ripe banana")], ids=["id2"])
    assert len(loaded) == 5
    assert [d.page_content for d in loaded.get_by_ids(["id2", "id9", "id3"])] == ["ripe banana", "black cherry", "purple plum"]
    files = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert files[-1] == "manifest.json" and files[0].startswith("docstore-") and files[1].startswith("index-")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["embedding"]["dimension"] == 8


def test_empty_store_round_trip(tmp_path: Path) -> None:
    FaissVectorStore(EMB).save(tmp_path)
    loaded = FaissVectorStore.load(tmp_path, EMB)
    assert len(loaded) == 0 and loaded.similarity_search("x") == []
    loaded.add_texts(["now with text"])
    assert loaded.similarity_search("now with text", k=1)[0].page_content == "now with text"


def test_resave_replaces_old_files_and_keeps_unrelated_ones(tmp_path: Path) -> None:
    (tmp_path / "README.txt").write_text("mine")
    store = build()
    store.save(tmp_path)
    store.add_texts(["kiwi"], ids=["k"])
    store.save(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 4 and "README.txt" in names
    assert len(FaissVectorStore.load(tmp_path, EMB)) == 6


def test_missing_index(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="save") as info:
        FaissVectorStore.load(tmp_path / "nowhere", EMB)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, IndexLoadError)


def _saved(tmp_path: Path) -> tuple[Path, dict]:
    build().save(tmp_path)
    return tmp_path, json.loads((tmp_path / "manifest.json").read_text())


def test_truncated_or_modified_data_files_are_corrupt(tmp_path: Path) -> None:
    directory, manifest = _saved(tmp_path)
    index_file = directory / manifest["files"]["index"]["name"]
    original = index_file.read_bytes()
    index_file.write_bytes(original[: len(original) // 2])
    with pytest.raises(IndexCorruptError, match="checksum"):
        FaissVectorStore.load(directory, EMB)
    index_file.unlink()
    with pytest.raises(IndexCorruptError, match="cannot be read") as info:
        FaissVectorStore.load(directory, EMB)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_garbage_index_with_matching_checksum_is_corrupt_with_cause(tmp_path: Path) -> None:
    directory, manifest = _saved(tmp_path)
    index_file = directory / manifest["files"]["index"]["name"]
    garbage = b"not a faiss index" * 10
    index_file.write_bytes(garbage)
    manifest["files"]["index"]["sha256"] = __import__("hashlib").sha256(garbage).hexdigest()
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexCorruptError, match="could not be read") as info:
        FaissVectorStore.load(directory, EMB)
    assert info.value.__cause__ is not None


def test_manifest_not_json_and_docstore_inconsistent(tmp_path: Path) -> None:
    directory, manifest = _saved(tmp_path)
    (directory / "manifest.json").write_text("{ not json")
    with pytest.raises(IndexCorruptError) as info:
        FaissVectorStore.load(directory, EMB)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)

    # A docstore naming a label the FAISS index does not have.
    directory2, manifest2 = _saved(tmp_path / "b")
    doc_path = directory2 / manifest2["files"]["docstore"]["name"]
    docstore = json.loads(doc_path.read_text())
    docstore["documents"][0]["label"] = 999
    payload = json.dumps(docstore).encode()
    doc_path.write_bytes(payload)
    manifest2["files"]["docstore"]["sha256"] = __import__("hashlib").sha256(payload).hexdigest()
    (directory2 / "manifest.json").write_text(json.dumps(manifest2))
    with pytest.raises(IndexCorruptError, match="does not match its docstore"):
        FaissVectorStore.load(directory2, EMB)


def test_newer_format_version(tmp_path: Path) -> None:
    directory, manifest = _saved(tmp_path)
    manifest["format_version"] = FORMAT_VERSION + 1
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexVersionError, match="upgrade"):
        FaissVectorStore.load(directory, EMB)


def test_other_embedding_model_or_dimension(tmp_path: Path) -> None:
    directory, _ = _saved(tmp_path)
    with pytest.raises(IndexMismatchError, match="size=8.*size=4|rebuild"):
        FaissVectorStore.load(directory, DeterministicFakeEmbedding(size=4))
    with pytest.raises(IndexMismatchError, match="all-MiniLM-L6-v2"):
        FaissVectorStore.load(directory, SentenceTransformerEmbeddings("default"))  # no model load needed to refuse
    unchecked = FaissVectorStore.load(directory, DeterministicFakeEmbedding(size=4), check_embeddings=False)
    with pytest.raises(DimensionMismatchError, match="dimension 4"):
        unchecked.similarity_search("apple")


def test_save_refuses_non_json_metadata_and_keeps_previous_save(tmp_path: Path) -> None:
    store = build()
    store.save(tmp_path)
    store.add_documents([Document(page_content="x", metadata={"when": object()})], ids=["bad"])
    with pytest.raises(IndexSaveError, match="'bad'"):
        store.save(tmp_path)
    assert len(FaissVectorStore.load(tmp_path, EMB)) == len(TEXTS)


def test_failure_at_the_commit_point_keeps_the_old_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = build()
    store.save(tmp_path)
    before = snapshot(FaissVectorStore.load(tmp_path, EMB))
    store.delete(["id0", "id2"])
    store.add_texts(["grape"], ids=["g"])
    real_replace = persistence.os.replace

    def failing_replace(src, dst):
        if Path(dst).name == "manifest.json":
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(persistence.os, "replace", failing_replace)
    with pytest.raises(IndexSaveError, match="unchanged") as info:
        store.save(tmp_path)
    assert isinstance(info.value.__cause__, OSError)
    assert snapshot(FaissVectorStore.load(tmp_path, EMB)) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    monkeypatch.undo()
    store.save(tmp_path)  # a later save succeeds and removes the orphaned data files
    assert len(list(tmp_path.iterdir())) == 3
    assert {d.id for d in FaissVectorStore.load(tmp_path, EMB).documents()} == {"id1", "id3", "id4", "g"}


def test_save_killed_half_way_through_writing_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = build()
    store.save(tmp_path)
    before = snapshot(FaissVectorStore.load(tmp_path, EMB))
    store.add_texts([f"extra {i}" for i in range(20)])

    real_write_index = faiss.write_index

    def half_written_then_killed(index, path):
        real_write_index(index, path)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt  # not caught by save: simulates the process dying here

    monkeypatch.setattr(persistence.faiss, "write_index", half_written_then_killed)
    with pytest.raises(KeyboardInterrupt):
        store.save(tmp_path)
    assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # debris of the dead save
    assert snapshot(FaissVectorStore.load(tmp_path, EMB)) == before
    monkeypatch.undo()
    store.save(tmp_path)
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    assert len(FaissVectorStore.load(tmp_path, EMB)) == len(TEXTS) + 20


def test_saved_files_are_json_and_faiss_only(tmp_path: Path) -> None:
    build().save(tmp_path)
    for path in tmp_path.iterdir():
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            assert path.suffix == ".faiss"
            index = faiss.read_index(str(path))
            assert index.ntotal == len(TEXTS) and index.d == 8
            assert np.allclose(np.linalg.norm(index.reconstruct(0)), 1.0, atol=1e-5)
