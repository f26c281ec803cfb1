"""Conversations: histories, the prompt layout that extends turn by turn, follow-up retrieval, the
conversation object and RunnableWithMessageHistory (tiny random model over the default tokenizer)."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from ragspec.conversation import PASSAGES_KEY, chat_input, to_messages, to_turns
from ragspec.lc import ChatRagSpec
from ragspec.pipeline import ContextBudgetWarning, DocumentQA
from ragspec.engine.text import whole_words
from ragspec.prompts import Turn, chat_prompt_ids, conversation_messages

from tests.ragspec.test_pipeline import MERCURY, PASSAGES, FixedChat, FixedRetriever, doc

KHAN = doc("Genghis Khan named his third son Ögedei as his successor. He died in August 1227.", "/docs/khan.txt",
           start_index=0)
FERRY_TEXT = PASSAGES[0].page_content


class RecordingRetriever(BaseRetriever):
    """Returns the passages of the key word found last in the query, and records every query."""

    by_word: dict[str, list[Document]]
    queries: list[str] = []

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        self.queries.append(query)
        found = max(self.by_word, key=lambda word: query.lower().rfind(word))
        return list(self.by_word[found])[:k] if found in query.lower() else []


@pytest.fixture
def retriever() -> RecordingRetriever:
    return RecordingRetriever(by_word={"ferry": PASSAGES[:2], "bakery": PASSAGES[1:], "khan": [KHAN]}, queries=[])


def make_qa(retriever: BaseRetriever, generator, **kwargs: object) -> DocumentQA:  # type: ignore[no-untyped-def]
    return DocumentQA(retriever, ChatRagSpec(generator=generator, max_tokens=8), **kwargs)  # type: ignore[arg-type]


def test_histories_of_every_kind_become_turns() -> None:
    shown = (PASSAGES[0],)
    ai = AIMessage("At 7:15.", response_metadata={PASSAGES_KEY: [{"page_content": FERRY_TEXT, "metadata": {"source": "f"}}]})
    assert to_turns([HumanMessage("When?"), ai]) == [Turn("When?", "At 7:15.", (Document(FERRY_TEXT, metadata={"source": "f"}),))]
    assert to_turns([("user", "When?"), ("assistant", "At 7:15."), ("human", "Where?"), ("ai", "Dunmore.")]) == [
        Turn("When?", "At 7:15."), Turn("Where?", "Dunmore.")
    ]
    turns = [Turn("When?", "At 7:15.", shown)]
    assert to_turns(turns) == turns and to_turns(to_messages(turns)) == turns  # messages round-trip the passages
    assert to_turns(()) == []


@pytest.mark.parametrize(
    "history,message",
    [
        ([SystemMessage("be brief")], "user and assistant turns only"),
        ([("user", "a"), ("user", "b")], "without an answer"),
        ([("assistant", "a")], "answers no question"),
        ([("user", "a")], "ends with a question"),
        ([("a", "b", "c")], "a LangChain message, a"),
        ("hello", "is a list"),
        ([AIMessage("x", response_metadata={PASSAGES_KEY: "nope"})], "must be a list of passages"),
    ],
)
def test_bad_histories_say_what_is_wrong(history: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_turns(history)  # type: ignore[arg-type]


def test_chat_input_forms() -> None:
    history = [HumanMessage("a"), AIMessage("b")]
    assert chat_input({"question": "q", "history": history}) == ("q", history)
    assert chat_input([*history, HumanMessage("q")]) == ("q", history)
    assert chat_input({"messages": [*history, HumanMessage("q")]}) == ("q", history)  # a LangGraph MessagesState
    assert chat_input("q") == ("q", ())
    with pytest.raises(ValueError, match="takes"):
        chat_input(3)


def test_each_turn_extends_the_previous_prompt_token_for_token(lc_tokenizer) -> None:
    first = chat_prompt_ids(lc_tokenizer, conversation_messages([], "When does the ferry leave?", PASSAGES[:2]))
    turn = Turn("When does the ferry leave?", "It leaves at 7:15 [1].", tuple(PASSAGES[:2]))
    messages = conversation_messages([turn], "And the bakery?", PASSAGES[2:])
    second = chat_prompt_ids(lc_tokenizer, messages)
    assert second[: len(first)] == first and len(second) > len(first)
    assert "[3] library.pdf" in messages[-1]["content"]  # numbered on after the first turn's two
    assert conversation_messages([turn], "Why?", [])[-1]["content"] == "Question: Why?"


def test_follow_up_is_retrieved_with_the_conversation_and_asked_after_it(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    first = qa.ask("When does the ferry leave?")
    assert first.retrieval_query == "When does the ferry leave?" and first.earlier_passages == 0
    second = qa.ask("Is it on time?", history=[first.as_turn()])
    assert retriever.queries[-1] == "When does the ferry leave? Is it on time?"  # "combine"
    assert second.passages == PASSAGES[:2] and second.earlier_passages == 2  # nothing new: no passage repeated
    assert second.history_turns == 1 and second.dropped_turns == 0
    tok = lc_tiny_generator.target.tokenizer
    want = chat_prompt_ids(tok, conversation_messages([first.as_turn()], "Is it on time?", []))
    assert second.stats.prompt_tokens == len(want)
    assert second.stats.cached_prompt_tokens == first.stats.prompt_tokens  # the whole first prompt was reused
    # the same text as a cold generation of that prompt (cut at max_tokens: up to its last whole word)
    assert second.model_text == whole_words(lc_tiny_generator.generate(want, max_new_tokens=8).text)


def test_new_passages_come_with_the_follow_up_and_citations_count_all(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator, follow_up="question")
    first = qa.ask("When does the ferry leave?")
    second = qa.ask("What does the bakery sell?", history=[first.as_turn()])
    assert retriever.queries[-1] == "What does the bakery sell?"
    assert second.passages == [PASSAGES[0], PASSAGES[1], PASSAGES[2]] and second.earlier_passages == 2
    assert second.as_turn().passages == (PASSAGES[2],)


def test_rewrite_asks_the_model_for_a_standalone_query(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator, follow_up="rewrite")
    first = qa.ask("When does the ferry leave?")
    second = qa.ask("Is it on time?", history=[first.as_turn()])
    assert second.query_stats is not None and second.query_stats.new_tokens > 0
    assert second.retrieval_query == retriever.queries[-1] != "Is it on time?"
    assert first.query_stats is None  # a first question is retrieved as asked


def test_conversation_keeps_its_turns_and_each_turn_hits_the_cache(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    chat = qa.conversation()
    a = chat.ask("When does the ferry leave?")
    with chat.stream("Who runs the bakery?") as stream:  # closed early: not recorded
        next(iter(stream))
    assert len(chat.turns) == 1
    b = chat.ask("Who runs the bakery?")
    c = chat.ask("And the ferry?")
    assert [t.question for t in chat.turns] == ["When does the ferry leave?", "Who runs the bakery?", "And the ferry?"]
    assert b.stats.cached_prompt_tokens >= a.stats.prompt_tokens
    assert c.stats.cached_prompt_tokens >= b.stats.prompt_tokens
    assert [type(m).__name__ for m in chat.messages] == ["HumanMessage", "AIMessage"] * 3
    chat.reset()
    assert chat.turns == [] and chat.ask("When does the ferry leave?").history_turns == 0


def test_oldest_turns_are_dropped_to_fit_the_budget(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator, follow_up="question")
    long = "word " * 120
    history = [Turn(f"question {i}?", long) for i in range(4)]
    with pytest.warns(ContextBudgetWarning, match="oldest turn"):
        answer = qa.ask("When does the ferry leave?", history=history)
    assert answer.dropped_turns >= 1 and answer.history_turns == 4 - answer.dropped_turns
    assert answer.stats.prompt_tokens + 8 <= lc_tiny_generator.target.context_length
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert qa.ask("When does the ferry leave?", history=history[-1:]).dropped_turns == 0


def test_runnable_with_message_history_keeps_the_conversation(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    store: dict[str, InMemoryChatMessageHistory] = {}
    chat = RunnableWithMessageHistory(
        qa.as_chat_runnable(), lambda sid: store.setdefault(sid, InMemoryChatMessageHistory()),
        input_messages_key="question", history_messages_key="history",
    )  # fmt: skip
    config = {"configurable": {"session_id": "s"}}
    first = chat.invoke({"question": "When does the ferry leave?"}, config=config)
    assert isinstance(first, AIMessage) and len(first.response_metadata[PASSAGES_KEY]) == 2
    chunks = list(chat.stream({"question": "Is it on time?"}, config=config))
    assert "".join(c.content for c in chunks) == chunks[0].content + "".join(c.content for c in chunks[1:])
    assert chunks[-1].response_metadata[PASSAGES_KEY] == []  # nothing new for the follow-up
    assert retriever.queries[-1] == "When does the ferry leave? Is it on time?"
    messages = store["s"].messages
    assert [m.type for m in messages] == ["human", "ai", "human", "AIMessageChunk"]  # a streamed answer stays a chunk
    turns = to_turns(messages)
    assert [t.question for t in turns] == ["When does the ferry leave?", "Is it on time?"]
    assert turns[0].passages == tuple(PASSAGES[:2]) and turns[1].passages == ()
    third = chat.invoke({"question": "Who runs the bakery?"}, config=config)
    assert len(third.response_metadata[PASSAGES_KEY]) == 1  # the library passage; the bakery's was shown before


class RecordingChat(FixedChat):
    """``FixedChat`` that records the messages of every prompt it is given."""

    prompts: list[list[BaseMessage]] = []

    def _stream(self, messages: list[BaseMessage], stop: object = None, run_manager: object = None, **kwargs: object):  # type: ignore[no-untyped-def, override]
        self.prompts.append(list(messages))
        yield from super()._stream(messages, stop, run_manager, **kwargs)


def _prompt_text(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


def test_an_abstained_answer_reaches_the_next_prompt_as_no_answer() -> None:
    """Under ``unsupported="abstain"`` the reader was shown "I don't know", not the guess: the next turn's prompt
    holds the earlier question with an empty answer, neither the note (not the model's words) nor the guess."""
    model = RecordingChat(text=MERCURY)
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), model)
    question, follow_up = "What is the boiling point of mercury?", "And of water?"
    chat = qa.conversation()
    first = chat.ask(question)
    assert first.text == first.note and first.generated_text == MERCURY  # abstained
    assert chat.turns[-1] == Turn(question, "", tuple(PASSAGES))
    chat.ask(follow_up)
    runnable = qa.as_chat_runnable()
    invoked = runnable.invoke({"question": question})
    runnable.invoke({"question": follow_up, "history": [HumanMessage(question), invoked]})
    streamed = None
    for chunk in runnable.stream({"question": question}):
        streamed = chunk if streamed is None else streamed + chunk
    runnable.invoke({"question": follow_up, "history": [HumanMessage(question), streamed]})
    follow_ups = [p for p in model.prompts if follow_up in _prompt_text(p)]
    assert len(follow_ups) == 3
    for prompt in follow_ups:
        assert question in _prompt_text(prompt) and "4.1875" not in _prompt_text(prompt)
        assert "I don't know" not in _prompt_text(prompt)
    # Under "flag" the reader saw the model's words (flagged): they stay in the conversation.
    flag = DocumentQA(FixedRetriever(passages=PASSAGES), model, unsupported="flag").conversation()
    flag.ask(question)
    assert flag.turns[-1].answer == MERCURY


# -- async, token by token ------------------------------------------------------------------------
async def test_the_chat_runnable_streams_asynchronously(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    chat = qa.as_chat_runnable()
    want = chat.invoke({"question": "When does the ferry leave?"})
    chunks = [c async for c in chat.astream({"question": "When does the ferry leave?"})]
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)  # deltas, then the metadata
    streamed = "".join(c.content for c in chunks)  # the model's words, then the flag when it abstained
    assert streamed == want.content or (not want.response_metadata["supported"] and streamed.endswith(chunks[-1].content)
                                        and chunks[-1].content.strip() == want.content)
    assert chunks[-1].response_metadata == want.response_metadata
    got = await chat.ainvoke({"question": "When does the ferry leave?"})
    assert type(got) is AIMessage and got.content == want.content and got.response_metadata == want.response_metadata


async def test_astream_events_shows_the_deltas_of_astream_and_of_ainvoke(retriever, lc_tiny_generator) -> None:
    chat = make_qa(retriever, lc_tiny_generator, unsupported="flag").as_chat_runnable()  # the words as the model wrote them
    want = chat.invoke({"question": "When does the ferry leave?"}).content

    async def deltas(runnable: Runnable) -> list[str]:
        events = runnable.astream_events({"question": "When does the ferry leave?"}, version="v2")
        return [e["data"]["chunk"].content async for e in events
                if e["event"] == "on_chain_stream" and e["name"] == "DocumentQAChat"]

    streamed = await deltas(chat)
    assert len([d for d in streamed if d]) > 1 and "".join(streamed) == want

    async def node(value: dict) -> AIMessage:  # a LangGraph node or any async step that awaits ainvoke
        return await chat.ainvoke(value)

    awaited = await deltas(RunnableLambda(node))
    assert len([d for d in awaited if d]) > 1 and "".join(awaited) == want


async def test_closing_the_async_stream_early_frees_the_model(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    qa.llm = ChatRagSpec(generator=lc_tiny_generator, max_tokens=200)
    qa.generation = {}  # no repetition stop: the answer runs for 200 tokens unless it is stopped
    lc_tiny_generator.busy_timeout_s = 0  # a model still busy fails the next call at once
    for runnable, question in ((qa.as_chat_runnable(), {"question": "When does the ferry leave?"}),
                               (qa.as_runnable(), "When does the ferry leave?")):  # fmt: skip
        stream = runnable.astream(question)
        await anext(stream)
        await stream.aclose()
        assert (await qa.aask("When does the ferry leave?", max_tokens=2)).stats.new_tokens == 2

    async def consume() -> None:
        async for _ in qa.as_chat_runnable().astream({"question": "When does the ferry leave?"}):
            started.set()

    started = asyncio.Event()
    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await qa.aask("When does the ferry leave?", max_tokens=2)).stats.new_tokens == 2


async def test_runnable_with_message_history_streams_asynchronously(retriever, lc_tiny_generator) -> None:
    qa = make_qa(retriever, lc_tiny_generator)
    store: dict[str, InMemoryChatMessageHistory] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated for LangGraph's persistence, still used
        chat = RunnableWithMessageHistory(
            qa.as_chat_runnable(), lambda sid: store.setdefault(sid, InMemoryChatMessageHistory()),
            input_messages_key="question", history_messages_key="history",
        )  # fmt: skip
    config = {"configurable": {"session_id": "s"}}
    await chat.ainvoke({"question": "When does the ferry leave?"}, config=config)
    chunks = [c async for c in chat.astream({"question": "Is it on time?"}, config=config)]
    assert len(chunks) > 2
    assert retriever.queries[-1] == "When does the ferry leave? Is it on time?"
    turns = to_turns(store["s"].messages)  # async answers are kept as their streamed chunks, passages and all
    assert [t.question for t in turns] == ["When does the ferry leave?", "Is it on time?"]
    assert turns[0].passages == tuple(PASSAGES[:2])


# -- memory the LangGraph way: a checkpointer keeps each thread's messages (docs/conversations.md) ---------
def conversation_graph(qa: DocumentQA):  # type: ignore[no-untyped-def]
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    answer = qa.as_chat_runnable() | RunnableLambda(lambda message: {"messages": [message]})
    graph = StateGraph(MessagesState).add_node("answer", answer).add_edge(START, "answer")
    return graph.compile(checkpointer=InMemorySaver())


async def test_a_langgraph_checkpointer_keeps_the_conversation_and_streams_it(retriever, lc_tiny_generator) -> None:
    pytest.importorskip("langgraph")
    qa = make_qa(retriever, lc_tiny_generator, unsupported="flag")  # the words as streamed (abstention is tested elsewhere)
    chat = conversation_graph(qa)
    alice, bob = {"configurable": {"thread_id": "alice"}}, {"configurable": {"thread_id": "bob"}}
    first = chat.invoke({"messages": [("user", "When does the ferry leave?")]}, alice)["messages"][-1]
    assert isinstance(first, AIMessage) and len(first.response_metadata[PASSAGES_KEY]) == 2
    deltas = []
    async for event in chat.astream_events({"messages": [("user", "Is it on time?")]}, alice, version="v2"):
        if event["event"] == "on_chain_stream" and event["name"] == "DocumentQAChat":
            deltas.append(event["data"]["chunk"].content)
    assert retriever.queries[-1] == "When does the ferry leave? Is it on time?"  # the thread's first question too
    messages = (await chat.aget_state(alice)).values["messages"]
    assert len([d for d in deltas if d]) > 1 and "".join(deltas) == messages[-1].content
    turns = to_turns(messages)  # the checkpoint kept the passages each answer was first shown with
    assert [t.question for t in turns] == ["When does the ferry leave?", "Is it on time?"]
    assert turns[0].passages == tuple(PASSAGES[:2]) and turns[1].passages == ()
    want = qa.ask("Is it on time?", history=turns[:1])
    assert messages[-1].content == want.text
    chat.invoke({"messages": [("user", "Who runs the bakery?")]}, bob)  # another thread starts afresh
    assert retriever.queries[-1] == "Who runs the bakery?"
