"""Keep an index in step with files and folders: incremental, deduplicated, streamed, atomic.

``sync_index(paths, index_dir, embeddings)`` makes the index in `index_dir` hold the chunks
of exactly the files found under `paths`, doing as little work as it can:

- **Incremental.** The index's file catalog (`retrievers.catalog`) records each file's
  SHA-256. Every file is hashed again (in blocks); only new and changed files are read and
  chunked, chunks of deleted files go, and unchanged files cost nothing more. If the
  chunking settings or the embedding model differ from those recorded, or the index has no
  catalog (saved by `FaissVectorStore.save` or an older ragspec), everything is rebuilt and
  the report says why. Nothing to do: the index is not even rewritten, and the embedding
  model is never loaded (it loads on the first text embedded).
- **Deduplicated.** A chunk's id is the hash of its whitespace-normalised text
  (`catalog.content_key`), so identical chunks, in several files or repeated in one, are
  embedded and stored once. The record keeps every file holding it in
  ``metadata["sources"]`` (sorted); ``metadata["source"]`` (the absolute path), ``file_name``
  (its last part, to filter by: ``{"file_name": {"$in": ["a.md", "b.pdf"]}}``) and the location
  fields (``start_index``, ``page``...) are those of the first of them. Removing one file keeps the
  chunk while another holds it. BM25 built from the store sees each chunk once.
- **Streamed.** Text and Markdown files are read block by block and chunked a window at a
  time (`split_stream`), so a large file is never held whole; HTML, PDF and converted (Office,
  EPUB, CSV, notebook) files are parsed whole (within the per-file size limit). New chunks are embedded in batches. Memory grows
  with the distinct new text (which the index then holds), not with the file size.
- **Atomic.** Everything happens in memory; the index folder is written once, at the end,
  by `FaissVectorStore.save` (new files under fresh names, then one atomic manifest
  replace, under the folder's write lock). An exception, a crash or Ctrl-C at any point
  before that replace leaves the previous index as it was.

Progress goes to an optional callback as `SyncProgress` snapshots (files, bytes, chunks,
rate and ETA per stage).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from retrievers.catalog import CATALOG_VERSION, Catalog, ChunkRef, FileRecord, content_key, text_sha
from retrievers.chunking import chunk_id, contextual_text, default_token_length, split_documents
from retrievers.embeddings import embed_chunks, embeddings_fingerprint
from retrievers.errors import FileSkippedError, IndexNotFoundError, IndexVersionError, NothingToIndexError
from retrievers.faiss_store import FaissVectorStore, IndexConfig
from retrievers.loaders import (
    DEFAULT_MAX_FILE_BYTES,
    SkippedFile,
    file_digest,
    file_type,
    find_files,
    iter_text,
    load_file,
    markdown_title,
)
from retrievers.persistence import DEFAULT_LOCK_TIMEOUT_S, read_manifest

__all__ = ["CHUNKER_REVISION", "ChunkingSettings", "SyncProgress", "SyncReport", "split_stream", "sync_index"]

CHUNKER_REVISION = 1
"""Recorded with the chunking settings; bump it when `split_documents` or `split_stream` start
cutting the same text differently, so that synced indexes are rebuilt instead of mixing both.
``tests/retrievers/test_ingest.py::test_the_chunker_revision_names_how_text_is_cut`` fails on
such a change until the revision is bumped and the new cut's digest recorded there."""

_PARAGRAPH = re.compile("\n\n")
_MAX_WINDOWS = 8  # a window grows to this many times window_chars waiting for a paragraph break


@dataclass(frozen=True)
class ChunkingSettings:
    """How files are cut into chunks; recorded in the index, and a change rebuilds it."""

    chunk_size: int = 256
    """Largest chunk, in tokens of `length_function`."""
    chunk_overlap: int = 32
    """Tokens shared by consecutive chunks of a document."""
    window_chars: int = 2**20
    """Characters of a text file chunked at a time (`split_stream`); larger files are streamed."""
    length_function: Callable[[str], int] | None = None
    """Token counter; None: the default embedding model's tokenizer (`default_token_length`)."""

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")
        if not 0 <= self.chunk_overlap < self.chunk_size:
            raise ValueError(
                f"chunk_overlap must be in [0, chunk_size), got {self.chunk_overlap} for chunk_size {self.chunk_size}"
            )
        if self.window_chars < 64:
            raise ValueError(f"window_chars must be at least 64, got {self.window_chars}")

    def fingerprint(self) -> dict[str, Any]:
        """What the catalog records: everything that decides where chunks are cut."""
        fn = self.length_function
        length = "default" if fn is None else _counter_identity(fn)
        return {
            "chunker": CHUNKER_REVISION,
            "chunk_size": self.chunk_size,
            "chunk_overlap": self.chunk_overlap,
            "window_chars": self.window_chars,
            "length": length,
        }


_PROBES = ("", "a", "The ferry leaves at noon.", "naïve café, Zürich — 東京 🚢", "x" * 300, "word " * 120)


def _counter_identity(fn: Callable[[str], int]) -> str:
    """A custom token counter by name (no memory address: ``functools.partial`` and callable objects
    print one) and by its counts on a few fixed texts: the same counter matches in a new process,
    and two lambdas that count differently do not."""
    target = getattr(fn, "func", fn)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    return f"{name} {[int(fn(text)) for text in _PROBES]}"


@dataclass(frozen=True)
class SyncProgress:
    """A snapshot of `sync_index`'s progress.

    Stages, in order: ``"scan"`` (hash every file: files and bytes), ``"chunk"`` (read and
    chunk new and changed files: files, bytes, chunks found), ``"embed"`` (embed the new
    distinct chunks: ``chunks_done`` of ``chunks_total``, known exactly), ``"save"``.
    """

    stage: str
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    chunks_done: int = 0
    """Chunks found (chunk stage) or embedded (embed stage)."""
    chunks_total: int | None = None
    """Chunks to embed (embed stage); None before it is known."""
    elapsed_s: float = 0.0
    """Seconds since the stage started."""

    @property
    def rate(self) -> float | None:
        """Chunks per second while embedding, bytes per second before; None until measurable."""
        if self.elapsed_s <= 0:
            return None
        done = self.chunks_done if self.stage == "embed" else self.bytes_done
        return done / self.elapsed_s if done else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left in this stage at the rate so far; None when unknown."""
        rate = self.rate
        if rate is None:
            return None
        if self.stage == "embed" and self.chunks_total is not None:
            return max(0.0, (self.chunks_total - self.chunks_done) / rate)
        if self.stage in ("scan", "chunk") and self.bytes_total:
            return max(0.0, (self.bytes_total - self.bytes_done) / rate)
        return None

    def as_dict(self) -> dict[str, Any]:
        rate, eta = self.rate, self.eta_s
        return {
            "stage": self.stage,
            "files_done": self.files_done,
            "files_total": self.files_total,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "chunks_done": self.chunks_done,
            "chunks_total": self.chunks_total,
            "elapsed_s": round(self.elapsed_s, 2),
            "rate": None if rate is None else round(rate, 2),
            "eta_s": None if eta is None else round(eta, 1),
        }


@dataclass
class SyncReport:
    """What `sync_index` did."""

    index_dir: Path
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """Files the index held that are gone (deleted, excluded, or now skipped)."""
    skipped: list[SkippedFile] = field(default_factory=list)
    rebuilt: str | None = None
    """Why everything was rebuilt; None for an incremental update (or a new index)."""
    chunks_read: int = 0
    """Chunks of the files read this time, repeats included."""
    embedded: int = 0
    """Texts sent to the embedding model: distinct chunks the index did not hold, and `reembedded`."""
    reembedded: int = 0
    """Chunks kept but embedded again: their first source changed, and with it the header embedded with them."""
    reused: int = 0
    """Distinct chunks of the files read that the index already held (their vectors were kept)."""
    duplicates: int = 0
    """Chunks read this time that repeat a text read earlier in the same run or the same file (stored once)."""
    removed_chunks: int = 0
    """Records deleted: no file holds their text any more."""
    passages: int = 0
    """Records (distinct chunks) in the index now."""
    files: int = 0
    """Files in the index now."""
    saved: bool = False
    """False when nothing changed and the index was left as it was."""
    seconds: float = 0.0

    def drop(self, path: str) -> None:
        """A file found but not indexable after all: not in the index now, and removed from it if it was there."""
        for group in (self.new, self.changed, self.unchanged):
            if path in group:
                group.remove(path)
                if group is not self.new:
                    self.removed.append(path)

    def files_line(self) -> str:
        """``2 new, 1 changed, 3 unchanged, 1 removed`` (zero counts left out, but never all)."""
        parts = [(len(self.new), "new"), (len(self.changed), "changed"), (len(self.unchanged), "unchanged"), (len(self.removed), "removed")]
        shown = [f"{n} {word}" for n, word in parts if n] or ["no files"]
        return ", ".join(shown)


Progress = Callable[[SyncProgress], None]


def sync_index(
    paths: str | Path | Sequence[str | Path],
    index_dir: str | Path,
    embeddings: Embeddings,
    *,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    chunking: ChunkingSettings | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    batch_size: int = 64,
    index: IndexConfig | None = None,
    progress: Progress | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
) -> tuple[FaissVectorStore, SyncReport]:
    """Create or update the index in `index_dir` so that it holds the files under `paths`, and save it.

    Args:
        paths: Files and folders, as for `load_documents` (`include`/`exclude` filter walks).
        index_dir: The index folder; created when missing.
        embeddings: Used only for new chunks; its model is not loaded when nothing is new.
        chunking: `ChunkingSettings` (default 256-token chunks, 32 overlap).
        max_file_bytes: Larger files are skipped with a reason (and dropped from the index).
        batch_size: Chunks per `embed_documents` call (and per progress update).
        index: `FlatIndex()` (default) or `HNSWIndex(...)` for a new or rebuilt index.
        progress: Called with a `SyncProgress` as work advances.
        lock_timeout: Passed to `FaissVectorStore.save`.

    Returns:
        The store as saved (or as it was, when nothing changed) and a `SyncReport`.

    Raises:
        NothingToIndexError: no text in `paths`; the index is left as it was.
        IndexVersionError: the index was written by a newer ragspec; it is left as it was.
        IndexCorruptError: the index is damaged; rebuild it into an empty folder.
        IndexSaveError, IndexLockedError: from the save; the previous index is intact.
    """
    started = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    chunking = chunking or ChunkingSettings()
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    index_dir = Path(index_dir)
    tracker = _Tracker(progress)
    report = SyncReport(index_dir)

    settings = chunking.fingerprint()
    fingerprint = embeddings_fingerprint(embeddings)
    store, old, report.rebuilt = _open(index_dir, embeddings, settings, fingerprint, index)

    files, unwalked = find_files(paths, include, exclude)
    report.skipped.extend(unwalked)
    digests = _scan(list(dict.fromkeys(str(f) for f in files)), max_file_bytes, tracker, report)
    for path, (sha, _) in digests.items():
        before = old.files.get(path)
        (report.new if before is None else report.unchanged if before.sha256 == sha else report.changed).append(path)
    report.removed = [path for path in old.files if path not in digests]

    plan = _Plan(store, old)
    read = list(digests) if report.rebuilt else [*report.new, *report.changed]
    _chunk_files(read, digests, chunking, max_file_bytes, plan, tracker, report)
    kept = {} if report.rebuilt else {p: old.files[p] for p in report.unchanged}
    files_now = {p: plan.read[p] if p in plan.read else kept[p] for p in digests if p in plan.read or p in kept}

    if not files_now:
        raise NothingToIndexError(_nothing_message(paths, report.skipped, index_dir, bool(old.files)))
    # Chunks stored by a ragspec that did not record ``file_name`` get it (their metadata only: the
    # embedded text does not change, so nothing is embedded again).
    unnamed = [] if report.rebuilt else [doc.id for doc in store.documents() if "file_name" not in doc.metadata and doc.id]
    if not report.rebuilt and not plan.read and not report.removed and not unnamed:
        report.passages, report.files = len(store), len(files_now)
        report.seconds = time.perf_counter() - started
        return store, report  # nothing changed: not even rewritten

    affected = list(dict.fromkeys([*plan.affected_keys(report.removed), *unnamed]))
    holders = _holders(files_now, affected)
    texts = _texts_for(store, holders, files_now, plan, chunking, max_file_bytes)
    gone = [key for key in affected if not holders[key] and key in store]
    store.delete(gone)
    report.removed_chunks = len(gone)
    # Kept chunks get their new sources; one whose embedded text (header and text) changes with its
    # first source is embedded again, so that its vector is the one a fresh build would compute.
    kept_records = [_record(k, texts[k], holders[k], files_now) for k in affected if holders[k] and k not in plan.pending]
    before = {doc.id: contextual_text(doc) for doc in store.get_by_ids([doc.id for doc in kept_records if doc.id])}
    again = [doc for doc in kept_records if contextual_text(doc) != before[doc.id]]
    store.update_documents([doc for doc in kept_records if contextual_text(doc) == before[doc.id]])
    new_records = [_record(key, texts[key], holders[key], files_now) for key in plan.pending]
    _embed(store, embeddings, new_records + again, batch_size, tracker, report)
    report.reembedded = len(again)
    report.reused = len(plan.known - {doc.id for doc in again})
    report.duplicates = report.chunks_read - len(plan.pending) - len(plan.known)

    store.catalog = Catalog(settings=settings, embedding=fingerprint, files=files_now)
    tracker.start("save")
    store.save(index_dir, lock_timeout=lock_timeout)
    report.saved = True
    report.passages, report.files = len(store), len(files_now)
    report.seconds = time.perf_counter() - started
    return store, report


# -- opening ------------------------------------------------------------------------------------


def _open(
    index_dir: Path, embeddings: Embeddings, settings: dict[str, Any], fingerprint: str, index: IndexConfig | None
) -> tuple[FaissVectorStore, Catalog, str | None]:
    """The store to update, the catalog to compare the files with, and why everything is rebuilt (or None).

    For a rebuild the store is a new, empty one (the saved index stays as it is until the save).
    """
    empty = Catalog(settings=settings, embedding=fingerprint)
    try:
        manifest = read_manifest(index_dir)
    except IndexNotFoundError:
        return FaissVectorStore(embeddings, index=index), empty, None
    section = manifest.get("ingest")
    version = section.get("version") if isinstance(section, dict) else None
    if isinstance(version, int) and version > CATALOG_VERSION:
        raise IndexVersionError(
            f"the index in {index_dir} was written by a newer ragspec (file catalog version {version}, this one "
            f"knows up to {CATALOG_VERSION}); upgrade ragspec, or index into another folder. It was left as it was"
        )
    store = FaissVectorStore.load(index_dir, embeddings, check_embeddings=False)
    catalog = store.catalog
    fresh = FaissVectorStore(embeddings, index=index or store.index_config)
    if catalog is None:
        reason = "the index has no file catalog (saved by FaissVectorStore.save, or by a ragspec before incremental ingest)"
        return fresh, empty, reason
    if catalog.settings != settings:
        changes = ", ".join(
            f"{name} {catalog.settings.get(name)!r} -> {value!r}"
            for name, value in settings.items()
            if catalog.settings.get(name) != value
        )
        return fresh, catalog, f"the chunking settings changed ({changes})"
    if catalog.embedding != fingerprint:
        return fresh, catalog, f"the embedding model changed ({catalog.embedding} -> {fingerprint})"
    if index is not None and index != store.index_config:
        return fresh, catalog, f"the index type changed ({store.index_config} -> {index})"
    stored = {doc.id for doc in store.documents()}
    listed = catalog.keys()
    if stored != listed:
        reason = (
            f"the index was changed outside sync_index ({len(stored - listed)} passage(s) not in its file catalog, "
            f"{len(listed - stored)} missing)"
        )
        return fresh, catalog, reason
    return store, catalog, None


def _nothing_message(paths: Sequence[str | Path], skipped: list[SkippedFile], index_dir: Path, existing: Any) -> str:
    shown = 10
    reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:shown])
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    hint = f"; {len(skipped)} file(s) skipped: {reasons}{more}" if skipped else ""
    kept = f" (the index in {index_dir} was left as it was)" if existing else ""
    return f"found no text to index in {', '.join(map(str, paths))}{hint}{kept}"


# -- scanning and chunking ----------------------------------------------------------------------


def _scan(paths: list[str], max_file_bytes: int, tracker: _Tracker, report: SyncReport) -> dict[str, tuple[str, int]]:
    """SHA-256 and size of each readable file; the others go to ``report.skipped``."""
    digests: dict[str, tuple[str, int]] = {}
    tracker.start("scan", files_total=len(paths))
    for path in paths:
        size = 0
        try:
            digests[path] = file_digest(path, max_file_bytes=max_file_bytes)
            size = digests[path][1]
        except FileSkippedError as e:
            report.skipped.append(SkippedFile(e.path, e.reason))
        tracker.advance(files=1, nbytes=size)
    return digests


@dataclass
class _FileChunks:
    """A file read this time: its catalog record and the texts of its distinct chunks that may be needed."""

    record: FileRecord
    texts: dict[str, str]


class _Plan:
    """What reading the files found: their records, and the distinct chunks the store does not hold yet."""

    def __init__(self, store: FaissVectorStore, old: Catalog) -> None:
        self.store = store
        self.old = old
        self.read: dict[str, FileRecord] = {}
        self.texts: dict[str, dict[str, str]] = {}
        self.pending: dict[str, None] = {}
        """Keys to embed, in the order first found (a dict as an ordered set)."""
        self.known: set[str] = set()
        """Keys found that the store already holds."""

    def add(self, path: str, chunks: _FileChunks) -> None:
        self.read[path] = chunks.record
        self.texts[path] = chunks.texts
        for ref in chunks.record.refs:
            if ref.key in self.store:
                self.known.add(ref.key)
            else:
                self.pending.setdefault(ref.key)

    def affected_keys(self, removed: list[str]) -> list[str]:
        """Keys whose record may change: those of files read, removed, or changed (old and new chunks)."""
        keys: dict[str, None] = {}
        for path in [*self.read, *removed]:
            for record in (self.old.files.get(path), self.read.get(path)):
                for ref in record.refs if record is not None else ():
                    keys.setdefault(ref.key)
        return list(keys)


def _chunk_files(
    paths: list[str],
    digests: dict[str, tuple[str, int]],
    chunking: ChunkingSettings,
    max_file_bytes: int,
    plan: _Plan,
    tracker: _Tracker,
    report: SyncReport,
) -> None:
    tracker.start("chunk", files_total=len(paths), bytes_total=sum(digests[p][1] for p in paths))
    for path in paths:
        done_before = tracker.snapshot.bytes_done
        try:
            chunks = _chunk_file(path, chunking, max_file_bytes, plan.store, tracker)
        except FileSkippedError as e:
            report.skipped.append(SkippedFile(e.path, e.reason))
            chunks = None
        tracker.advance(files=1, nbytes=done_before + digests[path][1] - tracker.snapshot.bytes_done)
        if chunks is None:
            report.drop(path)
            continue
        if not chunks.record.refs:
            report.skipped.append(SkippedFile(path, "no text to index after chunking"))
            report.drop(path)
            continue
        plan.add(path, chunks)
        report.chunks_read += chunks.record.chunks


def _chunk_file(
    path: str,
    chunking: ChunkingSettings,
    max_file_bytes: int,
    store: FaissVectorStore,
    tracker: _Tracker,
) -> _FileChunks:
    """Chunk one file into its catalog record and the texts of its distinct chunks the store lacks.

    Every file is hashed as it is read for chunking (text and Markdown streamed, HTML, PDF and
    converted files whole), so the record has the hash of what was chunked: a file rewritten
    after the scan is recorded as read, and the next sync sees whether it changed since.
    """
    kind = file_type(path)
    counter = _CountingDigest(tracker)
    if kind not in ("txt", "md"):
        loaded = load_file(path, max_file_bytes=max_file_bytes, warn=False, digest=counter)
        if loaded.skipped:
            raise FileSkippedError(path, loaded.skipped[0].reason)
        chunks: Iterable[Document] = split_documents(
            loaded.documents, chunking.chunk_size, chunking.chunk_overlap, chunking.length_function
        )
    else:
        metadata: dict[str, Any] = {"source": path, "file_name": Path(path).name, "file_type": kind}
        if kind == "md":
            with closing(iter_text(path, max_file_bytes=max_file_bytes)) as blocks:
                title = markdown_title(blocks)  # read only up to the first heading
            if title:
                metadata["title"] = title
        chunks = split_stream(iter_text(path, max_file_bytes=max_file_bytes, digest=counter), metadata, chunking)
    refs: dict[str, ChunkRef] = {}
    texts: dict[str, str] = {}
    count = 0
    for chunk in chunks:
        count += 1
        tracker.found(1)
        key = content_key(chunk.page_content)
        if key in refs:
            continue
        occurrence = {k: v for k, v in chunk.metadata.items() if k not in ("source", "sources", "chunk_id")}
        ref = refs[key] = ChunkRef(key, text_sha(chunk.page_content), occurrence)
        stored = store.get_by_ids([key])
        if not stored or text_sha(stored[0].page_content) != ref.text_sha:
            texts[key] = chunk.page_content
    return _FileChunks(FileRecord(counter.sha.hexdigest(), counter.size, count, tuple(refs.values())), texts)


class _CountingDigest:
    """Hashes the bytes `iter_text` reads and reports them as progress."""

    def __init__(self, tracker: _Tracker) -> None:
        self.sha = hashlib.sha256()
        self.tracker = tracker
        self.size = 0

    def update(self, data: bytes) -> None:
        self.sha.update(data)
        self.size += len(data)
        if data:
            self.tracker.advance(nbytes=len(data))


def split_stream(blocks: Iterable[str], metadata: dict[str, Any], chunking: ChunkingSettings) -> Iterator[Document]:
    """Chunks of the text that `blocks` make up, holding about ``chunking.window_chars`` of it at a time.

    The chunks (texts, ids, ``chunk_index``, ``start_index``) are the ones
    ``split_documents([Document(text, metadata)], ...)`` gives for the whole text, as long as
    the text has a blank line at least every window. Each window ends at a blank line and is
    cut with `split_documents`; its last chunk may continue past the window, so it is held
    back, and the next window starts at the paragraph that begins the latest chunk kept back:
    there the whole-text splitter starts a chunk afresh too. (When the window's last paragraph
    is itself longer than a chunk, every chunk is final and the next window starts after it.)
    Text without a blank line in eight windows is cut where a chunk starts, and the chunks
    around that cut may differ from the whole-text ones.
    """
    source = str(metadata.get("source", ""))
    page = metadata.get("page")
    length = chunking.length_function or default_token_length
    seen: dict[bytes, int] = {}  # occurrences of each text so far, for `chunk_id`
    index = 0
    base = 0  # offset of `buffer` in the whole text
    buffer = ""
    stream = iter(blocks)
    exhausted = False
    want = chunking.window_chars
    while True:
        while not exhausted and len(buffer) < want:
            block = next(stream, None)
            if block is None:
                exhausted = True
            else:
                buffer += block
        capped = len(buffer) >= _MAX_WINDOWS * chunking.window_chars
        before = cut = 0
        if not exhausted:
            before, cut = _last_paragraph_ends(buffer)
            if cut == 0 and not capped:
                want = len(buffer) + chunking.window_chars  # no blank line yet: read on
                continue
        window = buffer if exhausted or not cut else buffer[:cut]
        pieces = split_documents(
            [Document(page_content=window, metadata=metadata)],
            chunking.chunk_size,
            chunking.chunk_overlap,
            chunking.length_function,
        )
        if exhausted:
            restart, keep = len(window), len(pieces)
        elif cut and length(window[before:cut]) >= chunking.chunk_size:
            restart, keep = len(window), len(pieces)  # a long last paragraph: nothing is merged across the cut
        else:
            found = _restart(window, pieces)
            if found is None and not capped:
                want = len(buffer) + chunking.window_chars  # no chunk to restart at yet: read on
                continue
            restart, keep = found or _approximate_restart(window, pieces)
        for piece in pieces[:keep]:
            text = piece.page_content
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            occurrence = seen.get(digest, 0)
            seen[digest] = occurrence + 1
            cid = chunk_id(source, page, text, occurrence)
            start = piece.metadata.get("start_index")
            meta = {
                **piece.metadata,
                "chunk_id": cid,
                "chunk_index": index,
                "start_index": start + base if isinstance(start, int) and start >= 0 else start,
            }
            index += 1
            yield Document(id=cid, page_content=text, metadata=meta)
        if exhausted:
            return
        buffer = buffer[restart:]
        base += restart
        want = chunking.window_chars


def _last_paragraph_ends(text: str) -> tuple[int, int]:
    """Ends of the last two blank-line separators the splitter finds in `text` (scanning from its start); 0 for none."""
    before = last = 0
    for match in _PARAGRAPH.finditer(text):
        before, last = last, match.end()
    return before, last


def _restart(window: str, pieces: list[Document]) -> tuple[int, int] | None:
    """(offset of the next window, number of chunks to keep) for a window that more text follows.

    The last chunk is never kept. The next window starts at the paragraph that begins the
    latest other chunk (not the first, so that the window advances); None when there is none.
    """
    for m in range(len(pieces) - 2, 0, -1):
        start = pieces[m].metadata.get("start_index")
        if isinstance(start, int) and start > 0:
            at = _paragraph_start(window, start)
            if at is not None and at > 0:
                return at, m
    return None


def _approximate_restart(window: str, pieces: list[Document]) -> tuple[int, int]:
    """For a window too long to wait for a paragraph break: restart where the last chunk starts."""
    if len(pieces) >= 2:
        start = pieces[-1].metadata.get("start_index")
        if isinstance(start, int) and start > 0:
            return start, len(pieces) - 1
    return len(window), len(pieces)


def _paragraph_start(window: str, start: int) -> int | None:
    """Where the splitter's paragraph that the chunk at `start` begins with starts; None if the chunk starts mid-paragraph."""
    p = start
    while p > 0 and window[p - 1].isspace():
        p -= 1
    ends = [m.end() for m in _PARAGRAPH.finditer(window, p, start)]
    if ends:
        return ends[-1]
    return 0 if p == 0 else None


# -- records ------------------------------------------------------------------------------------


def _holders(files: dict[str, FileRecord], keys: list[str]) -> dict[str, list[str]]:
    """For each key, the files holding it, sorted (the first is the record's primary source)."""
    wanted = set(keys)
    holders: dict[str, list[str]] = {key: [] for key in keys}
    for path in sorted(files):
        for ref in files[path].refs:
            if ref.key in wanted:
                holders[ref.key].append(path)
    return holders


def _texts_for(
    store: FaissVectorStore,
    holders: dict[str, list[str]],
    files: dict[str, FileRecord],
    plan: _Plan,
    chunking: ChunkingSettings,
    max_file_bytes: int,
) -> dict[str, str]:
    """The text each affected record must hold: its primary source's occurrence.

    Usually the record already holds it or the file was just read. When a removal makes an
    unchanged file the primary source and its copy differs in whitespace, that file is read
    again for the text (its chunks are not embedded again).
    """
    texts: dict[str, str] = {}
    reread: dict[str, list[str]] = {}
    for key, paths in holders.items():
        if not paths:
            continue
        primary = paths[0]
        ref = _ref(files[primary], key)
        stored = store.get_by_ids([key])
        if stored and text_sha(stored[0].page_content) == ref.text_sha:
            texts[key] = stored[0].page_content
        elif key in plan.texts.get(primary, {}):
            texts[key] = plan.texts[primary][key]
        else:
            reread.setdefault(primary, []).append(key)
    for path, keys in reread.items():
        try:
            fresh = _chunk_file(path, chunking, max_file_bytes, FaissVectorStore(store.embeddings), _Tracker(None)).texts
        except FileSkippedError:
            fresh = {}
        for key in keys:  # a file changed since the scan: keep the text held (the next sync reads the file)
            stored = store.get_by_ids([key])
            texts[key] = fresh.get(key) or (stored[0].page_content if stored else "")
    return texts


def _ref(record: FileRecord, key: str) -> ChunkRef:
    return next(ref for ref in record.refs if ref.key == key)


def _record(key: str, text: str, paths: list[str], files: dict[str, FileRecord]) -> Document:
    """The stored document for a chunk: the primary source's metadata, plus every source."""
    primary = paths[0]
    metadata = {**_ref(files[primary], key).metadata, "source": primary, "file_name": Path(primary).name,
                "sources": list(paths), "chunk_id": key}  # fmt: skip
    return Document(id=key, page_content=text, metadata=metadata)


def _embed(
    store: FaissVectorStore,
    embeddings: Embeddings,
    records: list[Document],
    batch_size: int,
    tracker: _Tracker,
    report: SyncReport,
) -> None:
    """Embed and add (or replace) `records` in batches, reporting each batch."""
    tracker.start("embed", chunks_total=len(records))
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        vectors = embed_chunks(embeddings, batch)  # what retrieval compares: header and text
        store.add_embeddings(
            [doc.page_content for doc in batch], vectors, [doc.metadata for doc in batch], [str(doc.id) for doc in batch]
        )
        report.embedded += len(batch)
        tracker.advance(chunks=len(batch))


# -- progress -----------------------------------------------------------------------------------


class _Tracker:
    """Builds `SyncProgress` snapshots and hands them to the callback."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.snapshot = SyncProgress("scan")
        self._started = time.perf_counter()

    def start(self, stage: str, *, files_total: int = 0, bytes_total: int = 0, chunks_total: int | None = None) -> None:
        self._started = time.perf_counter()
        self.snapshot = SyncProgress(stage, files_total=files_total, bytes_total=bytes_total, chunks_total=chunks_total)
        self._emit()

    def advance(self, *, files: int = 0, nbytes: int = 0, chunks: int = 0) -> None:
        s = self.snapshot
        self.snapshot = replace(
            s,
            files_done=s.files_done + files,
            bytes_done=s.bytes_done + nbytes,
            chunks_done=s.chunks_done + chunks,
            elapsed_s=time.perf_counter() - self._started,
        )
        self._emit()

    def found(self, chunks: int) -> None:
        """Chunks found while chunking: counted, reported with the next byte or file update."""
        self.snapshot = replace(self.snapshot, chunks_done=self.snapshot.chunks_done + chunks)

    def _emit(self) -> None:
        if self.callback is not None:
            self.callback(self.snapshot)
