"""Who writes ``DocumentQA``'s answers: a ragspec model, or any other LangChain model.

``DocumentQA`` retrieves, then hands the question to one of two small strategies, chosen once
when it is built (``answering_for``):

- ``RagspecAnswering`` for a ``GenerationSource`` (``LocalModel``, ``RemoteModel``, ``ChatRagSpec``,
  ``RagSpecLLM``): the llm's settings merged with the pipeline's, the prompt fitted to the model's
  window (``ragspec.context_budget``), each passage handed to the drafter as a reference.
- ``LangChainAnswering`` for any other LangChain chat model or LLM: the same retrieval and prompt
  turns, every earlier turn and passage kept (no tokenizer to fit them with), no drafting, no
  per-call options (they are the model's own).

Both yield the answer's text deltas (cut answers end at a whole word) and return its text, finish
reason and statistics; ``DocumentQA`` then cites and flags it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel, BaseLanguageModel

from ragspec.context_budget import document_position, fit_passages, fit_turns, prompt_ids
from ragspec.conversation import History, follow_up_query, passage_key, to_turns
from ragspec.engine.config import CallOptions, GenerationConfig, request_config
from ragspec.engine.text import WholeWordText
from ragspec.prompts import conversation_messages, plain_prompt

if TYPE_CHECKING:
    from ragspec.engine.results import GenerationStats, TextGenerator

_PLAIN = GenerationConfig()

Generated = Generator[str, None, tuple[str, str, "GenerationStats | None"]]
"""Text deltas, then (returned) the answer's text, its finish reason and its statistics (None: not ragspec's)."""


@runtime_checkable
class GenerationSource(Protocol):
    """Where answers come from: a loaded generator and the defaults of each call.

    ``ragspec.registry.LocalModel``, ``ChatRagSpec`` and ``RagSpecLLM`` are generation sources, and
    so is ``ragspec.remote.RemoteModel`` (generation on an OpenAI-compatible server).
    """

    def load(self, model: str | None = None) -> TextGenerator: ...

    def call_options(self, stop: Sequence[str] | None, options: Any) -> CallOptions: ...


class QASettings(Protocol):
    """What a strategy reads of its ``DocumentQA``."""

    system_prompt: str
    passage_order: str
    follow_up: str
    generation: dict[str, Any]

    def retrieve(self, query: str, k: int | None) -> list[Document]: ...


@dataclass(frozen=True)
class QARequest:
    """One question, retrieved and laid out, ready to generate."""

    question: str
    passages: list[Document]
    prompt_ids: list[int]
    options: CallOptions
    earlier_passages: int = 0
    history_turns: int = 0
    dropped_turns: int = 0
    retrieval_query: str = ""
    query_stats: GenerationStats | None = None
    messages: tuple[dict[str, str], ...] = ()
    """The prompt's turns, for a LangChain model that is not ragspec's (``prompt_ids`` is then empty)."""


class RagspecAnswering:
    """Answers from a ragspec ``GenerationSource`` (see the module docstring)."""

    def __init__(self, llm: GenerationSource) -> None:
        self.llm = llm

    def prepare(self, qa: QASettings, question: str, k: int | None, options: Mapping[str, Any], history: History) -> QARequest:
        base = self.llm.call_options(None, {})
        unset = {k: v for k, v in qa.generation.items() if getattr(base.config, k) == getattr(_PLAIN, k)}
        call = dataclasses.replace(base, config=request_config(base.config.merged(unset), dict(options)))
        turns = to_turns(history)
        generator = self.llm.load(call.model)
        query, query_stats = follow_up_query(qa.follow_up, question, turns, generator, qa.system_prompt)
        retrieved = qa.retrieve(query, k)
        max_tokens = call.config.max_tokens
        tokenizer, context = generator.tokenizer, generator.context_length
        kept, dropped = fit_turns(tokenizer, qa.system_prompt, question, retrieved, turns, max_tokens, context)
        shown = {passage_key(p) for t in kept for p in t.passages}
        new, ids = fit_passages(tokenizer, qa.system_prompt, question, [p for p in retrieved if passage_key(p) not in shown],
                                max_tokens, context, kept)
        if qa.passage_order == "document":
            new = sorted(new, key=document_position)
            ids = prompt_ids(tokenizer, qa.system_prompt, question, new, kept)
        passages = [p for t in kept for p in t.passages] + new
        call = dataclasses.replace(call, references=tuple(p.page_content for p in passages))
        return QARequest(question, passages, ids, call, len(passages) - len(new), len(kept), dropped, query, query_stats)

    def generate(self, request: QARequest, on_start: Callable[[GenerationStats], None] | None = None) -> Generated:
        options = request.options
        generator = self.llm.load(options.model)
        shown = WholeWordText()  # a cut answer shows no partial word (the tokens are the generator's, untouched)
        with generator.stream(request.prompt_ids, options.config, references=options.references) as stream:
            if on_start is not None:
                on_start(stream.stats)
            for delta in stream:
                if safe := shown.add(delta):
                    yield safe
        result = stream.result
        assert result is not None
        if tail := shown.finish(result.text, result.finish_reason):
            yield tail
        return shown.shown, result.finish_reason, result.stats


class LangChainAnswering:
    """Answers from a LangChain chat model or LLM that is not ragspec's (see the module docstring)."""

    def __init__(self, llm: BaseLanguageModel) -> None:
        self.llm = llm

    def prepare(self, qa: QASettings, question: str, k: int | None, options: Mapping[str, Any], history: History) -> QARequest:
        if options:
            raise ValueError(
                f"per-call options ({', '.join(sorted(options))}) are for ragspec models; set them on "
                f"{type(self.llm).__name__} itself (e.g. ChatOpenAI(max_tokens=...))"
            )
        turns = to_turns(history)
        query, _ = follow_up_query(qa.follow_up, question, turns, None, qa.system_prompt)  # type: ignore[arg-type]
        retrieved = qa.retrieve(query, k)
        shown = {passage_key(p) for t in turns for p in t.passages}
        new = [p for p in retrieved if passage_key(p) not in shown]
        if qa.passage_order == "document":
            new = sorted(new, key=document_position)
        passages = [p for t in turns for p in t.passages] + new
        messages = tuple(conversation_messages(turns, question, new, qa.system_prompt))
        call = CallOptions(model="", config=GenerationConfig(), references=tuple(p.page_content for p in passages))
        return QARequest(question, passages, [], call, len(passages) - len(new), len(turns), 0, query, None, messages)

    def generate(self, request: QARequest, on_start: Callable[[GenerationStats], None] | None = None) -> Generated:
        chat = isinstance(self.llm, BaseChatModel)
        prompt: Any = [(m["role"], m["content"]) for m in request.messages] if chat else plain_prompt(request.messages)
        text, finish, shown = "", "stop", WholeWordText()
        for chunk in self.llm.stream(prompt):
            delta = chunk if isinstance(chunk, str) else chunk.text
            finish = str((getattr(chunk, "response_metadata", None) or {}).get("finish_reason") or finish)
            if delta:
                text += delta
                if safe := shown.add(delta):
                    yield safe
        if tail := shown.finish(text, finish):
            yield tail
        return shown.shown, finish, None


Answering = RagspecAnswering | LangChainAnswering


def answering_for(llm: object, follow_up: str) -> Answering:
    """The strategy that answers with ``llm``; ``ValueError`` for anything that is not a model."""
    if isinstance(llm, GenerationSource):
        return RagspecAnswering(llm)
    if not isinstance(llm, BaseLanguageModel):
        raise ValueError(
            "llm must be a ragspec ChatRagSpec, RagSpecLLM, LocalModel or RemoteModel, or a LangChain chat model "
            f"or LLM (BaseChatModel, BaseLLM), got {type(llm).__name__}"
        )
    if follow_up == "rewrite":
        raise ValueError("follow_up='rewrite' needs a ragspec model (it rewrites with the generator); use 'combine'")
    return LangChainAnswering(llm)
