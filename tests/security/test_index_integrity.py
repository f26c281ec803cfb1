"""Probes of the saved index under concurrency and unwritable targets (issue 16, items 5-7).

Each probe failed on the code before the fix: concurrent saves left a manifest naming a
file another save had deleted, loads during a save were reported as corrupt, a second save
never waited or failed, and `ragspec ingest` embedded everything before finding out that
it could not write the index.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
import time
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings

import retrievers
from apps import cli
from retrievers import FaissVectorStore, IndexLockedError, IndexSaveError, check_index_writable, persistence
from tests.helpers import run_in_threads, write_notes

EMB = DeterministicFakeEmbedding(size=8)


def make_store(tag: str, n: int = 40) -> FaissVectorStore:
    """A store whose ids all carry `tag`, so a loaded store tells which save it came from."""
    store = FaissVectorStore(EMB)
    store.add_documents(
        [Document(page_content=f"{tag} passage {i}", metadata={"tag": tag}) for i in range(n)],
        ids=[f"{tag}-{i}" for i in range(n)],
    )
    return store


def ids(store: FaissVectorStore) -> frozenset[str]:
    return frozenset(d.id for d in store.documents() if d.id is not None)


def data_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")


# -- item 5: concurrent saves --------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_concurrent_saves_from_threads_leave_one_whole_index(tmp_path: Path) -> None:
    writers, trials = 4, 25
    stores = [make_store(f"w{k}") for k in range(writers)]
    expected = {ids(s) for s in stores}
    for trial in range(trials):
        folder = tmp_path / f"trial{trial}"
        barrier = threading.Barrier(writers)

        def save(store: FaissVectorStore) -> None:
            barrier.wait()
            store.save(folder)

        errors = run_in_threads(*(functools.partial(save, s) for s in stores))
        assert errors == [], f"trial {trial}: {errors!r}"
        loaded = FaissVectorStore.load(folder, EMB)  # IndexCorruptError before the fix
        assert ids(loaded) in expected, f"trial {trial}: a mix of saves"
        # Exactly the files the manifest names: nothing of another save left behind.
        assert len(data_files(folder)) == 2, f"trial {trial}: {data_files(folder)}"


def _save_in_process(tag: str, folders: list[str], barrier: object) -> None:
    store = make_store(tag)
    for folder in folders:
        barrier.wait(timeout=30)  # type: ignore[attr-defined]
        store.save(folder)


@pytest.mark.timeout(180)
def test_concurrent_saves_from_processes_leave_one_whole_index(tmp_path: Path) -> None:
    writers, trials = 3, 12
    folders = [str(tmp_path / f"trial{t}") for t in range(trials)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding FAISS/OpenMP threads
    barrier = ctx.Barrier(writers)
    procs = [ctx.Process(target=_save_in_process, args=(f"p{k}", folders, barrier), daemon=True) for k in range(writers)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 50
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        assert [p.exitcode for p in procs] == [0] * writers, "a save failed in a writer process"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    expected = {ids(make_store(f"p{k}")) for k in range(writers)}
    for folder in folders:
        loaded = FaissVectorStore.load(folder, EMB)
        assert ids(loaded) in expected
        assert len(data_files(Path(folder))) == 2, data_files(Path(folder))


class _BlockedSave:
    """A save in a thread that stops inside `write_store` (lock held, files half written) until released."""

    def __init__(self, store: FaissVectorStore, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.errors: list[BaseException] = []
        real_write_index = persistence.faiss.write_index
        blocked_thread: list[threading.Thread] = []

        def write_index(index: object, path: str) -> None:
            real_write_index(index, path)
            if threading.current_thread() in blocked_thread:
                self.entered.set()
                assert self.release.wait(30)

        monkeypatch.setattr(persistence.faiss, "write_index", write_index)

        def run() -> None:
            try:
                store.save(folder)
            except BaseException as e:  # noqa: BLE001 - checked by the test
                self.errors.append(e)

        self.thread = threading.Thread(target=run)
        blocked_thread.append(self.thread)
        self.thread.start()
        assert self.entered.wait(30)

    def finish(self) -> None:
        self.release.set()
        self.thread.join(30)
        assert self.errors == []


@pytest.mark.timeout(180)
def test_a_second_save_waits_a_bounded_time_then_says_who_holds_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = make_store("first"), make_store("second")
    blocked = _BlockedSave(first, tmp_path, monkeypatch)
    start = time.monotonic()
    with pytest.raises(IndexLockedError, match="being written by another process") as info:
        second.save(tmp_path, lock_timeout=0.3)
    assert 0.25 <= time.monotonic() - start < 10
    assert isinstance(info.value, IndexSaveError) and str(tmp_path) in str(info.value)
    blocked.finish()
    assert ids(FaissVectorStore.load(tmp_path, EMB)) == ids(first)


@pytest.mark.timeout(180)
def test_a_waiting_save_commits_after_the_one_holding_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = make_store("first"), make_store("second")
    blocked = _BlockedSave(first, tmp_path, monkeypatch)
    waiting = threading.Thread(target=second.save, args=(tmp_path,))  # the default bounded wait (60 s)
    waiting.start()
    time.sleep(0.3)
    assert waiting.is_alive()  # it waits for the lock instead of writing alongside
    blocked.finish()
    waiting.join(30)
    assert ids(FaissVectorStore.load(tmp_path, EMB)) == ids(second)  # the later commit wins, whole
    assert len(data_files(tmp_path)) == 2


def test_lock_timeout_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        make_store("x", 1).save(tmp_path, lock_timeout=-1)


# -- item 6: loads during saves ------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_loads_during_saves_see_the_old_or_the_new_index_never_corrupt(tmp_path: Path) -> None:
    versions = [make_store("old", 500), make_store("new", 501)]  # big enough to widen the race window
    expected = {ids(s) for s in versions}
    versions[0].save(tmp_path)
    stop = threading.Event()
    saves = 0

    def keep_saving() -> None:
        nonlocal saves
        while not stop.is_set():
            versions[saves % 2].save(tmp_path)
            saves += 1

    writer = threading.Thread(target=keep_saving)
    writer.start()
    failures: list[str] = []
    loads = 0
    try:
        while loads < 300 or saves < 60:  # many loads, and many saves under them
            loads += 1
            try:
                loaded = FaissVectorStore.load(tmp_path, EMB)
            except Exception as e:  # noqa: BLE001 - counted
                failures.append(f"{type(e).__name__}: {e}")
                continue
            if ids(loaded) not in expected:
                failures.append("a mix of two saves")
    finally:
        stop.set()
        writer.join(30)
    assert failures == [], f"{len(failures)} of {loads} loads during {saves} saves failed, e.g. {failures[0]}"


def test_a_file_missing_under_an_unchanged_manifest_is_still_corrupt(tmp_path: Path) -> None:
    make_store("a").save(tmp_path)
    (tmp_path / next(n for n in data_files(tmp_path) if n.startswith("docstore-"))).unlink()
    with pytest.raises(retrievers.IndexCorruptError, match="cannot be read"):
        FaissVectorStore.load(tmp_path, EMB)


def test_a_reader_outpaced_by_saves_gives_up_after_bounded_retries_without_saying_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_store("a").save(tmp_path)
    (tmp_path / next(n for n in data_files(tmp_path) if n.startswith("docstore-"))).unlink()
    rereads = iter(range(10**6))  # every re-read finds a different manifest: saves keep committing
    monkeypatch.setattr(persistence, "_manifest_bytes_or_none", lambda path: b"%d" % next(rereads))
    with pytest.raises(retrievers.IndexLoadError, match="replaced 20 times while it was being read") as info:
        FaissVectorStore.load(tmp_path, EMB)
    assert not isinstance(info.value, retrievers.IndexCorruptError)
    assert next(rereads) == 20


# -- item 7: an unwritable index folder fails before any embedding ------------------------------------


class CountingEmbeddings(Embeddings):
    """Deterministic 8-d vectors; counts every text it is asked to embed."""

    def __init__(self) -> None:
        self.texts = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.texts += len(texts)
        return EMB.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        self.texts += 1
        return EMB.embed_query(text)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingEmbeddings:
    fake = CountingEmbeddings()
    monkeypatch.setattr(retrievers, "default_embeddings", lambda: fake)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    return fake


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    return write_notes(tmp_path / "docs", 3, "The ferry leaves at {hour} in the morning.")


@pytest.mark.timeout(180)
def test_ingest_into_a_path_under_a_file_fails_before_embedding(
    tmp_path: Path, docs: Path, counting: CountingEmbeddings, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the index folder's parent should be")
    assert cli.main(["ingest", str(docs), "--index", str(blocker / "idx"), "--no-progress"]) == 1
    assert counting.texts == 0
    err = capsys.readouterr().err
    assert "cannot write an index to" in err and "not-a-folder" in err, err


@pytest.mark.timeout(180)
def test_ingest_into_a_read_only_file_system_fails_before_embedding(
    tmp_path: Path, docs: Path, counting: CountingEmbeddings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, where chmod does not stop writes: the OS refuses as a read-only mount would.
    index = tmp_path / "ro-mount" / "idx"
    index.parent.mkdir()
    real_open = persistence.os.open

    def read_only(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).startswith(str(index.parent)) and flags & (persistence.os.O_WRONLY | persistence.os.O_RDWR):
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(persistence.os, "open", read_only)
    monkeypatch.setattr(persistence.os, "mkdir", _refuse_mkdir(index.parent, persistence.os.mkdir))
    assert cli.main(["ingest", str(docs), "--index", str(index), "--no-progress"]) == 1
    assert counting.texts == 0
    assert "Read-only file system" in capsys.readouterr().err


def _refuse_mkdir(under: Path, real_mkdir):  # type: ignore[no-untyped-def]
    def mkdir(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).startswith(str(under)):
            raise OSError(30, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    return mkdir


@pytest.mark.timeout(180)
def test_ingest_into_a_writable_folder_still_embeds_and_saves(
    tmp_path: Path, docs: Path, counting: CountingEmbeddings
) -> None:
    index = tmp_path / "deep" / "idx"
    assert cli.main(["ingest", str(docs), "--index", str(index), "--no-progress"]) == 0
    assert counting.texts >= 3
    assert len(FaissVectorStore.load(index, counting)) >= 3


def test_check_index_writable_leaves_no_trace_and_names_the_problem(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "idx"
    assert check_index_writable(target) == target
    assert list(tmp_path.iterdir()) == []  # the folders it made to probe are gone again
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    check_index_writable(existing)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexSaveError, match="cannot write an index to") as info:
        check_index_writable(tmp_path / "file" / "idx")
    assert isinstance(info.value.__cause__, OSError)
