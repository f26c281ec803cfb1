"""What ``DocumentQA`` answers with: the ``Answer`` with its ``Citation``s, and the ``AnswerStream`` (and
``AsyncAnswerStream``) that delivers it delta by delta.

In a module of their own so that ``ragspec.conversation`` (which records answers as turns) and
``ragspec.pipeline`` (which makes them) both use them without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from ragspec.bridge import iterate_in_thread
from ragspec.prompts import Turn

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationStats

__all__ = ["Answer", "AnswerStream", "AsyncAnswerStream", "Citation"]


@dataclass(frozen=True)
class Citation:
    """A passage the answer relies on, with where it comes from."""

    number: int
    """The passage's number in the prompt (``[number]``), 1-based."""
    source: str
    start_index: int | None
    """Character offset of the passage in its document, when the chunker recorded it."""
    page: int | None
    title: str | None
    text: str
    """The start of the passage, for display."""
    chunk_id: str | None
    section: str | None = None
    """The slide, sheet or section of a converted file (``"slide 3 (Outlook)"``, ``"sheet Budget"``), when the loader recorded one."""

    @property
    def location(self) -> str:
        """Where in its source the passage is, for people: ``"page 3"``, ``"slide 2 (Outlook)"``, ``"char 1520"`` or ``""``."""
        if self.page is not None:
            return f"page {self.page}"  # 1-based, as the PDF loader records it
        if self.section:
            return self.section
        return f"char {self.start_index}" if self.start_index is not None else ""

    def as_dict(self) -> dict[str, object]:
        """The fields and ``location``, for JSON."""
        return {**dataclasses.asdict(self), "location": self.location}


@dataclass(frozen=True)
class Answer:
    """An answer with its citations, the passages it was given and how it was generated."""

    question: str
    text: str
    citations: list[Citation]
    passages: list[Document]
    """The passages in the prompt, in order: ``passages[0]`` is ``[1]``."""
    citation_rule: str
    """Which rule chose the citations: ``"cited"``, ``"copied"``, ``"overlap"``; with no citations ``"unsupported"``
    (no passage holds the answer) or ``"off_topic"`` (passages hold it, but it is not about the question)."""
    finish_reason: str
    stats: GenerationStats | None
    """How ragspec generated it (tokens per forward, acceptance, ...); None when another LangChain
    model answered (``DocumentQA(llm=ChatOpenAI(...))``): ragspec did not generate it."""
    earlier_passages: int = 0
    """Passages of the prompt shown with earlier turns of the conversation: ``passages[earlier_passages:]``
    were first shown with this question."""
    history_turns: int = 0
    """Earlier turns of the conversation in the prompt."""
    dropped_turns: int = 0
    """Earlier turns left out (the oldest) because they did not fit the context budget."""
    retrieval_query: str = ""
    """What the passages were retrieved with: the question, or for a follow-up the query made from the conversation."""
    query_stats: GenerationStats | None = None
    """The generation that rewrote a follow-up into ``retrieval_query`` (``follow_up="rewrite"``)."""

    @property
    def supported(self) -> bool:
        """Whether a passage backs the answer: it cites one by number, copies a substantial span of one,
        or uses mostly one passage's words (see the module docstring)."""
        return bool(self.citations)

    def as_turn(self) -> Turn:
        """This exchange as an earlier turn of the conversation (with the passages first shown with it)."""
        return Turn(self.question, self.text, tuple(self.passages[self.earlier_passages :]))


class AnswerStream:
    """Iterate for the answer's text deltas; ``answer`` (with citations) is set once it is exhausted.

    ``passages`` are known before the first delta, so sources can be shown up front; ``stats``
    (the generation's ``GenerationStats``) is updated live from the first delta on. Use it as a
    context manager (``with qa.stream(q) as s:``) so that stopping early frees the model.
    """

    def __init__(
        self,
        events: Callable[[Callable[[GenerationStats], None]], Generator[str | Answer, None, None]],
        passages: list[Document],
    ) -> None:
        """``events(on_start)`` makes the generation's events; it calls ``on_start`` with the live stats."""
        self.passages = passages
        self.answer: Answer | None = None
        self.stats: GenerationStats | None = None
        self._events = events(self._started)

    def _started(self, stats: GenerationStats) -> None:
        self.stats = stats

    def __iter__(self) -> Iterator[str]:
        try:
            for event in self._events:
                if isinstance(event, Answer):
                    self.answer = event
                else:
                    yield event
        finally:
            self.close()  # stopping early ends the generation and frees the model

    def __enter__(self) -> AnswerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop generating; frees the model for the next request."""
        self._events.close()


class AsyncAnswerStream:
    """``async for`` over the answer's text deltas; ``answer`` is set once it is exhausted.

    Retrieval and generation run in a worker thread, so the event loop never blocks. A consumer that
    stops early (cancelled, or ``aclose()`` of ``aiter(stream)``) stops the generation and frees the model.
    """

    def __init__(self, make_events: Callable[[], Generator[str | Answer, None, None]]) -> None:
        self._make_events = make_events
        self.answer: Answer | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        async with aclosing(iterate_in_thread(self._make_events)) as events:  # closing it stops the generation
            async for event in events:
                if isinstance(event, Answer):
                    self.answer = event
                else:
                    yield event
