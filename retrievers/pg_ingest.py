"""Keep a PostgreSQL collection in step with files and folders: incremental, deduplicated, one transaction per file.

``sync_collection(paths, url, embeddings, collection=...)`` is `retrievers.ingest.sync_index` for a
`PgVectorStore`: the same scan (SHA-256 of every file), the same chunks (`_chunk_file`), the same
records (a chunk's id is the hash of its whitespace-normalised text; ``metadata["sources"]`` lists
every file holding it and the first is its ``source``), the same report. What differs is where the
manifest lives and how changes land:

- **The manifest is in tables**: ``ragspec_files_<id>`` (path, SHA-256, size, chunk count) and
  ``ragspec_refs_<id>`` (each file's distinct chunks in order: key, exact-text hash, occurrence
  metadata); the chunking settings in the collection's row.
- **One transaction per file.** A new, changed or removed file's refs, its chunks (new, re-embedded,
  re-labelled with new sources, or deleted when no file holds them any more) and the term statistics
  change together in one transaction, under the collection's write lock. A killed ingest leaves
  every file it finished, and the store exactly as it was before the file it was working on.
- **Ingests take turns.** A sync holds the collection's ingest lock (a session-level advisory lock,
  which PostgreSQL drops when the holder's connection goes, however it dies); a second sync of the
  same collection waits for it, then finds the first one's work done. Searches never wait.
- **Rebuilds are incremental too.** When the chunking settings changed, every file is treated as
  changed and the new settings are recorded after the last one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from retrievers.catalog import ChunkRef, FileRecord
from retrievers.chunking import contextual_text
from retrievers.embeddings import embed_chunks
from retrievers.errors import DimensionMismatchError, FileSkippedError, NothingToIndexError
from retrievers.faiss_store import FaissVectorStore
from retrievers.ingest import ChunkingSettings, Progress, SyncReport, _chunk_file, _nothing_message, _Tracker
from retrievers.loaders import DEFAULT_MAX_FILE_BYTES, SkippedFile, file_digest, find_files
from retrievers.pg_store import PgVectorStore
from retrievers.store_url import DEFAULT_COLLECTION
from retrievers.extras import needs

with needs("postgres", "ingesting into PostgreSQL"):
    import psycopg
    from psycopg import sql
    from psycopg.types.json import Jsonb

__all__ = ["DEFAULT_INGEST_LOCK_TIMEOUT_S", "sync_collection"]

_INGEST_LOCK = 0x49_4E_47  # "ING": first key of the ingest lock; the second is hashtext(collection name)
DEFAULT_INGEST_LOCK_TIMEOUT_S = 600.0
"""How long a sync waits for another sync of the same collection before giving up."""


def sync_collection(
    paths: str | Path | Sequence[str | Path],
    url: str,
    embeddings: Embeddings,
    *,
    collection: str = DEFAULT_COLLECTION,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    chunking: ChunkingSettings | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    batch_size: int = 64,
    progress: Progress | None = None,
    lock_timeout: float = DEFAULT_INGEST_LOCK_TIMEOUT_S,
    store: PgVectorStore | None = None,
) -> tuple[PgVectorStore, SyncReport]:
    """Make `collection` in the database at `url` hold the chunks of exactly the files under `paths`.

    Arguments as `sync_index` (``store``: an open `PgVectorStore` of that collection to use). The
    report's ``index_dir`` is the collection's name; ``saved`` says whether anything was written.

    Raises:
        NothingToIndexError: no text in `paths`; the collection is left as it was.
        IndexMismatchError: the collection holds vectors of another embedding model.
        PgStoreError: the database refused a change (that file's transaction is rolled back).
        TimeoutError: another sync of the collection held its lock for more than `lock_timeout` seconds.
    """
    started = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    chunking = chunking or ChunkingSettings()
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    store = store or PgVectorStore(url, embeddings, collection=collection)
    report = SyncReport(Path(store.collection))
    tracker = _Tracker(progress)
    with psycopg.connect(store.url, autocommit=True) as lock_conn:
        _take_ingest_lock(lock_conn, store.collection, lock_timeout)
        store._open_collection()  # another sync may have created it while we waited
        _Sync(store, embeddings, chunking, max_file_bytes, batch_size, tracker, report).run(paths, include, exclude)
    report.seconds = time.perf_counter() - started
    return store, report


def _take_ingest_lock(conn: psycopg.Connection[Any], collection: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_INGEST_LOCK, collection)).fetchone()
        if row and row[0]:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"another ingest into collection {collection!r} is running (waited {timeout:g} s); try again when it is done"
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


class _Sync:
    """One sync: the scan, the plan per file, and the per-file transactions."""

    def __init__(
        self,
        store: PgVectorStore,
        embeddings: Embeddings,
        chunking: ChunkingSettings,
        max_file_bytes: int,
        batch_size: int,
        tracker: _Tracker,
        report: SyncReport,
    ) -> None:
        self.store = store
        self.embeddings = embeddings
        self.chunking = chunking
        self.settings = chunking.fingerprint()
        self.max_file_bytes = max_file_bytes
        self.batch_size = batch_size
        self.tracker = tracker
        self.report = report
        self.embedded: set[str] = set()
        """Keys embedded by this sync."""

    def run(self, paths: list[str | Path], include: Sequence[str] | None, exclude: Sequence[str] | None) -> None:
        report = self.report
        old_files, old_settings = self._manifest()
        rebuild = bool(old_files) and old_settings != self.settings
        if rebuild:
            before = old_settings or {}
            changes = ", ".join(f"{k} {before.get(k)!r} -> {v!r}" for k, v in self.settings.items() if before.get(k) != v)
            report.rebuilt = f"the chunking settings changed ({changes})"
        files, unwalked = find_files(paths, include, exclude)
        report.skipped.extend(unwalked)
        digests = self._scan(list(dict.fromkeys(str(f) for f in files)))
        for path, (sha, _) in digests.items():
            before = old_files.get(path)
            (report.new if before is None else report.unchanged if before == sha else report.changed).append(path)
        report.removed = [path for path in old_files if path not in digests]
        read = list(digests) if rebuild else [*report.new, *report.changed]
        chunked = self._chunk(read, digests)
        if not chunked and not report.unchanged:
            raise NothingToIndexError(_nothing_message(paths, report.skipped, Path(self.store.collection), bool(old_files)))
        keys = list({ref.key for record, _ in chunked.values() for ref in record.refs})
        known = _existing(self.store, keys) if keys and self.store.collection_id is not None else set()
        report.duplicates = report.chunks_read - len(keys)
        self.tracker.start("embed", chunks_total=len(keys) - len(known))
        for path in report.removed:
            self._apply(path, None, {})
        for path, (record, texts) in chunked.items():
            try:
                self._apply(path, record, texts)
            except DimensionMismatchError:
                raise
            except ValueError as e:  # text PostgreSQL cannot hold (a NUL character): the file is skipped
                report.skipped.append(SkippedFile(path, str(e)))
                report.drop(path)
                if path in old_files:
                    self._apply(path, None, {})
        if rebuild or old_settings != self.settings:
            self._record_settings()
        report.reused = len(known - self.embedded)
        report.saved = bool(report.removed or chunked or rebuild)
        report.passages, report.files = len(self.store), len(self._manifest()[0])

    # -- reading -------------------------------------------------------------------------------

    def _manifest(self) -> tuple[dict[str, str], dict[str, Any] | None]:
        """Path -> SHA-256 of the files the collection holds, and its chunking settings."""
        if self.store.collection_id is None:
            return {}, None
        t = self.store._tables()
        with self.store._transaction(write=False) as conn:
            rows = conn.execute(sql.SQL("SELECT path, sha256 FROM {}").format(t.files)).fetchall()
            settings = conn.execute(
                "SELECT settings FROM ragspec_collections WHERE id = %s", (self.store.collection_id,)
            ).fetchone()
        return {r[0]: r[1] for r in rows}, (settings[0] if settings else None)

    def _scan(self, paths: list[str]) -> dict[str, tuple[str, int]]:
        digests: dict[str, tuple[str, int]] = {}
        self.tracker.start("scan", files_total=len(paths))
        for path in paths:
            size = 0
            try:
                digests[path] = file_digest(path, max_file_bytes=self.max_file_bytes)
                size = digests[path][1]
            except FileSkippedError as e:
                self.report.skipped.append(SkippedFile(e.path, e.reason))
            self.tracker.advance(files=1, nbytes=size)
        return digests

    def _chunk(self, paths: list[str], digests: dict[str, tuple[str, int]]) -> dict[str, tuple[FileRecord, dict[str, str]]]:
        """Each readable file's record and the texts of its distinct chunks; unreadable ones are skipped (and removed)."""
        self.tracker.start("chunk", files_total=len(paths), bytes_total=sum(digests[p][1] for p in paths))
        empty = FaissVectorStore(self.embeddings)  # `_chunk_file` then returns every distinct chunk's text
        chunked: dict[str, tuple[FileRecord, dict[str, str]]] = {}
        for path in paths:
            done_before = self.tracker.snapshot.bytes_done
            try:
                chunks = _chunk_file(path, self.chunking, self.max_file_bytes, empty, self.tracker)
            except FileSkippedError as e:
                self.report.skipped.append(SkippedFile(e.path, e.reason))
                chunks = None
            self.tracker.advance(files=1, nbytes=done_before + digests[path][1] - self.tracker.snapshot.bytes_done)
            if chunks is not None and not chunks.record.refs:
                self.report.skipped.append(SkippedFile(path, "no text to index after chunking"))
                chunks = None
            if chunks is None:
                self.report.drop(path)
                continue
            chunked[path] = (chunks.record, chunks.texts)
            self.report.chunks_read += chunks.record.chunks
        return chunked

    # -- one file ------------------------------------------------------------------------------

    def _apply(self, path: str, record: FileRecord | None, texts: dict[str, str]) -> None:
        """Replace `path`'s refs by `record`'s (None: remove the file) and bring every affected chunk in step, in one transaction."""
        store = self.store
        new_refs = {ref.key: ref for ref in record.refs} if record is not None else {}
        others, old_keys, stored = self._state(path, list(new_refs))
        affected = list(dict.fromkeys([*old_keys, *new_refs]))
        gone: list[str] = []
        embed: list[Document] = []
        relabel: list[tuple[str, str, dict[str, Any]]] = []
        for key in affected:
            holders = sorted({*(p for p, _ in others.get(key, [])), *([path] if key in new_refs else [])})
            if not holders:
                if key in stored:
                    gone.append(key)
                continue
            primary = holders[0]
            ref = new_refs[key] if primary == path else dict(others[key])[primary]
            current = stored.get(key)
            if primary == path and key in texts:
                text = texts[key]
            else:
                text = current.page_content if current is not None else texts.get(key, "")
            metadata = {**ref.metadata, "source": primary, "file_name": Path(primary).name, "sources": holders, "chunk_id": key}
            wanted = Document(id=key, page_content=text, metadata=metadata)
            if current is None or contextual_text(current) != contextual_text(wanted):
                embed.append(wanted)
            elif current.metadata != metadata or current.page_content != text:
                relabel.append((key, text, metadata))
        rows = []
        for start in range(0, len(embed), self.batch_size):
            batch = embed[start : start + self.batch_size]
            rows += store.prepare_rows(
                [d.page_content for d in batch], embed_chunks(self.embeddings, batch), [d.metadata for d in batch], [str(d.id) for d in batch]
            )
            self.tracker.advance(chunks=len(batch))
        if rows:
            store._ensure_collection(len(rows[0].vector))
        if store.collection_id is None:
            return  # nothing stored and nothing to store
        t = store._tables()
        with store._transaction(write=True) as conn:
            conn.execute(sql.SQL("DELETE FROM {} WHERE path = %s").format(t.files), (path,))  # its refs go with it
            if record is not None:
                conn.execute(
                    sql.SQL("INSERT INTO {} (path, sha256, size, chunks) VALUES (%s, %s, %s, %s)").format(t.files),
                    (path, record.sha256, record.size, record.chunks),
                )
                with conn.cursor() as cur:
                    cur.executemany(
                        sql.SQL("INSERT INTO {} (path, position, key, text_sha, metadata) VALUES (%s, %s, %s, %s, %s)").format(t.refs),
                        [(path, i, ref.key, ref.text_sha, Jsonb(ref.metadata)) for i, ref in enumerate(record.refs)],
                    )
            store.delete_rows(conn, gone)
            store.write_rows(conn, rows)
            store.update_metadata(conn, relabel)
            if self.report.rebuilt is None:
                conn.execute("UPDATE ragspec_collections SET settings = %s WHERE id = %s", (Jsonb(self.settings), store.collection_id))
        self.embedded.update(str(d.id) for d in embed)
        self.report.embedded += len(embed)
        self.report.reembedded += sum(1 for d in embed if d.id in stored)
        self.report.removed_chunks += len(gone)

    def _state(
        self, path: str, new_keys: list[str]
    ) -> tuple[dict[str, list[tuple[str, ChunkRef]]], list[str], dict[str, Document]]:
        """Other files' refs to the affected keys, `path`'s old keys, and the stored chunks of the affected keys."""
        store = self.store
        if store.collection_id is None:
            return {}, [], {}
        t = store._tables()
        with store._transaction(write=False) as conn:
            old_keys = [r[0] for r in conn.execute(
                sql.SQL("SELECT key FROM {} WHERE path = %s ORDER BY position").format(t.refs), (path,)
            ).fetchall()]  # fmt: skip
            affected = list(dict.fromkeys([*old_keys, *new_keys]))
            rows = conn.execute(
                sql.SQL("SELECT key, path, text_sha, metadata FROM {} WHERE key = ANY(%s) AND path <> %s").format(t.refs),
                (affected, path),
            ).fetchall()
        others: dict[str, list[tuple[str, ChunkRef]]] = {}
        for key, other, sha, metadata in rows:
            others.setdefault(key, []).append((other, ChunkRef(key, sha, metadata)))
        stored = {doc.id: doc for doc in store.get_by_ids(affected) if doc.id}
        return others, old_keys, stored

    def _record_settings(self) -> None:
        if self.store.collection_id is None:
            return
        with self.store._transaction(write=True) as conn:
            conn.execute(
                "UPDATE ragspec_collections SET settings = %s WHERE id = %s", (Jsonb(self.settings), self.store.collection_id)
            )


def _existing(store: PgVectorStore, keys: list[str]) -> set[str]:
    with store._transaction(write=False) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {} WHERE id = ANY(%s)").format(store._tables().chunks), (keys,)).fetchall()
    return {r[0] for r in rows}

