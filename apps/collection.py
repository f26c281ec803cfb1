"""What the CLI and the web app share: building an index from files, and answering over it.

The CLI and the web app go through the two pieces here (``apps.demo`` shows the pipeline,
``ragspec.DocumentQA``, used directly):

- ``update_index`` creates or incrementally updates a saved index from files and folders
  (``retrievers.ingest.sync_index``: only new and changed files are read and embedded, identical
  passages stored once, the index replaced atomically), with truthful progress;
- ``Collection`` answers questions over a saved index as a stream of ``Token`` events followed
  by the pipeline's ``Answer`` (its citations, whether a passage backs it, and its
  ``GenerationStats``).

Everything heavy (torch, the models) is imported on first use, so ``ragspec --help`` is instant.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from ragspec.engine.config import DEFAULT_MAX_TOKENS, GenerationConfig, request_max_tokens
from ragspec.engine.text import question_text

if TYPE_CHECKING:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings

    from ragspec.answers import Answer, AnswerStream
    from ragspec.pipeline import GenerationSource
    from retrievers.ingest import SyncProgress, SyncReport


class AppError(RuntimeError):
    """A problem the user can fix (bad path, empty folder, missing index); the message says how."""


# -- building an index ------------------------------------------------------------------------


@dataclass(frozen=True)
class Skipped:
    """A file that was not indexed, and why."""

    path: str
    reason: str


@dataclass
class IndexSummary:
    """What ``update_index`` did."""

    files: list[str] = field(default_factory=list)
    """Sources that produced at least one chunk."""
    chunks: int = 0
    """Passages in the index (for ``update_index``: distinct ones, as stored)."""
    skipped: list[Skipped] = field(default_factory=list)
    update: SyncReport | None = None
    """``update_index``'s report: new, changed, unchanged and removed files, passages embedded..."""


def update_index(
    paths: Sequence[str | Path],
    index_dir: str | Path,
    *,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    chunk_size: int = 256,
    chunk_overlap: int = 32,
    max_file_bytes: int | None = None,
    progress: Callable[[SyncProgress], None] | None = None,
    collection: str | None = None,
    embeddings: Embeddings | None = None,
) -> IndexSummary:
    """Create the index in ``index_dir`` from ``paths``, or bring an existing one up to date, and save it.

    Only new and changed files are read and embedded; passages of deleted files go; identical
    passages are embedded and stored once (``metadata["sources"]`` lists every file). If the
    chunking or the embedding model changed, everything is rebuilt (``summary.update.rebuilt``
    says why). The saved index is replaced atomically: an error or Ctrl-C leaves the previous
    one. ``max_file_bytes`` caps one file (default: the loader's, 100 MiB). Raises ``AppError``
    when a path does not exist or there is no text to index (the index is then left as it was).

    ``index_dir`` may be a ``postgresql://`` URL: the files then go into ``collection`` (default
    ``"default"``) of that database (``retrievers.pg_ingest.sync_collection``: one transaction per
    file, ingests into one collection take turns). ``embeddings`` (default: the bundled model) embed
    the new passages, e.g. ``retrievers.remote_embeddings.RemoteEmbeddings`` on a serving engine.
    """
    if not paths:
        raise AppError("no files or folders given")
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise AppError(f"no such file or folder: {', '.join(missing)}")

    from retrievers import DEFAULT_MAX_FILE_BYTES, NothingToIndexError, default_embeddings
    from retrievers.ingest import ChunkingSettings, sync_index
    from retrievers.store_url import is_database_url

    chunking = ChunkingSettings(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    embeddings = embeddings or default_embeddings()
    limit = DEFAULT_MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
    options: dict[str, Any] = {"include": include, "exclude": exclude, "chunking": chunking, "max_file_bytes": limit,
                               "progress": progress}  # fmt: skip
    try:
        if is_database_url(index_dir):
            from retrievers.pg_ingest import sync_collection

            store, report = sync_collection(list(paths), str(index_dir), embeddings, collection=collection or "default", **options)
            store.close()
            files = [*report.new, *report.changed, *report.unchanged]
        else:
            if collection is not None:
                raise AppError("a collection names a set of documents in a database; an index folder holds one")
            faiss_store, report = sync_index(list(paths), index_dir, embeddings, **options)
            files = list(faiss_store.catalog.files) if faiss_store.catalog is not None else []
    except NothingToIndexError as e:
        raise AppError(str(e)) from e
    return IndexSummary(
        files=files, chunks=report.passages, skipped=[Skipped(s.path, s.reason) for s in report.skipped], update=report
    )


# -- answering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    """A piece of the answer's text, with live counts."""

    text: str
    elapsed_s: float
    """Seconds since the question was asked."""
    tokens: int = 0
    """Tokens of the answer so far."""
    steps: int = 0
    """Text pieces so far: about one per target forward (a forward can add several tokens)."""
    acceptance: float | None = None
    """Accepted / drafted tokens so far, when the pipeline's stream reports live statistics."""
    tokens_per_forward: float | None = None
    """New tokens per target forward so far, when the stream reports live statistics."""


Event = Union[Token, "Answer"]
"""What ``Collection.stream`` yields: ``Token``s, then the pipeline's ``Answer`` (text, citations,
``supported``, stats); anything that is not a ``Token`` is the ``Answer``."""


class Collection:
    """Questions answered over one saved index (or a collection in PostgreSQL: ``index_dir`` a
    ``postgresql://`` URL, ``collection`` its name) by the speculative pipeline (``DocumentQA``).

    Answers are generated by the local ``model`` (run by ``backend``: ``"auto"``, ``"torch"`` or
    ``"llamacpp"``), or by ``source`` when given (a ``ragspec.remote.RemoteModel``: generation on
    an OpenAI-compatible server). ``options`` are generation options (``GenerationConfig`` names,
    e.g. ``repeat_penalty``) for every answer.
    """

    def __init__(
        self,
        index_dir: str | Path,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        k: int = 4,
        model: str = "default",
        history_turns: int = 8,
        source: GenerationSource | None = None,
        backend: str = "auto",
        options: Mapping[str, Any] | None = None,
        collection: str | None = None,
        embeddings: Embeddings | None = None,
    ) -> None:
        request_max_tokens(max_tokens)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {history_turns}")
        from retrievers.store_url import is_database_url

        self.index_dir: str | Path = str(index_dir) if is_database_url(index_dir) else Path(index_dir)
        """The index folder, or the ``postgresql://`` URL of the database holding ``collection``."""
        self.collection = collection
        self.embeddings = embeddings
        """Embed the questions (None: the bundled model); the index's model, as it was built with."""
        self.max_tokens = max_tokens
        self.k = k
        self.model = model
        self.backend = backend
        self.history_turns = history_turns
        self.source = source
        self.options = dict(options or {})
        GenerationConfig().merged(self.options)  # a bad option fails here, naming it
        self._qa: Any = None
        self._lock = threading.Lock()
        # The passages each recent answer was first shown with, by (question, answer): a history of
        # pairs is then laid out as it was asked, so each turn's prompt extends the previous one.
        self._shown: OrderedDict[tuple[str, str], tuple[Document, ...]] = OrderedDict()

    def load(self) -> Any:
        """The ``DocumentQA`` over this index, opened on first use (the models load lazily, shared)."""
        with self._lock:
            if self._qa is None:
                from ragspec.lc import ChatRagSpec
                from ragspec.pipeline import DocumentQA
                from retrievers import IndexNotFoundError

                # max_tokens is each call's (``stream``), whichever model answers
                llm = self.source if self.source is not None else ChatRagSpec(model=self.model, backend=self.backend)
                try:
                    self._qa = DocumentQA.from_store(
                        self.index_dir, collection=self.collection, llm=llm, k=self.k, embeddings=self.embeddings,
                        unsupported="flag",  # the apps show the note
                    )
                except IndexNotFoundError as e:
                    from retrievers.store_url import safe_label

                    raise AppError(f"nothing at {safe_label(str(self.index_dir), self.collection)}: build it with 'ragspec ingest'") from e
            return self._qa

    def close(self) -> None:
        """Close what the opened index holds (a database collection's connections); the next use opens it again."""
        with self._lock:
            qa, self._qa = self._qa, None
        store = getattr(getattr(qa, "retriever", None), "store", None)
        close = getattr(store, "close", None)
        if callable(close):
            close()

    def documents(self) -> list[str]:
        """The files the index was built from (as ``ragspec ingest`` recorded them), read from its manifest
        without loading it (a collection in PostgreSQL: from its manifest table); ``[]`` for an index saved
        without a file catalog."""
        from retrievers import IndexNotFoundError
        from retrievers.persistence import read_manifest

        shared = self._shared_memory()
        if shared is not None:  # a collection in PostgreSQL: its manifest is a table
            return list(shared.files())
        try:
            files = read_manifest(self.index_dir).get("ingest", {}).get("files", {})
        except IndexNotFoundError as e:
            raise AppError(f"no index at {self.index_dir}: build one with 'ragspec ingest'") from e
        return sorted(files) if isinstance(files, dict) else []

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Generator[Event, None, None]:
        """``Token`` events as the answer is generated, then the ``Answer``.

        ``history`` holds earlier (question, answer) pairs of the conversation (see ``answer_stream``).
        Closing the iterator early stops the generation and frees the model for the next request.
        """
        try:
            question = question_text(question)  # before the model loads: a clear error, at once
        except ValueError as e:
            raise AppError(str(e)) from e
        start = time.perf_counter()
        for event in _pipeline_events(self.answer_stream(question, history), start):
            if not isinstance(event, Token):
                self.remember(event)
            yield event

    def answer_stream(
        self, question: str, history: Sequence[tuple[str, str]] = (), options: Mapping[str, Any] | None = None,
        k: int | None = None,
    ) -> AnswerStream:
        """The pipeline's stream of the answer to ``question`` (retrieved now, generated as it is iterated).

        The last ``history_turns`` (question, answer) pairs of ``history`` (fewer when the context
        budget says so) are the conversation the pipeline retrieves with and asks the question after
        (``DocumentQA.stream(history=...)``), each with the passages it was first shown with when this
        collection answered it (``remember``), so that its prompt extends the previous turn's.
        ``options`` (``GenerationConfig`` names) override the collection's for this answer, ``k`` its
        number of passages.
        """
        from ragspec.prompts import Turn

        qa = self.load()
        earlier = history[-self.history_turns :] if self.history_turns else ()
        turns = [Turn(q, a, self.shown(q, a)) for q, a in earlier]
        options = {**self.options, "max_tokens": self.max_tokens, **(options or {})}
        return qa.stream(question, history=turns, k=k, **options)

    def remember(self, answer: Answer) -> None:
        """Keep the passages ``answer`` was first shown with, for when a later history holds it.

        Over a collection in PostgreSQL they are kept in the database too (``PgVectorStore.remember``),
        so another replica of the app lays out a follow-up to this answer exactly as this one would.
        """
        passages = answer.as_turn().passages
        with self._lock:
            self._shown[(answer.question.strip(), answer.text)] = passages
            while len(self._shown) > _REMEMBERED:
                self._shown.popitem(last=False)
        shared = self._shared_memory()
        if shared is not None:
            shared.remember(_turn_key(answer.question, answer.text), passages)

    def shown(self, question: str, answer: str) -> tuple[Document, ...]:
        """The passages the answer ``answer`` to ``question`` was first shown with (here or, over PostgreSQL,
        by any replica); empty when unknown."""
        with self._lock:
            kept = self._shown.get((question.strip(), answer))
        if kept is not None:
            return kept
        shared = self._shared_memory()
        found = shared.recall(_turn_key(question, answer)) if shared is not None else None
        return tuple(found or ())

    def _shared_memory(self) -> Any:
        """The `PgVectorStore` behind this collection (what replicas share), or None for an index folder."""
        from retrievers.store_url import is_database_url

        if not is_database_url(self.index_dir):
            return None
        return getattr(self.load().retriever, "store", None)


def _turn_key(question: str, answer: str) -> str:
    import hashlib

    return hashlib.sha256(f"{question.strip()}\x00{answer}".encode("utf-8", "surrogatepass")).hexdigest()


_REMEMBERED = 256
"""Answers whose passages a ``Collection`` remembers (beyond them, an old turn is laid out without its passages)."""


def _pipeline_events(stream: AnswerStream, start: float) -> Iterator[Event]:
    """Adapt a pipeline ``AnswerStream`` to ``Token`` events, then its ``Answer``.

    Counts come from the generation's live stats (``stream.stats``), not from re-tokenizing the
    text; without them (a stream that reports none) a token is counted per text piece.
    """
    steps = 0
    with stream:  # closing this iterator early closes the stream, which frees the model
        for delta in stream:
            if not delta:
                continue
            steps += 1
            live = stream.stats
            elapsed = time.perf_counter() - start
            if live is not None and live.forward_passes:
                yield Token(delta, elapsed, live.new_tokens, steps, live.acceptance_rate, live.tokens_per_forward)
            else:
                yield Token(delta, elapsed, steps, steps)
    if stream.answer is not None:  # None: the stream was cut short
        yield stream.answer
