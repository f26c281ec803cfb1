"""Document question answering: retrieve passages, answer from them, cite them.

``DocumentQA`` retrieves the top passages for a question, numbers them in a prompt
(``ragspec.prompts``), and generates the answer with the speculative generator, handing each
passage to the drafter as its own reference so that copied spans cost one forward for many
tokens. The answer comes with citations, chosen by the rules of ``ragspec.citations``
(``choose_citations``); a passage is never cited just for being retrieved. An answer no passage
backs (``Answer.supported`` False) shows its flag, ``Answer.note``, in ``Answer.text`` by default
(``unsupported="abstain"``; see ``DocumentQA``). An answer cut by ``max_tokens`` or the repetition
stop shows its text up to its last whole word (``ragspec.engine.text.WholeWordText``); the
generator's tokens are untouched.

Passages that do not fit the model's context window together with the answer budget are
dropped from the lowest rank up; if the top passage alone is too long it is truncated. Either
way a ``ContextBudgetWarning`` says so. With ``passage_order="document"`` the passages kept are
placed in document order (source, then position in it) instead of rank order: questions whose
passages overlap then share a longer prompt prefix, which the generator's prefix cache does not
compute again.

Conversations (``history=``, or ``DocumentQA.conversation()``; see ``ragspec.conversation``): a
follow-up is retrieved with a query built from the conversation (``follow_up``), and asked after
the earlier turns, laid out so that its prompt extends the previous turn's
(``ragspec.prompts.conversation_messages``): earlier passages stay in place under their numbers,
passages not shown yet come with the new question. Earlier turns that do not fit the context
budget are dropped, oldest first (``Answer.dropped_turns``, and a ``ContextBudgetWarning``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig

from ragspec.answers import UNSUPPORTED_MODES, Answer, AnswerStream, AsyncAnswerStream
from ragspec.citations import cited_answer
from ragspec.context_budget import ContextBudgetWarning
from ragspec.bridge import iterate_in_thread
from ragspec.conversation import FOLLOW_UP_MODES, ChatQARunnable, Conversation, History
from ragspec.engine.config import GenerationConfig
from ragspec.engine.text import question_text
from ragspec.prompts import QA_SYSTEM_PROMPT
from ragspec.qa_models import GenerationSource, LangChainAnswering, QARequest, answering_for
from ragspec.registry import LocalModel
from retrievers.extras import require

QA_DEFAULTS: Mapping[str, Any] = MappingProxyType({"repetition_stop": 12})
"""What ``DocumentQA`` sets where its llm keeps ``GenerationConfig``'s defaults: an answer that starts
repeating 12 of its own tokens, or a sentence of its own, ends there (README, "Answers that end";
``benchmarks/qa_defaults.py`` measures other lengths and penalties on the bundled questions)."""

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

    from ragspec.engine.results import GenerationStats
    from retrievers import FaissVectorStore

__all__ = ["AsyncAnswerStream", "ContextBudgetWarning", "DocumentQA", "DocumentQARunnable", "GenerationSource"]


class DocumentQARunnable(Runnable[str, Answer]):
    """``DocumentQA`` as a LangChain ``Runnable``: a question string in, an ``Answer`` out.

    ``invoke``/``ainvoke``/``batch``/``abatch`` return ``Answer`` objects. ``stream``/``astream``
    (and ``transform`` inside a chain) yield the answer's text deltas as ``str`` chunks and end
    with one ``Answer`` chunk (text, citations, passages, stats); before it, when the answer abstained
    (``DocumentQA(unsupported="abstain")``, the default) a text chunk with its flag
    (``Answer.stream_flag``), so the streamed text never carries an unbacked answer unmarked::

        for chunk in qa.as_runnable().stream("When does the ferry leave?"):
            if isinstance(chunk, str):
                print(chunk, end="")
            else:
                answer = chunk  # the last chunk

    Keyword arguments of the calls (or of ``.bind(...)``) are ``DocumentQA.ask``'s: ``k`` and the
    generation options (``max_tokens``, ``temperature``, ...). Callbacks see one chain run whose
    output is the ``Answer``.
    """

    name = "DocumentQA"

    def __init__(self, qa: DocumentQA) -> None:
        self.qa = qa

    @property
    def InputType(self) -> type[str]:  # noqa: N802 - LangChain's name
        return str

    @property
    def OutputType(self) -> type[Answer]:  # noqa: N802 - LangChain's name
        return Answer

    def invoke(self, input: str, config: RunnableConfig | None = None, **kwargs: Any) -> Answer:
        return self._call_with_config(lambda question: self.qa.ask(_question([question]), **kwargs), input, config)

    async def ainvoke(self, input: str, config: RunnableConfig | None = None, **kwargs: Any) -> Answer:
        return await self._acall_with_config(
            lambda question: self.qa.aask(_question([question]), **kwargs), input, config
        )

    def stream(  # type: ignore[override]  # str deltas, then the Answer
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[str | Answer]:
        return self.transform(iter([input]), config, **kwargs)

    def transform(  # type: ignore[override]
        self, input: Iterator[str], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[str | Answer]:
        yield from self._transform_stream_with_config(input, self._answer_stream, config, **kwargs)

    async def astream(  # type: ignore[override]
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[str | Answer]:
        async def one() -> AsyncIterator[str]:
            yield input

        async with aclosing(self.atransform(one(), config, **kwargs)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def atransform(  # type: ignore[override]
        self, input: AsyncIterator[str], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[str | Answer]:
        async with aclosing(self._atransform_stream_with_config(input, self._aanswer_stream, config, **kwargs)) as chunks:
            async for chunk in chunks:
                yield chunk

    def _answer_stream(self, chunks: Iterator[str], k: int | None = None, **options: Any) -> Iterator[str | Answer]:
        with self.qa.stream(_question(chunks), k=k, **options) as stream:
            yield from stream
        assert stream.answer is not None
        yield from _with_flag(stream.answer)

    async def _aanswer_stream(
        self, chunks: AsyncIterator[str], k: int | None = None, **options: Any
    ) -> AsyncIterator[str | Answer]:
        question = _question([c async for c in chunks])
        async with aclosing(iterate_in_thread(lambda: self.qa._events(question, k, options))) as events:
            async for event in events:
                for chunk in _with_flag(event) if isinstance(event, Answer) else (event,):
                    yield chunk


def _with_flag(answer: Answer) -> Iterator[str | Answer]:
    """The last chunks of a streamed answer: its ``stream_flag`` (when it abstained), then the ``Answer``."""
    if answer.stream_flag:
        yield answer.stream_flag
    yield answer


def _question(chunks: Iterable[object]) -> str:
    """The question from its input chunks (a chain may stream a string in pieces)."""
    parts = list(chunks)
    if not all(isinstance(p, str) for p in parts):
        kinds = ", ".join(sorted({type(p).__name__ for p in parts}))
        raise ValueError(f"DocumentQA's runnable takes a question string, got {kinds}")
    return "".join(parts)  # type: ignore[arg-type]


class DocumentQA:
    """Question answering over documents, with citations; see the module docstring for the rules.

    Example::

        qa = DocumentQA.from_paths(["docs/"])
        answer = qa.ask("How long is the trial period?")
        print(answer.text, [c.source for c in answer.citations])

        stream = qa.stream("How long is the trial period?")
        for delta in stream:
            print(delta, end="")
        print(stream.answer.citations)
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: GenerationSource | None = None,
        *,
        system_prompt: str = QA_SYSTEM_PROMPT,
        snippet_chars: int = 240,
        passage_order: str = "rank",
        follow_up: str = "combine",
        generation: Mapping[str, Any] = QA_DEFAULTS,
        unsupported: str = "abstain",
    ) -> None:
        """``llm`` is a ``ChatRagSpec``, ``RagSpecLLM``, ``LocalModel`` or ``RemoteModel``; its settings
        (model, max_tokens, stop, sampling, speculation) apply to every answer. Default:
        ``LocalModel()`` (the default model, greedy, 256 new tokens at most). Any other LangChain
        chat model or LLM (``ChatOpenAI``, ``ChatOllama``, ...) answers too, with the same retrieval,
        prompt, citations and streaming; ragspec then neither drafts nor fits the passages to the
        model's window (it does not know that model's tokenizer), ``Answer.stats`` is None, and
        generation options are the model's own (set them on it; per-call options are refused).

        ``passage_order``: ``"rank"`` (the retriever's order) or ``"document"`` (source, then
        position: questions whose passage sets overlap share a longer prompt prefix). ``follow_up``: how a question after
        earlier turns is retrieved: ``"combine"`` (with the recent questions), ``"rewrite"`` (the
        model first rewrites it into a standalone question) or ``"question"`` (on its own).
        ``generation``: settings (``GenerationConfig`` names) for the llm's settings it leaves at their
        defaults; per-call options still win. Default ``QA_DEFAULTS``; ``{}`` for the llm's own.

        ``unsupported``: what ``Answer.text`` holds when no passage backs the answer (``Answer.supported``
        False): ``"abstain"`` (the default), "I don't know" and why, with the model's words kept in
        ``Answer.generated_text``; or ``"flag"``, the model's words. The default is what a reader of
        ``.text`` wants, such as a LangChain chain that passes it on: the default model answers most
        questions wrongly, and an unbacked answer reads as confidently as a backed one, so the text
        should not carry it unmarked. A stream (``stream``) yields the model's words as they come (it
        never takes text back); its ``Answer`` then says whether they are backed (``note``)."""
        if not isinstance(retriever, BaseRetriever):
            raise ValueError(f"retriever must be a langchain BaseRetriever, got {type(retriever).__name__}")
        if llm is None:
            llm = LocalModel()
        self.answering = answering_for(llm, follow_up)
        """Who writes the answers: ``ragspec.qa_models.RagspecAnswering`` or ``LangChainAnswering``."""
        if snippet_chars < 1:
            raise ValueError(f"snippet_chars must be positive, got {snippet_chars}")
        if passage_order not in ("document", "rank"):
            raise ValueError(f"passage_order must be 'document' or 'rank', got {passage_order!r}")
        if unsupported not in UNSUPPORTED_MODES:
            raise ValueError(f"unsupported must be one of {', '.join(map(repr, UNSUPPORTED_MODES))}, got {unsupported!r}")
        if follow_up not in FOLLOW_UP_MODES:
            raise ValueError(f"follow_up must be one of {', '.join(map(repr, FOLLOW_UP_MODES))}, got {follow_up!r}")
        self.generation = dict(generation)
        GenerationConfig().merged(self.generation)  # a bad setting fails here, naming it
        self.passage_order = passage_order
        self.follow_up = follow_up
        self.unsupported = unsupported
        self.retriever = retriever
        self.llm = llm
        self.system_prompt = system_prompt
        self.snippet_chars = snippet_chars

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_paths(
        cls,
        paths: str | Path | Sequence[str | Path],
        *,
        llm: GenerationSource | None = None,
        embeddings: Embeddings | None = None,
        k: int = 4,
        chunk_size: int = 256,
        chunk_overlap: int = 32,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        index_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> DocumentQA:
        """Load, chunk and index files or directories (hybrid dense + BM25 retrieval of ``k`` passages).

        With ``index_dir`` the FAISS index is also saved there, for ``from_index`` later.
        """
        require("retrieval", "DocumentQA.from_paths")
        from retrievers import DEFAULT_INCLUDE, FaissVectorStore, default_embeddings, load_documents, split_documents

        loaded = load_documents(paths, include=include, exclude=exclude)
        if not loaded.documents:
            skipped = "; ".join(f"{s.path}: {s.reason}" for s in loaded.skipped[:5])
            raise ValueError(
                f"no readable documents under {paths!r}"
                + (f" (skipped {skipped})" if skipped else "")
                + ": pass files or directories holding documents ("
                + " ".join(pattern.removeprefix("*") for pattern in DEFAULT_INCLUDE) + ")"
            )
        chunks = split_documents(loaded.documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        store = FaissVectorStore(embeddings or default_embeddings())
        store.add_documents(chunks)
        if index_dir is not None:
            store.save(index_dir)
        return cls.from_vectorstore(store, documents=chunks, k=k, llm=llm, **kwargs)

    @classmethod
    def from_index(
        cls,
        directory: str | Path,
        *,
        llm: GenerationSource | None = None,
        embeddings: Embeddings | None = None,
        k: int = 4,
        **kwargs: Any,
    ) -> DocumentQA:
        """Open an index saved by ``FaissVectorStore.save`` (or ``from_paths(index_dir=...)``)."""
        require("retrieval", "DocumentQA.from_index")
        from retrievers import FaissVectorStore, default_embeddings

        store = FaissVectorStore.load(directory, embeddings or default_embeddings())
        return cls.from_vectorstore(store, k=k, llm=llm, **kwargs)

    @classmethod
    def from_store(
        cls,
        store: str | Path,
        *,
        collection: str | None = None,
        llm: GenerationSource | None = None,
        embeddings: Embeddings | None = None,
        k: int = 4,
        **kwargs: Any,
    ) -> DocumentQA:
        """Open a store by name: a ``postgresql://`` URL (``collection`` of a database filled by ``ragspec ingest
        --store``: dense and keyword search both run in PostgreSQL, nothing is held in this process) or an
        index folder (as ``from_index``). Retrieval is hybrid, ``k`` passages."""
        require("retrieval", "DocumentQA.from_store")
        from retrievers import default_embeddings
        from retrievers.stores import open_hybrid_retriever

        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        retriever = open_hybrid_retriever(str(store), embeddings or default_embeddings(), collection=collection, k=k)
        return cls(retriever, llm, **kwargs)

    @classmethod
    def from_vectorstore(
        cls,
        store: FaissVectorStore,
        *,
        documents: list[Document] | None = None,
        k: int = 4,
        hybrid: bool = True,
        llm: GenerationSource | None = None,
        **kwargs: Any,
    ) -> DocumentQA:
        """Retrieve from ``store``: fused with BM25 over ``documents`` (default: the store's own) when ``hybrid``."""
        require("retrieval", "DocumentQA.from_vectorstore")
        from retrievers import HybridRetriever

        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        retriever: BaseRetriever
        if hybrid:
            retriever = HybridRetriever(vectorstore=store, documents=documents, k=k)
        else:
            retriever = store.as_retriever(search_kwargs={"k": k})
        return cls(retriever, llm, **kwargs)

    # -- answering ------------------------------------------------------------------------------
    def ask(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> Answer:
        """Answer ``question`` from the retrieved passages.

        ``history``: the conversation so far, as LangChain messages, ``(role, text)`` pairs or
        ``Turn``s (``Answer.as_turn()``; see ``ragspec.conversation.to_turns``). ``k`` overrides the
        number of passages retrieved; ``options`` (``max_tokens``, ``temperature``, ... as in
        ``GenerationConfig``) override the llm's settings for this answer.
        """
        with self.stream(question, history=history, k=k, **options) as stream:
            for _ in stream:
                pass
        assert stream.answer is not None
        return stream.answer

    def stream(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> AnswerStream:
        """Retrieve now; generate as the returned stream is iterated (see ``AnswerStream``)."""
        request = self._prepare(question, k, options, history)
        return AnswerStream(lambda on_start: self._generate(request, on_start), request.passages)

    async def aask(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> Answer:
        """``ask`` in a worker thread; cancelling the call stops the generation (see ``AsyncAnswerStream``)."""
        stream = self.astream(question, history=history, k=k, **options)
        async for _ in stream:
            pass
        assert stream.answer is not None
        return stream.answer

    def astream(self, question: str, *, history: History = (), k: int | None = None, **options: Any) -> AsyncAnswerStream:
        """``stream`` for asyncio (see ``AsyncAnswerStream``)."""
        return AsyncAnswerStream(lambda: self._events(question, k, options, history))

    def conversation(self, history: History = ()) -> Conversation:
        """A conversation over these documents that keeps its own history (see ``ragspec.conversation``)."""
        return Conversation(self, history)

    def as_chat_runnable(self, question_key: str = "question", history_key: str = "history") -> ChatQARunnable:
        """This pipeline over chat messages, an ``AIMessage`` out (e.g. a LangGraph node with a
        checkpointer; see ``ragspec.conversation.ChatQARunnable``)."""
        return ChatQARunnable(self, question_key, history_key)

    def as_runnable(self) -> DocumentQARunnable:
        """This pipeline as a LangChain ``Runnable[str, Answer]`` (see ``DocumentQARunnable``)."""
        return DocumentQARunnable(self)

    @property
    def external(self) -> bool:
        """``llm`` is a LangChain model that is not ragspec's: it generates, ragspec does not draft."""
        return isinstance(self.answering, LangChainAnswering)

    # -- steps ----------------------------------------------------------------------------------
    def retrieve(self, query: str, k: int | None = None) -> list[Document]:
        """The retriever's passages for ``query`` (``k`` of them when given, else its own number)."""
        return list(self.retriever.invoke(query) if k is None else self.retriever.invoke(query, k=k))

    def _events(
        self, question: str, k: int | None, options: dict[str, Any], history: History = ()
    ) -> Generator[str | Answer, None, None]:
        """Retrieve, then the answer's text deltas, then the ``Answer`` (for worker threads)."""
        return self._generate(self._prepare(question, k, options, history))

    def _prepare(self, question: str, k: int | None, options: dict[str, Any], history: History = ()) -> QARequest:
        question = question_text(question)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive integer, got {k!r}")
        return self.answering.prepare(self, question, k, options, history)

    def _generate(
        self, request: QARequest, on_start: Callable[[GenerationStats], None] | None = None
    ) -> Generator[str | Answer, None, None]:
        text, finish_reason, stats = yield from self.answering.generate(request, on_start)
        yield cited_answer(request, text, finish_reason, stats, self.snippet_chars, self.unsupported)
