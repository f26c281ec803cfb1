"""Retrieval on ``/v1/chat/completions``: the conversation answered over the server's documents.

A request with ragspec's extension ``"retrieval": true`` (or ``{"k": N, "unsupported": "abstain"}``:
the passages to retrieve, and what the message holds when no passage backs the answer) is answered as ``DocumentQA.ask(question, history=...)`` answers it: the last user
message is the question, the earlier user and assistant messages are the conversation it is
retrieved with (``follow_up``: the recent questions with it) and asked after, in the pipeline's
prompt with its numbered passages. Earlier answers this server gave keep the passages they were
first shown with (``apps.collection.Collection.remember``), so a follow-up's prompt extends the previous
turn's and the prefix cache computes only the new turn. The documents are the index given with
``ragspec serve --index``. The answer's citations, retrieval query, turn counts and whether a passage
backs it (``supported``, and ``note``: "I don't know: ..." and why) come in ``ragspec.retrieval``
(docs/serving.md). With ``"unsupported": "abstain"`` an unbacked answer's message is that note (a
stream, which cannot take back what it sent, ends with it on a new paragraph); with ``"flag"``, the
default, the message is the model's words and ``supported`` says it is unbacked.

The system prompt is the pipeline's, so system messages are refused, as are tool messages, tools
and ``response_format``: a retrieval answer is text with citations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ragspec.answers import UNSUPPORTED_MODES

if TYPE_CHECKING:
    from ragspec.answers import Answer, AnswerStream

MAX_K = 64
"""Most passages one request may ask for."""


class RetrievalError(ValueError):
    """A retrieval request that cannot be answered as sent (a 400 naming ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@runtime_checkable
class Documents(Protocol):
    """What retrieval requests are answered over (``apps.collection.Collection`` is one)."""

    def answer_stream(
        self, question: str, history: Sequence[tuple[str, str]] = (), options: Mapping[str, Any] | None = None,
        k: int | None = None,
    ) -> AnswerStream: ...

    def remember(self, answer: Answer) -> None: ...


@dataclass(frozen=True)
class Retrieval:
    """A request's ``retrieval`` extension, checked."""

    k: int | None = None
    """Passages to retrieve; None: the server's default."""
    unsupported: str = "flag"
    """``"abstain"``: an answer no passage backs is replaced by its note; ``"flag"``: kept, with ``supported`` false."""


def parse_retrieval(value: object, messages: object, *, tools: bool, response_format: bool) -> Retrieval | None:
    """The ``retrieval`` field (None when absent or false); ``RetrievalError`` for a request it cannot serve."""
    if value is None or value is False:
        return None
    unsupported: object = "flag"
    if value is True:
        k = None
    elif isinstance(value, dict) and set(value) <= {"k", "unsupported"}:
        k = value.get("k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K):
            raise RetrievalError(f"retrieval.k must be an integer from 1 to {MAX_K}, got {k!r}", "retrieval.k")
        unsupported = value.get("unsupported", "flag")
        if unsupported not in UNSUPPORTED_MODES:
            raise RetrievalError(
                f"retrieval.unsupported must be one of {', '.join(map(repr, UNSUPPORTED_MODES))}", "retrieval.unsupported"
            )
    else:
        raise RetrievalError('retrieval must be true, false or {"k": N, "unsupported": "abstain" or "flag"}', "retrieval")
    if tools:
        raise RetrievalError("a retrieval answer is text with citations: send tools without retrieval", "tools")
    if response_format:
        raise RetrievalError("a retrieval answer is text with citations: send response_format without retrieval", "response_format")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            raise RetrievalError(
                f"messages[{i}]: with retrieval the system prompt is ragspec's document-QA prompt; leave out {role} messages",
                f"messages[{i}].role",
            )  # fmt: skip
        if role == "tool" or (isinstance(message, dict) and message.get("tool_calls")):
            raise RetrievalError(f"messages[{i}]: a retrieval conversation holds user and assistant text only", f"messages[{i}]")
    return Retrieval(k, str(unsupported))


def conversation(turns: Sequence[Mapping[str, str]]) -> tuple[str, list[tuple[str, str]]]:
    """``(question, earlier (question, answer) pairs)`` of alternating user and assistant turns ending with a user turn."""
    if turns[-1]["role"] != "user":
        raise RetrievalError("with retrieval the last message is the user's question", f"messages[{len(turns) - 1}]")
    pairs: list[tuple[str, str]] = []
    for i in range(0, len(turns) - 1, 2):
        if turns[i]["role"] != "user" or turns[i + 1]["role"] != "assistant":
            raise RetrievalError(
                "with retrieval the messages alternate user and assistant, each question followed by its answer",
                f"messages[{i if turns[i]['role'] != 'user' else i + 1}]",
            )  # fmt: skip
        pairs.append((turns[i]["content"], turns[i + 1]["content"]))
    if not turns[-1]["content"].strip():
        raise RetrievalError("the question (the last user message) is empty", f"messages[{len(turns) - 1}].content")
    return turns[-1]["content"], pairs


@dataclass
class Retrieved:
    """A retrieval request whose passages are retrieved and whose answer is ready to generate."""

    documents: Documents
    stream: AnswerStream
    unsupported: str = "flag"

    def events(self) -> Generator[str | Answer, None, None]:
        """The answer's text deltas, then its ``Answer`` (remembered with its passages); for a worker thread.
        With ``unsupported="abstain"`` an unbacked answer's ``text`` is its note (the message the client keeps)."""
        with self.stream as stream:
            yield from stream
        answer = stream.answer
        if answer is not None:
            if self.unsupported == "abstain" and not answer.supported:
                answer = dataclasses.replace(answer, text=answer.note, generated_text=answer.text)
            self.documents.remember(answer)
            yield answer


def retrieve(
    documents: Documents | None, retrieval: Retrieval, turns: Sequence[Mapping[str, str]], options: Mapping[str, Any]
) -> Retrieved:
    """Retrieve for the conversation ``turns`` over ``documents``; ``options`` are the request's
    (``GenerationConfig`` names, already checked), over the documents' own settings."""
    if documents is None:
        raise RetrievalError(
            "this server has no documents to retrieve from: start it with 'ragspec serve --index DIR' "
            "(an index made by 'ragspec ingest')",
            "retrieval",
        )  # fmt: skip
    question, history = conversation(turns)
    return Retrieved(documents, documents.answer_stream(question, history, dict(options), k=retrieval.k), retrieval.unsupported)


def extension(answer: Answer) -> dict[str, Any]:
    """``ragspec.retrieval`` of a response: the retrieval query, the citations and the conversation's counts."""
    return {
        "query": answer.retrieval_query,
        "citations": [c.as_dict() for c in answer.citations],
        "supported": answer.supported,
        "note": answer.note,
        "missing_facts": list(answer.missing_facts),
        "passages": len(answer.passages),
        "earlier_passages": answer.earlier_passages,
        "history_turns": answer.history_turns,
        "dropped_turns": answer.dropped_turns,
    }
