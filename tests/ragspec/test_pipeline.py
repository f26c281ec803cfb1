"""DocumentQA: prompts, citations, context budget, streaming, Runnable use (tiny random model).

The real default model answering over real files is in the integration tests at the end.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.retrievers import BaseRetriever

from ragspec.lc import ChatRagSpec
from ragspec.pipeline import Answer, ContextBudgetWarning, DocumentQA
from ragspec.engine.text import whole_words
from ragspec.prompts import QA_CHAT_PROMPT, format_passages, qa_messages

FERRY = "The Larkspur ferry leaves Dunmore harbour at 7:15 every morning. The crossing to Gannet Island takes forty minutes."
BAKERY = "The Quillon bakery on Mill Street sells rye bread on Tuesdays only. Marta Quillon opened it in 1987."
LIBRARY = "The Brackwater library lends telescopes to its members for two weeks at a time."


def doc(text: str, source: str, **meta: object) -> Document:
    return Document(page_content=text, metadata={"source": source, **meta})


PASSAGES = [
    doc(FERRY, "/docs/ferry.txt", start_index=0, chunk_id="c-ferry"),
    doc(BAKERY, "/docs/bakery.md", start_index=120, title="Bakery", chunk_id="c-bakery"),
    doc(LIBRARY, "/docs/library.pdf", page=3, chunk_id="c-library"),
]


class FixedRetriever(BaseRetriever):
    """Returns the same passages (the first ``k`` when it is given) for every question."""

    passages: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        return list(self.passages)[:k]


class FixedChat(BaseChatModel):
    """A LangChain chat model that streams ``text`` word by word and ends with ``finish``."""

    text: str
    finish: str = "stop"

    @property
    def _llm_type(self) -> str:
        return "fixed"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        raise AssertionError("DocumentQA streams")

    def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for piece in re.findall(r"\s*\S+", self.text):
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        yield ChatGenerationChunk(message=AIMessageChunk(content="", response_metadata={"finish_reason": self.finish}))


@pytest.fixture
def qa(lc_tiny_generator) -> DocumentQA:
    """Answers whose text is the model's words, flagged when unsupported (the random model's always are)."""
    return DocumentQA(FixedRetriever(passages=PASSAGES), ChatRagSpec(generator=lc_tiny_generator, max_tokens=12),
                      unsupported="flag")  # fmt: skip


# -- prompts ------------------------------------------------------------------------------------
def test_passages_are_numbered_in_rank_order():
    text = format_passages(PASSAGES)
    assert text.index("[1] ferry.txt\n" + FERRY) < text.index("[2] Bakery\n" + BAKERY) < text.index("[3] library.pdf")
    user = qa_messages("When does the ferry leave?", PASSAGES)[1]["content"]
    assert user.startswith("Passages:") and user.endswith("Question: When does the ferry leave?")
    rendered = QA_CHAT_PROMPT.invoke({"context": text, "question": "q"}).to_messages()
    assert [m.type for m in rendered] == ["system", "human"] and "[1]" in rendered[0].content


def test_one_prompt_builder_with_and_without_a_chat_template(lc_tiny_generator):
    import copy

    from ragspec.prompts import NoChatTemplateWarning, chat_prompt_ids, plain_prompt, qa_prompt_ids

    tok = lc_tiny_generator.target.tokenizer
    turns = qa_messages("When does it leave?", PASSAGES)
    text = tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert qa_prompt_ids(tok, "When does it leave?", PASSAGES) == tok.encode(text, add_special_tokens=False)
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.warns(NoChatTemplateWarning):
        ids = qa_prompt_ids(bare, "When does it leave?", PASSAGES)
    transcript = plain_prompt(turns)
    assert ids == bare.encode(transcript)
    assert transcript.startswith(turns[0]["content"] + "\n\nUser: Passages:") and transcript.endswith("\n\nAssistant:")
    with pytest.warns(NoChatTemplateWarning):
        assert chat_prompt_ids(bare, [{"role": "user", "content": "hi \ud800"}]) == bare.encode("User: hi \ufffd\n\nAssistant:")
    with pytest.raises(ValueError, match="role"):
        chat_prompt_ids(tok, [{"role": "tool", "content": "x"}])


def test_answer_supported_follows_its_citations(qa, monkeypatch):
    import ragspec.citations as citations

    unsupported = qa.ask("What is the capital of Peru?")  # the random model's nonsense backs nothing
    assert (unsupported.supported, unsupported.citations, unsupported.citation_rule) == (False, [], "unsupported")
    monkeypatch.setattr(citations, "choose_citations", lambda text, passages, question="": ([2], "copied"))
    supported = qa.ask("What is the capital of Peru?")
    assert supported.supported and [c.number for c in supported.citations] == [2]


# -- answering ---------------------------------------------------------------------------------
def test_ask_answers_from_the_numbered_prompt(qa, lc_tiny_generator):
    tok = lc_tiny_generator.target.tokenizer
    text = tok.apply_chat_template(qa_messages("When does it leave?", PASSAGES), tokenize=False, add_generation_prompt=True)
    want = lc_tiny_generator.generate(tok.encode(text, add_special_tokens=False), max_new_tokens=12)
    answer = qa.ask("When does it leave?")
    assert isinstance(answer, Answer)
    assert answer.text == whole_words(want.text)  # cut at max_tokens: up to its last whole word
    assert answer.stats.new_tokens == want.stats.new_tokens == 12  # the generator's tokens, untouched
    assert answer.passages == PASSAGES
    assert answer.stats.prompt_tokens == want.stats.prompt_tokens
    assert answer.finish_reason == "length"
    # Nonsense from the random model cites nothing and copies nothing: no citation at all.
    assert (answer.citation_rule, answer.citations, answer.supported) == ("unsupported", [], False)


def test_citations_describe_their_passage(lc_tiny_generator, monkeypatch):
    import ragspec.citations as citations

    monkeypatch.setattr(citations, "choose_citations", lambda text, passages, question="": ([1], "cited"))
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), ChatRagSpec(generator=lc_tiny_generator, max_tokens=4))
    [c] = qa.ask("When does it leave?").citations
    assert (c.number, c.source, c.start_index, c.page, c.title, c.chunk_id) == (1, "/docs/ferry.txt", 0, None, None, "c-ferry")
    assert c.text == FERRY


def test_a_citation_shows_the_sentence_the_answer_drew_from_with_its_offset():
    chat = FixedChat(text="It takes forty minutes to cross to Gannet Island.")
    passages = [doc(FERRY, "/docs/ferry.txt", start_index=500), doc(LIBRARY, "/docs/library.pdf", page=3)]
    answer = DocumentQA(FixedRetriever(passages=passages), chat).ask("How long is the crossing?")
    [c] = answer.citations
    assert c.text == "The crossing to Gannet Island takes forty minutes."  # not the passage's first sentence
    assert c.offset == 500 + FERRY.index("The crossing") and c.start_index == 500 and c.location == f"char {c.offset}"
    assert FERRY[c.offset - 500 :].startswith(c.text)


def test_citation_fields_and_snippet(lc_tiny_generator, monkeypatch):
    import ragspec.citations as citations

    monkeypatch.setattr(citations, "choose_citations", lambda text, passages, question="": ([3, 2], "cited"))
    qa = DocumentQA(
        FixedRetriever(passages=PASSAGES), ChatRagSpec(generator=lc_tiny_generator, max_tokens=4), snippet_chars=40
    )
    a, b = qa.ask("q").citations
    assert (a.number, a.source, a.page, a.chunk_id) == (3, "/docs/library.pdf", 3, "c-library")
    assert (b.number, b.title, b.start_index) == (2, "Bakery", 120)
    assert b.text == "The Quillon bakery on Mill Street sells…"


def test_passages_go_to_the_drafter_each_as_a_reference(qa, lc_tiny_generator, monkeypatch):
    seen: list[tuple] = []
    original = lc_tiny_generator.stream

    def spy(prompt, *args, **kwargs):
        seen.append(tuple(kwargs["references"]))
        return original(prompt, *args, **kwargs)

    monkeypatch.setattr(lc_tiny_generator, "stream", spy)
    qa.ask("When does it leave?")
    assert seen == [(FERRY, BAKERY, LIBRARY)]


def test_stream_yields_the_answer_then_exposes_citations(qa):
    want = qa.ask("When does it leave?")
    stream = qa.stream("When does it leave?")
    assert stream.passages == PASSAGES and stream.answer is None
    deltas = list(stream)
    assert len(deltas) > 1 and "".join(deltas) == want.text
    assert stream.answer is not None and stream.answer.text == want.text
    assert stream.answer.citations == want.citations


def test_closing_a_stream_early_frees_the_model(qa):
    stream = qa.stream("When does it leave?")
    iterator = iter(stream)
    next(iterator)
    iterator.close()
    assert stream.answer is None
    done: list[Answer] = []
    worker = threading.Thread(target=lambda: done.append(qa.ask("When does it leave?")), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the generator stayed locked after a closed stream"


async def test_async(qa):
    want = qa.ask("When does it leave?")
    assert (await qa.aask("When does it leave?")).text == want.text
    stream = qa.astream("When does it leave?")
    deltas = [d async for d in stream]
    assert "".join(deltas) == want.text and stream.answer.citations == want.citations


def test_as_runnable_invoke_and_batch(qa):
    runnable = qa.as_runnable()
    want = qa.ask("When does it leave?")
    got = runnable.invoke("When does it leave?")
    assert isinstance(got, Answer) and got.text == want.text and got.citations == want.citations
    assert [a.text for a in runnable.batch(["When does it leave?", "When does it leave?"])] == [want.text] * 2
    # Per-call options, directly or bound.
    assert runnable.invoke("When does it leave?", max_tokens=3).stats.new_tokens == 3
    assert len(runnable.bind(k=2).invoke("When does it leave?").passages) == 2


def test_as_runnable_streams_text_deltas_then_the_answer(qa):
    want = qa.ask("When does it leave?")
    chunks = list(qa.as_runnable().stream("When does it leave?"))
    *deltas, last = chunks
    assert len(deltas) > 1 and all(isinstance(d, str) for d in deltas)
    assert "".join(deltas) == want.text
    assert isinstance(last, Answer) and last.text == want.text and last.citations == want.citations


def test_as_runnable_inside_a_chain_streams_and_reports_the_answer(qa):
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tracers.base import BaseTracer

    class Runs(BaseTracer):
        def __init__(self) -> None:
            super().__init__()
            self.outputs: dict[str, object] = {}

        def _persist_run(self, run) -> None:
            pass

        def _on_chain_end(self, run) -> None:
            self.outputs[run.name] = run.outputs

    want = qa.ask("When does it leave?")
    chain = RunnableLambda(lambda q: q.strip()) | qa.as_runnable().bind(max_tokens=12)
    tracer = Runs()
    chunks = list(chain.stream("  When does it leave?  ", config={"callbacks": [tracer]}))
    assert "".join(c for c in chunks if isinstance(c, str)) == want.text
    assert isinstance(chunks[-1], Answer)
    assert tracer.outputs["DocumentQA"]["output"].text == want.text  # the run's output is the Answer
    text_chain = qa.as_runnable() | RunnableLambda(lambda answer: answer.text)
    assert text_chain.invoke("When does it leave?") == want.text


async def test_as_runnable_async(qa):
    runnable = qa.as_runnable()
    want = qa.ask("When does it leave?")
    assert (await runnable.ainvoke("When does it leave?")).text == want.text
    chunks = [c async for c in runnable.astream("When does it leave?")]
    assert "".join(c for c in chunks[:-1]) == want.text and len(chunks) > 2
    assert isinstance(chunks[-1], Answer) and chunks[-1].citations == want.citations
    assert [a.text for a in await runnable.abatch(["When does it leave?"] * 2)] == [want.text] * 2


def test_as_runnable_takes_a_question_string(qa):
    with pytest.raises(ValueError, match="question string, got dict"):
        qa.as_runnable().invoke({"question": "q"})  # type: ignore[arg-type]


def test_invalid_arguments(qa, lc_tiny_generator):
    with pytest.raises(ValueError, match="non-empty"):
        qa.ask("   ")
    with pytest.raises(ValueError, match="BaseRetriever"):
        DocumentQA(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ChatRagSpec, RagSpecLLM, LocalModel or RemoteModel"):
        DocumentQA(FixedRetriever(passages=[]), llm=object())  # type: ignore[arg-type]


# -- context budget ----------------------------------------------------------------------------
def long_passage(i: int, words: int) -> Document:
    return doc(" ".join(f"word{i}x{j}" for j in range(words)), f"/docs/long{i}.txt")


def test_low_ranked_passages_are_dropped_to_fit(lc_tiny_generator):
    # The tiny model takes 512 tokens; five passages of ~150 tokens cannot all fit.
    passages = [long_passage(i, 40) for i in range(5)]
    qa = DocumentQA(FixedRetriever(passages=passages), ChatRagSpec(generator=lc_tiny_generator, max_tokens=16))
    with pytest.warns(ContextBudgetWarning, match="dropped the [1-4] lowest-ranked"):
        answer = qa.ask("Which words?")
    assert 0 < len(answer.passages) < 5
    assert answer.passages == passages[: len(answer.passages)]
    assert answer.stats.prompt_tokens + 16 <= lc_tiny_generator.target.context_length
    assert answer.stats.new_tokens == 16


def test_a_passage_too_long_alone_is_truncated(lc_tiny_generator):
    passages = [long_passage(0, 400), long_passage(1, 10)]
    qa = DocumentQA(FixedRetriever(passages=passages), ChatRagSpec(generator=lc_tiny_generator, max_tokens=16))
    with pytest.warns(ContextBudgetWarning, match="truncated the top one"):
        answer = qa.ask("Which words?")
    [kept] = answer.passages
    assert passages[0].page_content.startswith(kept.page_content) and len(kept.page_content) > 100
    assert kept.metadata == passages[0].metadata
    assert answer.stats.prompt_tokens + 16 <= lc_tiny_generator.target.context_length


def test_no_warning_when_everything_fits(qa):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextBudgetWarning)
        assert len(qa.ask("q").passages) == 3


def test_a_question_too_long_for_the_context_is_a_clear_error(lc_tiny_generator):
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), ChatRagSpec(generator=lc_tiny_generator, max_tokens=16))
    with pytest.raises(ValueError, match="shorten the question or lower max_tokens"):
        qa.ask("why " * 600)


# -- building from files and indexes -------------------------------------------------------------
def write_docs(directory: Path) -> None:
    (directory / "ferry.txt").write_text(FERRY + "\n")
    (directory / "bakery.md").write_text("# Bakery\n\n" + BAKERY + "\n")
    (directory / "library.txt").write_text(LIBRARY + "\n")


def test_from_paths_and_from_index(tmp_path, lc_tiny_generator):
    docs = tmp_path / "docs"
    docs.mkdir()
    write_docs(docs)
    llm = ChatRagSpec(generator=lc_tiny_generator, max_tokens=6)
    embeddings = DeterministicFakeEmbedding(size=32)
    qa = DocumentQA.from_paths(docs, llm=llm, embeddings=embeddings, k=2, index_dir=tmp_path / "index")
    answer = qa.ask("Which day is rye bread sold at the Quillon bakery?")
    assert len(answer.passages) == 2
    # BM25 finds the bakery passage whatever the fake embeddings say, so it is among the two.
    assert any("rye bread" in p.page_content for p in answer.passages)
    assert {Path(c.source).name for c in answer.citations} <= {"ferry.txt", "bakery.md", "library.txt"}
    reopened = DocumentQA.from_index(tmp_path / "index", llm=llm, embeddings=embeddings, k=2)
    again = reopened.ask("Which day is rye bread sold at the Quillon bakery?")
    assert [p.page_content for p in again.passages] == [p.page_content for p in answer.passages]
    assert again.text == answer.text


def test_from_paths_without_documents_says_what_to_do(tmp_path, lc_tiny_generator):
    with pytest.raises(ValueError, match="no readable documents"):
        DocumentQA.from_paths(tmp_path, llm=ChatRagSpec(generator=lc_tiny_generator), embeddings=DeterministicFakeEmbedding(size=8))


# -- the real default model ------------------------------------------------------------------------
@pytest.mark.integration
def test_default_model_answers_and_cites_the_right_file(tmp_path):
    write_docs(tmp_path)
    qa = DocumentQA.from_paths(tmp_path, llm=ChatRagSpec(max_tokens=32), k=2)
    stream = qa.stream("When does the Larkspur ferry leave Dunmore harbour?")
    text = "".join(stream)
    answer = stream.answer
    assert text == answer.text
    assert "7:15" in answer.text
    assert Path(answer.citations[0].source).name == "ferry.txt"
    assert answer.stats.accepted_tokens > 0  # copied spans were drafted and accepted



def test_answer_stream_exposes_live_stats(qa):
    stream = qa.stream("When does the ferry leave?")
    assert stream.stats is None  # nothing generated yet
    counts = [stream.stats.new_tokens for _ in stream]
    assert counts and counts[-1] >= counts[0] >= 1
    assert stream.answer is not None and stream.answer.stats is stream.stats


def test_qa_defaults_fill_only_what_the_llm_leaves_at_its_defaults(lc_tiny_generator):
    import ragspec.pipeline as pipeline

    llm = ChatRagSpec(generator=lc_tiny_generator, max_tokens=4, repeat_penalty=1.3)
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), llm, generation={"repetition_stop": 9, "repeat_penalty": 1.1})
    config = qa._prepare("When?", None, {}).options.config
    assert (config.repetition_stop, config.repeat_penalty) == (9, 1.3)  # the llm's own setting wins
    assert qa._prepare("When?", None, {"repetition_stop": 0}).options.config.repetition_stop == 0  # and a call's
    assert DocumentQA(FixedRetriever(passages=PASSAGES), llm).generation == dict(pipeline.QA_DEFAULTS)
    assert DocumentQA(FixedRetriever(passages=PASSAGES), llm, generation={})._prepare("When?", None, {}).options.config.repetition_stop == 0
    with pytest.raises(ValueError, match="repetition_stop"):
        DocumentQA(FixedRetriever(passages=PASSAGES), llm, generation={"repetition_stop": 1})


# -- unsupported answers and clean ends ----------------------------------------------------------------
MERCURY = "The boiling point of mercury is 4.1875 degrees Celsius."


def test_an_unsupported_answer_abstains_by_default_and_keeps_the_model_s_words():
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY))
    with qa.stream("What is the boiling point of mercury?") as stream:
        deltas = list(stream)
    answer = stream.answer
    assert "".join(deltas) == MERCURY == answer.generated_text == answer.model_text  # a stream never takes text back
    assert not answer.supported and answer.text == answer.note
    assert answer.note.startswith("I don't know: no passage backs this answer") and "4.1875" in answer.note
    assert answer.missing_facts == ("4.1875", "celsius")
    flagged = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY), unsupported="flag").ask("q?")
    assert flagged.text == MERCURY and flagged.generated_text is None and not flagged.supported and flagged.note
    backed = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text="It sells rye bread on Tuesdays only.")).ask(
        "When does the Quillon bakery sell rye bread?")
    assert backed.supported and backed.text == "It sells rye bread on Tuesdays only." and backed.note == ""
    with pytest.raises(ValueError, match="unsupported must be one of 'abstain', 'flag'"):
        DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY), unsupported="hide")


def test_a_number_in_words_in_the_passage_backs_the_same_number_in_digits():
    passages = [doc("The water reached the town at two. Twenty-three people died.", "/docs/flood.txt")]
    qa = DocumentQA(FixedRetriever(passages=passages), FixedChat(text="The number of people who died was 23."))
    answer = qa.ask("How many people died in it?", history=[("user", "When did the flood hit?"), ("assistant", "In 1871.")])
    assert answer.supported and answer.text.endswith("was 23.") and answer.citations[0].text == "Twenty-three people died."


def test_the_runnables_show_the_flag_in_what_they_stream_and_return():
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY))
    *deltas, last = list(qa.as_runnable().stream("What is the boiling point of mercury?"))
    assert "".join(deltas) == MERCURY + "\n\n" + last.note and isinstance(last, Answer) and last.text == last.note
    assert qa.as_runnable().invoke("What is the boiling point of mercury?").text == last.note
    chat = qa.as_chat_runnable()
    message = chat.invoke({"question": "What is the boiling point of mercury?", "history": []})
    assert message.content == last.note and message.response_metadata["supported"] is False
    assert message.response_metadata["note"] == last.note and message.response_metadata["missing_facts"] == ["4.1875", "celsius"]
    chunks = list(chat.stream({"question": "What is the boiling point of mercury?"}))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.content == MERCURY + "\n\n" + last.note and whole.response_metadata["supported"] is False
    conversation = qa.conversation()
    assert conversation.ask("What is the boiling point of mercury?").text == last.note
    assert conversation.turns[-1].answer == ""  # no answer was shown: the next prompt holds none (Answer.as_turn)
    # With unsupported="flag" the streamed text is the model's words alone; the Answer flags them.
    flag = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY), unsupported="flag")
    *deltas, last = list(flag.as_runnable().stream("What is the boiling point of mercury?"))
    assert "".join(deltas) == MERCURY and not last.supported


async def test_the_async_runnable_streams_the_flag_too():
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=MERCURY))
    chunks = [c async for c in qa.as_runnable().astream("What is the boiling point of mercury?")]
    assert "".join(c for c in chunks[:-1]) == MERCURY + "\n\n" + chunks[-1].note


@pytest.mark.parametrize(
    ("text", "finish", "shown"),
    [
        ("Robert Boyle refined his work by refining his work by re", "repetition", "Robert Boyle refined his work by refining his work by"),
        ("The answer is: The", "length", "The answer is:"),
        ("It is twenty-thr", "length", "It is"),
        ("It is 23.", "length", "It is 23."),
        ("It ends by itself", "stop", "It ends by itself"),
    ],
)
def test_a_cut_answer_never_shows_a_partial_word(text, finish, shown):
    qa = DocumentQA(FixedRetriever(passages=PASSAGES), FixedChat(text=text, finish=finish), unsupported="flag")
    with qa.stream("q?") as stream:
        deltas = list(stream)
    assert "".join(deltas) == stream.answer.text == shown and stream.answer.finish_reason == finish
