"""Probes of hostile or careless corpora (issue 16, items 8-9).

Each probe failed on the code before the fix: a FIFO hung the loader for ever, a link to
/dev/zero read until memory ran out, a symbolic link to a folder was silently ignored,
random bytes got a "convert it with iconv" hint, pypdf's complaints reached stderr without
the file's name, and `ragspec ingest` on a folder of bad files said "2 skipped" and no more.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from langchain_core.embeddings import Embeddings

import retrievers
from apps import cli
from retrievers import LoadResult, load_documents, load_file
from tests.retrievers.conftest import build_pdf

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def bounded(fn: Callable[[], T], seconds: float = 15) -> T:
    """`fn()`, run in a daemon thread so that a hang fails the test instead of blocking it."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"did not return within {seconds} s (hung)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def quiet_load(*args: object, **kwargs: object) -> LoadResult:
    with pytest.warns(retrievers.SkippedFileWarning):
        return load_documents(*args, **kwargs)  # type: ignore[arg-type]


def reasons(result: LoadResult) -> dict[str, str]:
    return {Path(s.path).name: s.reason for s in result.skipped}


def sources(result: LoadResult) -> list[str]:
    return sorted(str(d.metadata["source"]) for d in result.documents)


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


# -- item 8: files that are not files, and files too large ------------------------------------------


def _release_reader(fifo: Path) -> None:
    """Give a reader stuck on `fifo` its end of file (only a hung old loader needs it)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody is waiting on it


@pytest.mark.timeout(180)
def test_a_named_pipe_in_the_corpus_is_skipped_not_waited_on(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", "the ferry leaves at seven")
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    try:
        result = bounded(lambda: quiet_load(tmp_path))
        assert sources(result) == [str(good)]
        assert "not a regular file: a named pipe (FIFO)" in reasons(result)["pipe.txt"]
        explicit = bounded(lambda: quiet_load([fifo]))
        assert [s.path for s in explicit.skipped] == [str(fifo)]
    finally:
        _release_reader(fifo)


_ZERO_PROBE = textwrap.dedent(
    """
    import json, resource, sys, warnings
    from retrievers import load_documents
    size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    cap = size + 512 * 2**20  # reading /dev/zero to the end would need more than this
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    warnings.simplefilter("ignore")
    result = load_documents(sys.argv[1:])
    print(json.dumps({"loaded": len(result.documents), "skipped": [[s.path, s.reason] for s in result.skipped]}))
    """
)


@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/dev/zero").exists() or sys.platform != "linux", reason="needs Linux /dev/zero")
def test_a_link_to_dev_zero_is_skipped_not_read_until_memory_runs_out(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write(corpus / "good.md", "# Good\n\ntext")
    (corpus / "zero.txt").symlink_to("/dev/zero")
    # In a child with a memory cap: the old loader there dies of MemoryError, not this test run.
    run = subprocess.run(
        [sys.executable, "-c", _ZERO_PROBE, str(corpus), str(corpus / "zero.txt")],
        capture_output=True, text=True, timeout=50, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["loaded"] == 1
    assert [Path(p).name for p, _ in out["skipped"]] == ["zero.txt", "zero.txt"]
    assert all("not a regular file: a character device" in reason for _, reason in out["skipped"])


@pytest.mark.timeout(180)
def test_a_file_over_the_default_size_limit_is_skipped_unread(tmp_path: Path) -> None:
    limit = retrievers.DEFAULT_MAX_FILE_BYTES
    assert limit >= 20 * 2**20  # issue 13 ingests 20 MB files
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(limit + 1)  # sparse: no disk used, and the loader must not read it
    good = write(tmp_path / "small.txt", "small text")
    result = quiet_load(tmp_path)
    assert sources(result) == [str(good)]
    assert reasons(result)["huge.txt"].startswith("too large: 100.0 MiB is over the per-file limit of 100.0 MiB")


def test_the_size_limit_is_configurable_and_reported_per_file(tmp_path: Path) -> None:
    fits = write(tmp_path / "fits.txt", "x" * 1000)
    write(tmp_path / "over.md", "y" * 1001)
    result = quiet_load(tmp_path, max_file_bytes=1000)
    assert sources(result) == [str(fits)]
    assert reasons(result) == {
        "over.md": "too large: 1001 bytes is over the per-file limit of 1000 bytes; raise max_file_bytes or split the file"
    }
    with pytest.raises(ValueError, match="max_file_bytes"):
        load_documents(tmp_path, max_file_bytes=0)
    with pytest.warns(retrievers.SkippedFileWarning, match="too large"):
        assert load_file(tmp_path / "fits.txt", max_file_bytes=999).skipped


# -- item 9: symbolic links to folders, binary files, library warnings, CLI reasons --------------


@pytest.mark.timeout(180)
def test_a_symlinked_subfolder_is_followed(tmp_path: Path) -> None:
    corpus, outside = tmp_path / "corpus", tmp_path / "outside"
    own = write(corpus / "own.md", "# Own\n\ntext")
    write(outside / "shared" / "notes.md", "# Shared notes\n\ntext")
    (corpus / "linked").symlink_to(outside / "shared", target_is_directory=True)
    result = bounded(lambda: load_documents(corpus))
    assert sources(result) == sorted([str(corpus / "linked" / "notes.md"), str(own)])
    assert result.skipped == []


@pytest.mark.timeout(180)
def test_a_symlink_loop_ends_and_every_file_loads_once(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    top = write(corpus / "top.md", "top")
    deep = write(corpus / "sub" / "deep.md", "deep")
    (corpus / "sub" / "back").symlink_to(corpus, target_is_directory=True)  # a loop to an ancestor
    (corpus / "again").symlink_to(corpus / "sub", target_is_directory=True)  # a second way in
    result = bounded(lambda: quiet_load(corpus))
    assert sources(result) == sorted([str(deep), str(top)])
    assert sorted(Path(s.path).relative_to(corpus).as_posix() for s in result.skipped) == ["again", "sub/back"]
    assert all("already loaded" in s.reason for s in result.skipped)


def test_random_bytes_are_called_binary_not_latin1(tmp_path: Path) -> None:
    noise = random.Random(16).randbytes(4096).replace(b"\x00", b"\x01")  # no NUL byte to give it away
    write(tmp_path / "noise.txt", noise)
    write(tmp_path / "short.md", random.Random(3).randbytes(200).replace(b"\x00", b"\x02"))
    latin1 = write(tmp_path / "latin1.txt", "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin-1") * 20)
    found = reasons(quiet_load(tmp_path))
    for name in ("noise.txt", "short.md"):
        assert found[name].startswith("binary file, not text"), found[name]
        assert "iconv" not in found[name]
    assert "iconv" in found[latin1.name]  # real legacy-encoded text keeps its conversion hint


def _pdf_without_eof_marker() -> bytes:
    return build_pdf(["text"]).replace(b"%%EOF\n", b"")


def _pdf_with_a_wrong_startxref() -> bytes:
    data = build_pdf(["readable text despite a wrong xref offset"])
    head, _, tail = data.rpartition(b"startxref\n")
    return head + b"startxref\n5" + tail[tail.index(b"\n") :]


@pytest.mark.timeout(180)
def test_pypdf_complaints_are_attached_to_their_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    broken = write(tmp_path / "broken.pdf", _pdf_without_eof_marker())
    repaired = write(tmp_path / "repaired.pdf", _pdf_with_a_wrong_startxref())
    result = quiet_load(tmp_path)
    assert "pypdf: EOF marker not found" in reasons(result)["broken.pdf"]
    assert sources(result) == [str(repaired)]
    assert result.notes and all(n.path == str(repaired) and n.message.startswith("pypdf: ") for n in result.notes)
    assert any("startxref" in n.message for n in result.notes)
    # Whatever is logged names its file; nothing anonymous reaches stderr.
    pdf_records = [r.getMessage() for r in caplog.records if "startxref" in r.getMessage() or "EOF" in r.getMessage()]
    assert pdf_records and all(str(repaired) in m for m in pdf_records), pdf_records


class NeverEmbed(Embeddings):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise AssertionError("nothing should be embedded")

    def embed_query(self, text: str) -> list[float]:
        raise AssertionError("nothing should be embedded")


@pytest.mark.timeout(180)
def test_ingest_of_only_bad_files_prints_each_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(retrievers, "default_embeddings", NeverEmbed)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    corpus = tmp_path / "corpus"
    write(corpus / "noise.txt", random.Random(5).randbytes(3000).replace(b"\x00", b"\x03"))
    write(corpus / "empty.md", "")
    fifo = corpus / "pipe.txt"
    os.mkfifo(fifo)
    try:
        code = bounded(lambda: cli.main(["ingest", str(corpus), "--index", str(tmp_path / "idx"), "--no-progress"]))
    finally:
        _release_reader(fifo)
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("ragspec: error: found no text to index") and err.count("\n") == 1, err
    for name, reason in [("noise.txt", "binary file, not text"), ("empty.md", "empty file"), ("pipe.txt", "not a regular file: a named pipe")]:
        assert f"{corpus / name}: {reason}" in err, (name, err)
    assert not (tmp_path / "idx").exists()
