"""Conversations with documents: histories, follow-up retrieval, and a conversation that keeps its turns.

A follow-up question ("In what year did he die?") needs the conversation twice: to retrieve (on its
own it names nobody) and in the prompt. ``DocumentQA.ask(question, history=...)`` takes the
conversation so far as LangChain messages, ``(role, text)`` pairs or ``Turn``s; ``to_turns`` reads
them. ``follow_up_query`` makes the retrieval query (``DocumentQA(follow_up=...)``):

- ``"combine"``: the question after the recent earlier questions (``COMBINE_TURNS``), no extra cost;
- ``"rewrite"``: the model first rewrites the question into a standalone one, as LangChain's
  history-aware retriever does (one short greedy generation before the answer);
- ``"question"``: the question on its own.

``Conversation`` (``DocumentQA.conversation()``) keeps its own turns, with the passages each one
first showed, so that every prompt extends the previous one (``ragspec.prompts``) and the prefix
cache computes only the new turn. ``ChatQARunnable`` (``DocumentQA.as_chat_runnable()``) is the
same over LangChain messages, e.g. in a LangGraph graph whose checkpointer keeps the conversation:
its ``AIMessage`` carries the passages in ``response_metadata``, so a store that keeps messages
keeps them too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Protocol, Union

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, message_chunk_to_message
from langchain_core.runnables import Runnable, RunnableConfig

from ragspec.answers import Answer, AnswerStream, AsyncAnswerStream
from ragspec.engine.config import GenerationConfig
from ragspec.prompts import Turn, chat_prompt_ids

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationStats
    from ragspec.engine.results import TextGenerator  # local or remote

History = Sequence[Union[BaseMessage, tuple[str, str], Turn]]
"""The conversation before a question: LangChain messages (``HumanMessage`` / ``AIMessage``),
``(role, text)`` pairs (role ``"user"``/``"human"`` or ``"assistant"``/``"ai"``), or ``Turn``s."""

FOLLOW_UP_MODES = ("combine", "rewrite", "question")
COMBINE_TURNS = 2
"""Earlier questions put before a follow-up in a ``"combine"`` query."""
REWRITE_TURNS = 3
"""Earlier turns shown to the model that rewrites a follow-up."""
REWRITE_MAX_TOKENS = 40
PASSAGES_KEY = "ragspec_passages"
"""``AIMessage.response_metadata`` key of the passages first shown with the question it answers."""

REWRITE_SYSTEM_PROMPT = (
    "Rewrite the user's last question so that it can be understood without the conversation: replace "
    "words like he, she, it, they and there with the names they stand for. Reply with the question only."
)

_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant",
          "HumanMessageChunk": "user", "AIMessageChunk": "assistant"}  # a streamed answer is kept as its chunk


def _entry(item: BaseMessage | tuple[str, str]) -> tuple[str, str, tuple[Document, ...]]:
    """``(role, text, passages)`` of one history entry; ``ValueError`` for anything else."""
    if isinstance(item, BaseMessage):
        role = _ROLES.get(item.type)
        text = item.content if isinstance(item.content, str) else item.text
        passages = read_passages(item.response_metadata.get(PASSAGES_KEY)) if isinstance(item, AIMessage) else ()
        if _abstained(item, text):
            text = ""  # as ``Answer.as_turn``: an abstained answer is no answer in the next prompt
    elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
        role, text, passages = _ROLES.get(item[0].lower()), item[1], ()
    else:
        raise ValueError(f"a history entry is a LangChain message, a (role, text) pair or a Turn, got {item!r}")
    if role is None:
        kind = item.type if isinstance(item, BaseMessage) else item[0]
        raise ValueError(
            f"history holds user and assistant turns only, got a {kind!r} entry "
            "(DocumentQA has its own system_prompt)"
        )
    return role, text, passages


def _abstained(message: BaseMessage, text: str) -> bool:
    """Whether ``message`` (its ``text``) is an answer of ``ChatQARunnable`` that abstained: its metadata says
    unsupported and its text ends with its note (``invoke``: the note alone; ``stream``: the model's words, then the note)."""
    note = message.response_metadata.get("note") if isinstance(message, AIMessage) else None
    return message.response_metadata.get("supported") is False and bool(note) and text.rstrip().endswith(str(note))


def to_turns(history: History) -> list[Turn]:
    """The earlier turns of ``history`` (see ``History``); each user entry must be followed by its answer."""
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise ValueError(f"history is a list of messages, (role, text) pairs or Turns, got {type(history).__name__}")
    turns: list[Turn] = []
    question: str | None = None
    for item in history:
        if isinstance(item, Turn):
            role = "turn"
        else:
            role, text, passages = _entry(item)
        if question is not None and role != "assistant":
            raise ValueError("history has a user turn without an answer: each question must be followed by its answer")
        if isinstance(item, Turn):
            turns.append(item)
        elif role == "user":
            question = text
        elif question is None:
            raise ValueError("history has an assistant turn that answers no question: start it with a user turn")
        else:
            turns.append(Turn(question, text, passages))
            question = None
    if question is not None:
        raise ValueError("history ends with a question that has no answer: pass the new question as `question`")
    return turns


def to_messages(turns: Sequence[Turn]) -> list[BaseMessage]:
    """``turns`` as LangChain messages (each answer's ``response_metadata`` holds its turn's passages)."""
    messages: list[BaseMessage] = []
    for turn in turns:
        messages.append(HumanMessage(turn.question))
        messages.append(AIMessage(turn.answer, response_metadata={PASSAGES_KEY: write_passages(turn.passages)}))
    return messages


def write_passages(passages: Sequence[Document]) -> list[dict[str, Any]]:
    return [{"page_content": p.page_content, "metadata": dict(p.metadata), "id": p.id} for p in passages]


def read_passages(data: object) -> tuple[Document, ...]:
    """Passages written by ``write_passages``; ``()`` for none, ``ValueError`` for anything malformed."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ValueError(f"response_metadata[{PASSAGES_KEY!r}] must be a list of passages, got {type(data).__name__}")
    out = []
    for p in data:
        if not (isinstance(p, Mapping) and isinstance(p.get("page_content"), str) and isinstance(p.get("metadata", {}), Mapping)):
            raise ValueError(f"a passage in response_metadata[{PASSAGES_KEY!r}] is {{'page_content': str, 'metadata': dict}}")
        ident = p.get("id")
        out.append(Document(page_content=p["page_content"], metadata=dict(p.get("metadata", {})),
                            id=ident if isinstance(ident, str) else None))
    return tuple(out)


def passage_key(passage: Document) -> tuple[str, str]:
    """What makes two passages the same passage (its source and text)."""
    return (str(passage.metadata.get("source", "")), passage.page_content)


def rewrite_messages(turns: Sequence[Turn], question: str) -> list[dict[str, str]]:
    """The request to rewrite ``question`` into a standalone question, after the recent ``turns``."""
    messages = [{"role": "system", "content": REWRITE_SYSTEM_PROMPT}]
    for turn in turns[-REWRITE_TURNS:]:
        messages += [{"role": "user", "content": turn.question.strip()}, {"role": "assistant", "content": turn.answer.strip()}]
    messages.append({"role": "user", "content": f"Rewrite this question on its own: {question.strip()}"})
    return messages


def follow_up_query(
    mode: str, question: str, turns: Sequence[Turn], generator: TextGenerator, system_prompt: str
) -> tuple[str, GenerationStats | None]:
    """The retrieval query for ``question`` after ``turns`` (see the module docstring) and, for
    ``"rewrite"``, the stats of the generation that made it (an empty rewrite falls back to ``"combine"``)."""
    if not turns or mode == "question":
        return question, None
    if mode == "rewrite":
        ids = chat_prompt_ids(generator.tokenizer, rewrite_messages(turns, question))
        result = generator.generate(ids, GenerationConfig(max_tokens=REWRITE_MAX_TOKENS, stop=("\n",)))
        rewritten = result.text.strip()
        if rewritten:
            return rewritten, result.stats
    return " ".join([*(t.question.strip() for t in turns[-COMBINE_TURNS:]), question]), None


class Answerer(Protocol):
    """What a conversation and the chat runnable ask: ``DocumentQA``'s ``ask``, ``stream`` and ``astream``."""

    def ask(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> Answer: ...

    def stream(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> AnswerStream: ...

    def astream(
        self, question: str, *, history: History = (), k: int | None = None, **options: Any
    ) -> AsyncAnswerStream: ...


class Conversation:
    """Questions over one ``DocumentQA`` that remember the earlier turns (``DocumentQA.conversation()``).

    ``ask``/``stream`` take ``DocumentQA.ask``'s options; a turn is recorded once its answer is
    complete (a stream closed early records nothing). ``turns`` are the ``Turn``s so far, ``messages``
    the same as LangChain messages; ``reset()`` starts over. Not for several threads at once.
    """

    def __init__(self, qa: Answerer, history: History = ()) -> None:
        self.qa = qa
        self.turns: list[Turn] = to_turns(history)

    def ask(self, question: str, *, k: int | None = None, **options: Any) -> Answer:
        with self.stream(question, k=k, **options) as stream:
            for _ in stream:
                pass
        assert stream.answer is not None
        return stream.answer

    def stream(self, question: str, *, k: int | None = None, **options: Any) -> AnswerStream:
        inner = self.qa.stream(question, history=self.turns, k=k, **options)  # retrieves now, as DocumentQA.stream
        return AnswerStream(lambda on_start: self._record(inner, on_start), inner.passages)

    def _record(
        self, inner: AnswerStream, on_start: Callable[[GenerationStats], None]
    ) -> Generator[str | Answer, None, None]:
        """``inner``'s deltas (its live stats handed on as it starts), then its answer, recorded as a turn."""
        started = False
        with inner:
            for delta in inner:
                if not started and inner.stats is not None:  # set as the generation starts, before its first delta
                    on_start(inner.stats)
                    started = True
                yield delta
        if not started and inner.stats is not None:  # an empty answer
            on_start(inner.stats)
        assert inner.answer is not None
        self.turns.append(inner.answer.as_turn())
        yield inner.answer

    @property
    def messages(self) -> list[BaseMessage]:
        return to_messages(self.turns)

    def reset(self) -> None:
        """Forget the turns: the next question starts a new conversation."""
        self.turns.clear()


def answer_message(answer: Answer) -> AIMessage:
    """An ``Answer`` as an ``AIMessage``: its text, and in ``response_metadata`` the passages first shown
    with the question (``PASSAGES_KEY``), the citations, whether a passage backs it (``supported``, and
    ``note``: why not), the retrieval query."""
    return AIMessage(answer.text, response_metadata=_metadata(answer))


def _metadata(answer: Answer) -> dict[str, Any]:
    return {
        PASSAGES_KEY: write_passages(answer.passages[answer.earlier_passages :]),
        "citations": [c.as_dict() for c in answer.citations],
        "supported": answer.supported,
        "note": answer.note,
        "missing_facts": list(answer.missing_facts),
        "retrieval_query": answer.retrieval_query,
        "dropped_turns": answer.dropped_turns,
        "finish_reason": answer.finish_reason,
    }


def chat_input(value: object, question_key: str = "question", history_key: str = "history") -> tuple[str, History]:
    """``(question, history)`` from a chat runnable's input: ``{"question": ..., "history": [...]}``, a list
    of messages ending with the question, a LangGraph ``MessagesState`` (``{"messages": [...]}``, the
    same list), or a question string."""
    if isinstance(value, str):
        return value, ()
    if isinstance(value, Mapping) and question_key not in value and "messages" in value:
        value = value["messages"]
    if isinstance(value, Mapping):
        question = value.get(question_key)
        if isinstance(question, BaseMessage):
            question = question.text
        if not isinstance(question, str):
            raise ValueError(f"the chat runnable's input needs a {question_key!r} string")
        history = value.get(history_key, ())
        return question, history
    if isinstance(value, Sequence) and value and isinstance(value[-1], BaseMessage) and value[-1].type == "human":
        return value[-1].text, list(value[:-1])
    raise ValueError(
        f"the chat runnable takes {{{question_key!r}: str, {history_key!r}: [messages]}}, a list of messages ending "
        f"with the question (or {{'messages': [...]}}), or a question string; got {type(value).__name__}"
    )


class ChatQARunnable(Runnable[Any, AIMessage]):
    """``DocumentQA`` over chat messages (``DocumentQA.as_chat_runnable()``), e.g. as a LangGraph node
    whose checkpointer keeps the conversation (docs/conversations.md)::

        chat = qa.as_chat_runnable()
        chat.invoke([HumanMessage("When did the flood hit?"), AIMessage("In 1871."), HumanMessage("Who warned them?")])

    Input: see ``chat_input``. ``invoke``/``ainvoke`` return an ``AIMessage`` (``answer_message``);
    ``stream``/``astream`` yield ``AIMessageChunk`` text deltas and a last chunk with the
    ``response_metadata``. The async calls generate in a worker thread (``ragspec.bridge``), token by
    token; ``ainvoke`` streams too, so ``astream_events`` shows its deltas as ``on_chain_stream``
    events. A consumer that stops early (``break`` then ``aclose``, a cancelled task) stops the
    generation and frees the model.
    When the answer abstained, the last chunk carries its flag (``Answer.stream_flag``): the streamed
    message then says it is unbacked.
    """

    name = "DocumentQAChat"

    def __init__(self, qa: Answerer, question_key: str = "question", history_key: str = "history") -> None:
        self.qa, self.question_key, self.history_key = qa, question_key, history_key

    @property
    def OutputType(self) -> type[AIMessage]:  # noqa: N802 - LangChain's name
        return AIMessage

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        def run(value: Any) -> AIMessage:
            question, history = chat_input(value, self.question_key, self.history_key)
            return answer_message(self.qa.ask(question, history=history, **kwargs))

        return self._call_with_config(run, input, config)

    def stream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        return self._transform_stream_with_config(iter([input]), self._chunks, config, **kwargs)

    def _chunks(self, inputs: Iterator[Any], **kwargs: Any) -> Iterator[AIMessageChunk]:
        question, history = chat_input(next(inputs), self.question_key, self.history_key)
        with self.qa.stream(question, history=history, **kwargs) as stream:
            for delta in stream:
                yield AIMessageChunk(delta)
        assert stream.answer is not None
        yield AIMessageChunk(stream.answer.stream_flag, response_metadata=_metadata(stream.answer))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        message: AIMessageChunk | None = None
        last: AIMessageChunk | None = None
        async for last in self.astream(input, config, **kwargs):
            message = last if message is None else message + last
        assert message is not None and last is not None
        if last.content:  # the answer abstained: the stream ended with its flag, ``invoke`` gives the note alone
            return AIMessage(last.response_metadata["note"], response_metadata=last.response_metadata)
        return message_chunk_to_message(message)  # type: ignore[return-value]

    async def astream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        async def one() -> AsyncIterator[Any]:
            yield input

        async with aclosing(self._atransform_stream_with_config(one(), self._achunks, config, **kwargs)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _achunks(self, inputs: AsyncIterator[Any], **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        question, history = chat_input(await anext(inputs), self.question_key, self.history_key)
        stream = self.qa.astream(question, history=history, **kwargs)
        async with aclosing(aiter(stream)) as deltas:  # closed at once when the consumer stops: frees the model
            async for delta in deltas:
                yield AIMessageChunk(delta)
        assert stream.answer is not None
        yield AIMessageChunk(stream.answer.stream_flag, response_metadata=_metadata(stream.answer))
