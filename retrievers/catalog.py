"""The file catalog a synced index keeps: which files it was built from, their hashes, and their chunks.

`retrievers.ingest.sync_index` records one in the store (`FaissVectorStore.catalog`); the
store saves it with the index, in two parts:

- in ``manifest.json``, under ``"ingest"``: the catalog version, the chunking settings, the
  embedding fingerprint, and per file its SHA-256, size in bytes, number of chunks and of
  distinct chunks;
- in the docstore, under ``"ingest"``: per file, its distinct chunks in file order, each as
  ``[key, text_sha, metadata]`` (the first occurrence's metadata, without ``source``).

A chunk's key is the hash of its whitespace-normalised text (`content_key`) and is the id of
its record in the store: a chunk found in several files, or several times in one, is stored
and embedded once. Readers that do not know the section ignore it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CATALOG_VERSION", "Catalog", "ChunkRef", "FileRecord", "content_key", "text_sha"]

CATALOG_VERSION = 1
"""Version of the ``"ingest"`` sections; a newer one is refused by `sync_index` (not by `load`)."""


def content_key(text: str) -> str:
    """Id of a chunk in a synced index: SHA-256 of its text with whitespace runs made one space, 32 hex digits."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()[:32]


def text_sha(text: str) -> str:
    """Short hash of a chunk's exact text (which of several whitespace variants a record holds)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ChunkRef:
    """A distinct chunk of one file, as first found in it."""

    key: str
    """`content_key` of the text: the record's id."""
    text_sha: str
    """`text_sha` of this occurrence's exact text."""
    metadata: dict[str, Any]
    """This occurrence's metadata (``chunk_index``, ``start_index``, ``page``, ``title``...), without ``source``."""


@dataclass(frozen=True)
class FileRecord:
    """One indexed file."""

    sha256: str
    size: int
    """Bytes."""
    chunks: int
    """Chunks the file was split into, repeats included."""
    refs: tuple[ChunkRef, ...]
    """Its distinct chunks, each at its first occurrence, in file order."""


@dataclass
class Catalog:
    """The files an index was synced from, and the settings it was built with."""

    settings: dict[str, Any]
    """Chunking settings (`ChunkingSettings.fingerprint`); a change means a full rebuild."""
    embedding: str
    """`embeddings_fingerprint` of the embeddings; a change means a full rebuild."""
    files: dict[str, FileRecord] = field(default_factory=dict)
    """By path, as the folder walk found it."""

    def keys(self) -> set[str]:
        """Every chunk key some file holds."""
        return {ref.key for record in self.files.values() for ref in record.refs}

    def manifest_part(self) -> dict[str, Any]:
        return {
            "version": CATALOG_VERSION,
            "settings": self.settings,
            "embedding": self.embedding,
            "files": {
                path: {"sha256": r.sha256, "bytes": r.size, "chunks": r.chunks, "distinct": len(r.refs)}
                for path, r in self.files.items()
            },
        }

    def docstore_part(self) -> dict[str, Any]:
        return {
            "version": CATALOG_VERSION,
            "refs": {path: [[ref.key, ref.text_sha, ref.metadata] for ref in r.refs] for path, r in self.files.items()},
        }

    @classmethod
    def from_saved(cls, manifest_part: Any, docstore_part: Any) -> Catalog:
        """Parse the two saved parts; raises ValueError, KeyError or TypeError when they are malformed."""
        if not isinstance(manifest_part, dict) or not isinstance(docstore_part, dict):
            raise TypeError("the ingest sections must be JSON objects")
        files = manifest_part["files"]
        refs = docstore_part["refs"]
        if not isinstance(files, dict) or not isinstance(refs, dict) or set(files) != set(refs):
            raise ValueError("the manifest and the docstore list different files")
        records = {}
        for path, entry in files.items():
            file_refs = tuple(ChunkRef(str(key), str(sha), dict(metadata)) for key, sha, metadata in refs[path])
            if len(file_refs) != int(entry["distinct"]):
                raise ValueError(f"{path}: {entry['distinct']} distinct chunks listed, {len(file_refs)} found")
            records[str(path)] = FileRecord(str(entry["sha256"]), int(entry["bytes"]), int(entry["chunks"]), file_refs)
        settings = manifest_part["settings"]
        if not isinstance(settings, dict):
            raise TypeError("the chunking settings must be a JSON object")
        return cls(settings=settings, embedding=str(manifest_part["embedding"]), files=records)
