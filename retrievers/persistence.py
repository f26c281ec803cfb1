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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss

from retrievers.errors import (
    IndexCorruptError,
    IndexNotFoundError,
    IndexSaveError,
    IndexVersionError,
)

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "SavedStore", "read_store", "write_store"]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_TMP_PREFIX = ".tmp-"
_DATA_FILE = re.compile(r"^(index-[0-9a-f]{16}\.faiss|docstore-[0-9a-f]{16}\.json)$")


@dataclass
class SavedStore:
    """What a store directory holds, as read back by `read_store`."""

    manifest: dict[str, Any]
    index: Any  # faiss.Index | None
    docstore: dict[str, Any]


def write_store(directory: Path, manifest: dict[str, Any], index: Any, docstore: dict[str, Any]) -> None:
    """Atomically (re)write a store directory. `manifest` gets ``files`` and ``format_version`` added."""
    directory = Path(directory)
    temp_files: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_stale_temp_files(directory)
        files: dict[str, Any] = {}
        payload = json.dumps(docstore, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        files["docstore"] = _place(directory, "docstore", ".json", temp_files, lambda p: _write_bytes(p, payload))
        if index is not None:
            files["index"] = _place(directory, "index", ".faiss", temp_files, lambda p: _write_index(index, p))
        full = {**manifest, "format_version": FORMAT_VERSION, "files": files}
        manifest_tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}-{MANIFEST_NAME}"
        temp_files.append(manifest_tmp)
        _write_bytes(manifest_tmp, json.dumps(full, indent=2, ensure_ascii=False).encode("utf-8"))
        os.replace(manifest_tmp, directory / MANIFEST_NAME)  # the commit point
        _fsync_dir(directory)
    except (OSError, RuntimeError, TypeError, ValueError) as e:
        for path in temp_files:
            path.unlink(missing_ok=True)
        raise IndexSaveError(
            f"could not save the index to {directory} ({type(e).__name__}: {e}); the previously saved index "
            "there, if any, is unchanged. Check free disk space and write permission, then save again"
        ) from e
    keep = {entry["name"] for entry in files.values()}
    for path in directory.iterdir():
        if _DATA_FILE.match(path.name) and path.name not in keep:
            path.unlink(missing_ok=True)


def read_store(directory: Path) -> SavedStore:
    """Read and verify a store directory written by `write_store`."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise IndexNotFoundError(
            f"no saved index in {directory} ({MANIFEST_NAME} is missing); build a store and call "
            f"`store.save({str(directory)!r})` first, or check the path"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
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
