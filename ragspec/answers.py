"""What ``DocumentQA`` answers with: the ``Answer`` with its ``Citation``s, and the ``AnswerStream`` (and
``AsyncAnswerStream``) that delivers it delta by delta.

In a module of their own so that ``ragspec.conversation`` (which records answers as turns) and
``ragspec.pipeline`` (which makes them) both use them without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.documents import Document

from ragspec.bridge import iterate_in_thread
from ragspec.engine.results import Closing
from ragspec.prompts import Turn

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationStats

__all__ = ["UNSUPPORTED_MODES", "Answer", "AnswerStream", "AsyncAnswerStream", "Citation", "unsupported_note"]

UNSUPPORTED_MODES = ("abstain", "flag")
"""What ``DocumentQA(unsupported=...)`` does with an answer no passage backs: ``"abstain"`` puts its
``note`` ("I don't know: ..." and why) in ``Answer.text`` (the model's words stay in
``Answer.generated_text``), ``"flag"`` keeps the model's words in ``text``; ``supported`` and ``note``
say it either way."""


_REASONS = {
    "missing_facts": "the passages it matches do not hold the numbers or names it states",
    "off_topic": "the passages it matches are not about the question",
    "restates": "it only repeats the question",
    "no_number": "the question asks for a number or a month and it states none",
    "negation": "the passages it draws on do not say what it denies",
    "repeats": "it goes round in circles",
    "unbacked_clause": "one of its sentences says what no sentence of the passages it cites says",
    "swapped_subject": "it copies a passage's sentence about something else",
    "stray_clause": "what it adds to the question is not where the passages speak of the question",
    "heading": "it copies a heading, which states nothing",
}
"""Why an answer is unsupported, by its citation rule (``ragspec.citations.choose_citations``)."""


def unsupported_note(rule: str, missing: Sequence[str] = ()) -> str:
    """The flag of an answer no passage backs, for people: "I don't know: ..." and why, from its citation rule."""
    if missing:  # what a reader would take from it, and no passage says
        reason = f"no passage holds {', '.join(missing[:4])}, which it states"
    else:
        reason = _REASONS.get(rule, "no passage holds its words")
    return f"I don't know: no passage backs this answer ({reason}), so it may be a guess."


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
    """The sentence(s) of the passage the answer drew from (the start of the passage when no sentence
    shares the answer's words), for display; ``start_index`` and ``page`` are where they are."""
    chunk_id: str | None
    section: str | None = None
    """The slide, sheet or section of a converted file (``"slide 3 (Outlook)"``, ``"sheet Budget"``), when the loader recorded one."""
    offset: int | None = None
    """Character offset of ``text`` (the sentences shown) in its document (on its ``page`` for a PDF), when
    the chunker recorded the passage's."""

    @property
    def location(self) -> str:
        """Where in its source the cited words are, for people: ``"page 3"``, ``"slide 2 (Outlook)"``, ``"char 1520"`` or ``""``."""
        if self.page is not None:
            return f"page {self.page}"  # 1-based, as the PDF loader records it
        if self.section:
            return self.section
        at = self.offset if self.offset is not None else self.start_index
        return f"char {at}" if at is not None else ""

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
    generated_text: str | None = None
    """The model's words, when ``text`` is not them (``DocumentQA(unsupported="abstain")`` on an unsupported answer)."""
    missing_facts: tuple[str, ...] = ()
    """Numbers and names the answer states that no passage of the prompt holds (``ragspec.facts``)."""

    @property
    def supported(self) -> bool:
        """Whether a passage backs the answer: it cites one by number, copies a substantial span of one,
        or uses mostly one passage's words, that passage is about the question, and it holds the answer's
        numbers and names (``ragspec.citations``)."""
        return bool(self.citations)

    @property
    def model_text(self) -> str:
        """The model's words, whatever ``text`` shows."""
        return self.text if self.generated_text is None else self.generated_text

    @property
    def note(self) -> str:
        """``""`` for a supported answer; else its flag, "I don't know: no passage backs this answer (why), so
        it may be a guess." (``unsupported_note``): what every surface shows with it, and what
        ``DocumentQA(unsupported="abstain")`` puts in ``text``."""
        return "" if self.supported else unsupported_note(self.citation_rule, self.missing_facts)

    @property
    def stream_flag(self) -> str:
        """What a stream of this answer adds after the model's words so that the streamed text carries the
        flag: the ``note`` on a new paragraph when the answer abstained (``generated_text`` is set), else ``""``."""
        return f"\n\n{self.note}" if self.generated_text is not None and self.note else ""

    def as_turn(self) -> Turn:
        """This exchange as an earlier turn of the conversation (with the passages first shown with it).

        An answer that abstained (``generated_text`` is set) is a turn with no answer: the reader was shown
        "I don't know", not the guess, and the next prompt should not hold either. The guess would mislead
        the follow-up (this small model repeats its earlier answers, right or wrong), and the note is not
        the model's voice (a model that sees it may say it again). The question and its
        passages stay, so later passages keep their numbers and the follow-up keeps its context."""
        return Turn(self.question, "" if self.generated_text is not None else self.text,
                    tuple(self.passages[self.earlier_passages :]))  # fmt: skip


class AnswerStream(Closing):
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
