"""``DocumentQA`` with a LangChain model that is not ragspec's (fake chat models and LLMs here;
``ChatOpenAI`` on a live ``ragspec serve`` in tests/apps/test_openai_clients.py): the same
retrieval, prompt, citations and streaming; no drafting stats."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from ragspec.pipeline import DocumentQA
from ragspec.prompts import conversation_messages
from tests.ragspec.test_pipeline import BAKERY, PASSAGES, FixedRetriever

ANSWER = "It sells rye bread on Tuesdays only [2]."


class RecordingChat(BaseChatModel):
    """Answers ``ANSWER`` in three-character chunks and records the messages it was given."""

    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        raise AssertionError("DocumentQA streams")

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
    ) -> Any:
        self.seen.append(messages)
        for i in range(0, len(ANSWER), 3):
            yield ChatGenerationChunk(message=AIMessageChunk(content=ANSWER[i : i + 3]))
        yield ChatGenerationChunk(message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"}))


def test_a_langchain_chat_model_answers_with_the_same_prompt_and_citations() -> None:
    chat = RecordingChat(seen=[])
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), chat)
    with qa.stream("When is rye bread sold?") as stream:
        deltas = list(stream)
    answer = stream.answer
    assert "".join(deltas) == answer.text == ANSWER and len(deltas) > 3  # streamed, each last word held until complete
    assert answer.stats is None and answer.finish_reason == "stop"
    assert answer.citation_rule == "cited" and [c.number for c in answer.citations] == [2]
    assert answer.citations[0].source == "/docs/bakery.md"
    assert answer.citations[0].text == BAKERY[: BAKERY.index(" Marta")]  # the sentence the answer drew from
    expected = conversation_messages([], "When is rye bread sold?", PASSAGES)
    (messages,) = chat.seen
    assert [(m.type, m.content) for m in messages] == [("system", expected[0]["content"]), ("human", expected[1]["content"])]

    follow_up = qa.ask("And who opened it?", history=[answer.as_turn()])  # the conversation goes on, as with ragspec models
    assert follow_up.history_turns == 1 and len(chat.seen[-1]) == 4


def test_a_langchain_llm_gets_the_plain_transcript() -> None:
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), FakeListLLM(responses=["The ferry leaves at 7:15 [1]."]))
    answer = qa.ask("When does the ferry leave?")
    assert answer.text == "The ferry leaves at 7:15 [1]." and [c.number for c in answer.citations] == [1]
    assert answer.stats is None


def test_options_and_rewrites_need_a_ragspec_model() -> None:
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), RecordingChat(seen=[]))
    with pytest.raises(ValueError, match="set them on RecordingChat itself"):
        qa.ask("When?", max_tokens=5)
    with pytest.raises(ValueError, match="follow_up='rewrite' needs a ragspec model"):
        DocumentQA(FixedRetriever(passages=PASSAGES), RecordingChat(seen=[]), follow_up="rewrite")
    with pytest.raises(ValueError, match="or a LangChain chat model"):
        DocumentQA(FixedRetriever(passages=PASSAGES), object())  # type: ignore[arg-type]
