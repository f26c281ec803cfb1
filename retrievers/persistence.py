"""On-disk format of a saved `FaissVectorStore`: no pickle, atomic, versioned, checksummed.

A saved store is a directory holding

- ``manifest.json``: format version, embedding model id and dimension, index settings,
  and the name, size and SHA-256 of the two data files below;
- ``index-<hash>.faiss``: the FAISS index (`faiss.write_index`), absent for an empty store;
- ``docstore-<hash>.json``: ids, FAISS labels, texts and metadata of the documents.

A save writes the data files under temporary names, fsyncs them, renames them to their
content-addressed names, and only then replaces ``manifest.json`` with `os.replace`
(atomic on POSIX and Windows). The old manifest keeps pointing at the old data files until
that moment, and old data files are removed only afterwards, so an interrupted save
leaves the previous index loadable.

Concurrency: a save holds an exclusive lock on the folder (on POSIX `fcntl.flock` on the
folder itself, so no lock file appears in it) from its first write to its last deletion; a second
writer waits up to ``lock_timeout`` seconds, then gets `IndexLockedError`. Readers take no
lock: data files are immutable once named (their name is their content hash), so a reader
that opens what the manifest it read names sees one whole index; if a file it names was
deleted because a save replaced the manifest meanwhile, the reader reads the new manifest
and starts again (a bounded number of times). Only a file that is missing or damaged while
the manifest stays the same is reported as corrupt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrievers.errors import (
    IndexCorruptError,
    IndexLoadError,
    IndexLockedError,
    IndexNotFoundError,
    IndexSaveError,
    IndexVersionError,
)
from retrievers.extras import needs

with needs("retrieval", "FaissVectorStore"):
    import faiss

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SavedStore",
    "check_index_writable",
    "read_manifest",
    "read_store",
    "write_store",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
DEFAULT_LOCK_TIMEOUT_S = 60.0
"""How long a save waits for another save into the same folder before `IndexLockedError`."""
_READ_ATTEMPTS = 20  # manifest re-reads when saves keep replacing it under a reader
_TMP_PREFIX = ".tmp-"
_DATA_FILE = re.compile(r"^(index-[0-9a-f]{16}\.faiss|docstore-[0-9a-f]{16}\.json)$")


@dataclass
class SavedStore:
    """What a store directory holds, as read back by `read_store`."""

    manifest: dict[str, Any]
    index: Any  # faiss.Index | None
    docstore: dict[str, Any]


def write_store(
    directory: Path,
    manifest: dict[str, Any],
    index: Any,
    docstore: dict[str, Any],
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
) -> None:
    """Atomically (re)write a store directory. `manifest` gets ``files`` and ``format_version`` added.

    Holds the folder's write lock throughout; raises `IndexLockedError` when another save
    holds it for more than `lock_timeout` seconds, `IndexSaveError` for any other failure.
    """
    if not lock_timeout >= 0:
        raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout!r}")
    directory = Path(directory)
    temp_files: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _save_error(directory, e) from e
    with _write_lock(directory, lock_timeout):
        try:
            _remove_stale_temp_files(directory)  # safe: no other save runs while we hold the lock
            files: dict[str, Any] = {}
            payload = json.dumps(docstore, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            files["docstore"] = _place(directory, "docstore", ".json", temp_files, lambda p: _write_bytes(p, payload))
            if index is not None:
                files["index"] = _place(directory, "index", ".faiss", temp_files, lambda p: _write_index(index, p))
            full = {**manifest, "format_version": FORMAT_VERSION, "files": files}
            manifest_tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}-{MANIFEST_NAME}"
            temp_files.append(manifest_tmp)
            _write_bytes(manifest_tmp, json.dumps(full, indent=2, ensure_ascii=False).encode("utf-8"))
            _fsync_dir(directory)  # the data files' names are durable before the manifest names them
            os.replace(manifest_tmp, directory / MANIFEST_NAME)  # the commit point
            _fsync_dir(directory)
        except (OSError, RuntimeError, TypeError, ValueError) as e:
            for path in temp_files:
                path.unlink(missing_ok=True)
            raise _save_error(directory, e) from e
        # Still under the lock: the manifest just written is the current one, so every data
        # file it does not name is garbage (the previous save's, or a failed save's orphans).
        keep = {entry["name"] for entry in files.values()}
        for path in directory.iterdir():
            if _DATA_FILE.match(path.name) and path.name not in keep:
                path.unlink(missing_ok=True)


def _save_error(directory: Path, e: BaseException) -> IndexSaveError:
    return IndexSaveError(
        f"could not save the index to {directory} ({type(e).__name__}: {e}); the previously saved index "
        "there, if any, is unchanged. Check free disk space and write permission, then save again"
    )


def check_index_writable(directory: str | os.PathLike[str]) -> Path:
    """Prove that a save into `directory` could write there, before any expensive work.

    Creates the folder (and missing parents), writes, fsyncs and deletes a probe file, then
    removes the folders it created, leaving the file system as it found it. Returns the path.

    Raises:
        IndexSaveError: the folder cannot be created or written (read-only file system,
            permissions, a file in the way), with the OS error chained.
    """
    directory = Path(directory)
    created: list[Path] = []
    try:
        missing = directory
        while not missing.exists() and not missing.is_symlink() and missing != missing.parent:
            created.append(missing)
            missing = missing.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}probe-", dir=directory)
        try:
            os.write(fd, b"ragspec write probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            Path(probe).unlink(missing_ok=True)
    except OSError as e:
        raise IndexSaveError(
            f"cannot write an index to {directory} ({type(e).__name__}: {e}); choose a folder you can write "
            "to, or fix its permissions or free space, before indexing"
        ) from e
    finally:
        for path in created:  # deepest first; a folder someone else has filled stays
            try:
                path.rmdir()
            except OSError:
                break
    return directory


@contextmanager
def _write_lock(directory: Path, timeout: float) -> Iterator[None]:
    """Hold the exclusive write lock of `directory`: wait up to `timeout` s, then `IndexLockedError`.

    POSIX: `flock` on a descriptor of the folder itself. The lock belongs to that open
    descriptor, so it excludes other threads of this process as well as other processes,
    and the kernel drops it when the holder exits, however it dies.
    """
    if fcntl is None:  # pragma: no cover - Windows: a lock file from the filelock package
        from filelock import FileLock, Timeout

        lock = FileLock(str(directory / ".ragspec-write.lock"))
        try:
            lock.acquire(timeout=timeout)
        except Timeout as e:
            raise _locked_error(directory, timeout) from e
        try:
            yield
        finally:
            lock.release()
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as e:
        raise _save_error(directory, e) from e
    try:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _save_error(directory, e) from e
                if time.monotonic() >= deadline:
                    raise _locked_error(directory, timeout) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


def _locked_error(directory: Path, timeout: float) -> IndexLockedError:
    return IndexLockedError(
        f"the index at {directory} is being written by another process (waited {timeout:g} s for it to "
        "finish); try again when it is done, or save to another folder"
    )


def read_store(directory: Path) -> SavedStore:
    """Read and verify a store directory written by `write_store`.

    Reads the manifest once and opens what it names. If a named file is missing or damaged
    and the manifest has changed meanwhile (a save committed while we read), it starts
    again with the new manifest; only a fault that persists under the same manifest is
    reported as `IndexCorruptError`.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    for _ in range(_READ_ATTEMPTS):
        raw = _read_manifest_bytes(directory)
        try:
            return _read_named(directory, raw)
        except IndexCorruptError:
            if _manifest_bytes_or_none(manifest_path) == raw:
                raise  # the same manifest still names the broken file: really corrupt
    raise IndexLoadError(
        f"the index at {directory} was replaced {_READ_ATTEMPTS} times while it was being read "
        "(another process keeps saving it); load it again when that process is done"
    )


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a store directory, without reading or verifying its data files.

    Raises `IndexNotFoundError` when there is none, `IndexCorruptError` when it is not a JSON object.
    """
    directory = Path(directory)
    raw = _read_manifest_bytes(directory)
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexCorruptError(f"{directory / MANIFEST_NAME} is unreadable or not JSON ({e}); rebuild the index") from e
    if not isinstance(manifest, dict):
        raise IndexCorruptError(f"{directory / MANIFEST_NAME} is not a JSON object; it is not a ragspec index. Rebuild it")
    return manifest


def _read_manifest_bytes(directory: Path) -> bytes:
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise IndexNotFoundError(
            f"no saved index in {directory} ({MANIFEST_NAME} is missing); build a store and call "
            f"`store.save({str(directory)!r})` first, or check the path"
        )
    try:
        return manifest_path.read_bytes()
    except OSError as e:
        raise IndexCorruptError(f"{manifest_path} is unreadable or not JSON ({e}); rebuild the index") from e


def _manifest_bytes_or_none(manifest_path: Path) -> bytes | None:
    try:
        return manifest_path.read_bytes()
    except OSError:
        return None


def _read_named(directory: Path, raw: bytes) -> SavedStore:
    """The store that the manifest bytes `raw` describe."""
    manifest_path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexCorruptError(f"{manifest_path} is unreadable or not JSON ({e}); rebuild the index") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("format_version"), int):
        raise IndexCorruptError(f"{manifest_path} has no format_version; it is not a ragspec index. Rebuild it")
    version = manifest["format_version"]
    if version > FORMAT_VERSION:
        raise IndexVersionError(
            f"{directory} was saved in index format {version}, newer than this version of ragspec reads "
            f"(up to {FORMAT_VERSION}); upgrade ragspec (`pip install -U ragspec`) or rebuild the index"
        )
    if version < 1:
        raise IndexVersionError(f"{directory} has unknown index format {version}; rebuild the index")
    files = manifest.get("files")
    if not isinstance(files, dict) or "docstore" not in files:
        raise IndexCorruptError(f"{manifest_path} lists no docstore file; rebuild the index")
    docstore_bytes = _read_verified(directory, files["docstore"])
    try:
        docstore = json.loads(docstore_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexCorruptError(f"the docstore in {directory} is not valid JSON ({e}); rebuild the index") from e
    index = None
    if files.get("index") is not None:
        index_bytes = _read_verified(directory, files["index"])
        try:
            import numpy as np

            index = faiss.deserialize_index(np.frombuffer(index_bytes, dtype="uint8"))
        except Exception as e:  # noqa: BLE001 - faiss raises RuntimeError with a C++ message
            raise IndexCorruptError(f"the FAISS index in {directory} could not be read ({e}); rebuild the index") from e
    return SavedStore(manifest=manifest, index=index, docstore=docstore)


def _read_verified(directory: Path, entry: Any) -> bytes:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not _DATA_FILE.match(entry["name"]):
        raise IndexCorruptError(f"{directory / MANIFEST_NAME} has a malformed file entry {entry!r}; rebuild the index")
    path = directory / entry["name"]
    try:
        data = path.read_bytes()
    except OSError as e:
        raise IndexCorruptError(
            f"{path} listed in {MANIFEST_NAME} cannot be read ({e.strerror or e}); restore it or rebuild the index"
        ) from e
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise IndexCorruptError(
            f"{path} does not match the checksum in {MANIFEST_NAME} (truncated or modified); rebuild the index"
        )
    return data


def _place(directory: Path, stem: str, suffix: str, temp_files: list[Path], write: Any) -> dict[str, Any]:
    """Write a data file under a temporary name, then rename it to ``<stem>-<hash><suffix>``."""
    tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}-{stem}{suffix}"
    temp_files.append(tmp)
    write(tmp)
    digest, size = _sha256_file(tmp)
    final = directory / f"{stem}-{digest[:16]}{suffix}"
    os.replace(tmp, final)
    return {"name": final.name, "sha256": digest, "bytes": size}


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_index(index: Any, path: Path) -> None:
    faiss.write_index(index, str(path))
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temp_files(directory: Path) -> None:
    for path in directory.glob(f"{_TMP_PREFIX}*"):
        if path.is_file():
            path.unlink(missing_ok=True)
