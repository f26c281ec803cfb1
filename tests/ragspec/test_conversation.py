"""Conversations: histories, the prompt layout that extends turn by turn, follow-up retrieval, the
conversation object and RunnableWithMessageHistory (tiny random model over the default tokenizer)."""

from __future__ import annotations

import warnings

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.history import RunnableWithMessageHistory

from ragspec.conversation import PASSAGES_KEY, chat_input, to_messages, to_turns
from ragspec.lc import ChatRagSpec
from ragspec.pipeline import ContextBudgetWarning, DocumentQA
from ragspec.engine.text import whole_words
from ragspec.prompts import Turn, chat_prompt_ids, conversation_messages

from tests.ragspec.test_pipeline import PASSAGES, doc

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
    tok = lc_tiny_generator.lm.tokenizer
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
    assert answer.stats.prompt_tokens + 8 <= lc_tiny_generator.lm.context_length
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
