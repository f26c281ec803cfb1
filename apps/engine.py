"""What the CLI and the web app share: building an index from files, and answering over it.

The apps never talk to the pipeline directly; they go through two small types here:

- ``build_index`` loads, chunks and embeds files into a ``FaissVectorStore`` (with a progress
  callback) and reports what it skipped;
- ``Collection`` answers questions over a saved index as a stream of ``Token`` events followed
  by one ``Finished`` event (the citations and the speed statistics).

Everything heavy (torch, the models) is imported on first use, so ``ragspec --help`` is instant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from retrievers import FaissVectorStore


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
    """What ``build_index`` did."""

    files: list[str] = field(default_factory=list)
    """Sources that produced at least one chunk."""
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)


Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``; ``stage`` is ``"load"`` or ``"embed"``."""


def build_index(
    paths: Sequence[str | Path],
    *,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    chunk_size: int = 256,
    chunk_overlap: int = 32,
    batch_size: int = 32,
    progress: Progress | None = None,
    max_file_bytes: int | None = None,
) -> tuple[FaissVectorStore, IndexSummary]:
    """Load ``paths`` (files or folders), chunk and embed them into a new vector store.

    ``max_file_bytes`` caps the size of one file (default: the loader's, 100 MiB); larger
    files are skipped with a reason. Raises ``AppError`` when a path does not exist or
    nothing could be indexed; the message then gives each skipped file's reason.
    """
    if not paths:
        raise AppError("no files or folders given")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise AppError(f"no such file or folder: {', '.join(missing)}")

    import warnings

    from retrievers import (
        DEFAULT_MAX_FILE_BYTES,
        FaissVectorStore,
        SkippedFileWarning,
        default_embeddings,
        load_documents,
        split_documents,
    )

    summary = IndexSummary()
    if progress is not None:
        progress("load", 0, len(paths))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedFileWarning)  # reported in the summary instead
        limit = DEFAULT_MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
        loaded = load_documents(list(paths), include=include, exclude=exclude, max_file_bytes=limit)
    summary.skipped.extend(Skipped(s.path, s.reason) for s in loaded.skipped)
    documents = loaded.documents
    if progress is not None:
        progress("load", len(paths), len(paths))
    chunks = [c for c in split_documents(documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap) if c.page_content.strip()]
    if not chunks:
        shown = 10  # one line, for the CLI's one-line errors and the web page alike
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in summary.skipped[:shown])
        more = f"; and {len(summary.skipped) - shown} more" if len(summary.skipped) > shown else ""
        hint = f"; {len(summary.skipped)} file(s) skipped: {reasons}{more}" if summary.skipped else ""
        raise AppError(f"found no text to index in {', '.join(map(str, paths))}{hint}")
    if progress is not None:
        progress("embed", 0, len(chunks))
    store = FaissVectorStore(default_embeddings())
    for start in range(0, len(chunks), batch_size):
        store.add_documents(chunks[start : start + batch_size])
        if progress is not None:
            progress("embed", min(start + batch_size, len(chunks)), len(chunks))
    summary.files = list(dict.fromkeys(str(c.metadata.get("source", "")) for c in chunks))
    summary.chunks = len(chunks)
    return store, summary


# -- answering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CitationView:
    """A cited passage as the apps show it."""

    number: int
    source: str
    location: str
    """Human-readable place in the source: ``"page 3"``, ``"char 1520"`` or ``""``."""
    title: str
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "source": self.source,
            "location": self.location,
            "title": self.title,
            "text": self.text,
        }


@dataclass(frozen=True)
class SpeedStats:
    """Speed of one answer."""

    new_tokens: int = 0
    tokens_per_s: float = 0.0
    """Decode tokens per second (prefill excluded)."""
    acceptance: float = 0.0
    """Accepted drafted tokens / drafted tokens."""
    tokens_per_forward: float = 0.0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "new_tokens": self.new_tokens,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "acceptance": round(self.acceptance, 4),
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "wall_s": round(self.wall_s, 3),
        }

    def line(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.1f} s · {self.tokens_per_s:.1f} tokens/s · "
            f"acceptance {self.acceptance:.0%} · {self.tokens_per_forward:.2f} tokens/forward"
        )

    @classmethod
    def from_any(cls, stats: object) -> SpeedStats:
        """From a ``GenerationStats``, its ``as_dict()``, or anything with those fields."""
        if stats is None:
            return cls()
        if not isinstance(stats, dict):
            as_dict = getattr(stats, "as_dict", None)
            stats = as_dict() if callable(as_dict) else vars(stats)
        assert isinstance(stats, dict)

        def num(*keys: str) -> float:
            for key in keys:
                value = stats.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return float(value)
            return 0.0

        return cls(
            new_tokens=int(num("new_tokens", "output_tokens")),
            tokens_per_s=num("decode_tokens_per_s", "tokens_per_s"),
            acceptance=num("acceptance_rate", "acceptance"),
            tokens_per_forward=num("tokens_per_forward"),
            wall_s=num("wall_s"),
        )


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


@dataclass(frozen=True)
class Finished:
    """The end of an answer: its full text, citations and speed."""

    text: str
    citations: list[CitationView]
    stats: SpeedStats
    supported: bool = True
    """False when no passage backs the answer (it cites none and copies from none); then ``citations`` is empty."""


Event = Union[Token, Finished]


def citation_view(citation: Any, passages: Sequence[Any] = ()) -> CitationView:
    """A pipeline ``Citation`` as the apps show it, with the full passage text when it is known."""
    number = int(citation.number)
    text = citation.text
    if 0 < number <= len(passages):
        text = passages[number - 1].page_content.strip()
    if citation.page is not None:
        location = f"page {citation.page}"  # 1-based, as the PDF loader records it
    elif citation.start_index is not None:
        location = f"char {citation.start_index}"
    else:
        location = ""
    return CitationView(number, str(citation.source), location, str(citation.title or ""), text)


class Collection:
    """Questions answered over one saved index by the speculative pipeline (``DocumentQA``)."""

    def __init__(
        self, index_dir: str | Path, *, max_tokens: int = 256, k: int = 4, model: str = "default", history_turns: int = 2
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {history_turns}")
        self.index_dir = Path(index_dir)
        self.max_tokens = max_tokens
        self.k = k
        self.model = model
        self.history_turns = history_turns
        self._qa: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """The ``DocumentQA`` over this index, opened on first use (the models load lazily, shared)."""
        with self._lock:
            if self._qa is None:
                from ragspec.lc import ChatRagSpec
                from ragspec.pipeline import DocumentQA
                from retrievers import IndexNotFoundError

                llm = ChatRagSpec(model=self.model, max_tokens=self.max_tokens)
                try:
                    self._qa = DocumentQA.from_index(self.index_dir, llm=llm, k=self.k)
                except IndexNotFoundError as e:
                    raise AppError(f"no index at {self.index_dir}: build one with 'ragspec ingest'") from e
            return self._qa

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        """``Token`` events as the answer is generated, then one ``Finished``.

        ``history`` holds earlier (question, answer) pairs of the conversation; the last
        ``history_turns`` of them are given to retrieval and to the model with the question.
        Closing the iterator early stops the generation and frees the model for the next request.
        """
        question = question.strip()
        if not question:
            raise AppError("the question is empty")
        qa = self.load()
        start = time.perf_counter()
        stream = qa.stream(with_history(question, history[-self.history_turns :] if self.history_turns else ()))
        tokenizer = qa.llm.load().lm.tokenizer
        yield from _pipeline_events(stream, start, lambda text: len(tokenizer.encode(text, add_special_tokens=False)))


def with_history(question: str, history: Sequence[tuple[str, str]]) -> str:
    """The question, preceded by the earlier turns it may refer to (``DocumentQA`` takes one string)."""
    if not history:
        return question
    earlier = "\n".join(f"Earlier question: {q}\nEarlier answer: {a.strip()}" for q, a in history)
    return f"{earlier}\nNew question: {question}"


def _pipeline_events(stream: Any, start: float, count_tokens: Callable[[str], int] | None = None) -> Iterator[Event]:
    """Adapt a pipeline ``AnswerStream`` to ``Token``/``Finished`` events."""
    iterator = iter(stream)
    text = ""
    steps = 0
    try:
        for delta in iterator:
            if not delta:
                continue
            text += delta
            steps += 1
            tokens = count_tokens(text) if count_tokens is not None else steps
            live = getattr(stream, "stats", None)  # live GenerationStats, where the stream exposes them
            if live is not None and getattr(live, "forward_passes", 0):
                yield Token(delta, time.perf_counter() - start, tokens, steps, live.acceptance_rate, live.tokens_per_forward)
            else:
                yield Token(delta, time.perf_counter() - start, tokens, steps)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    answer = stream.answer
    if answer is None:  # the stream was cut short
        return
    stats = SpeedStats.from_any(answer.stats)
    yield Finished(answer.text, [citation_view(c, answer.passages) for c in answer.citations], stats, answer.supported)
