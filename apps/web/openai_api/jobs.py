"""Preparing a ``/v1`` request for the generator: the prompt's token ids, the ``GenerationConfig`` and the
references as one ``ragspec.chat_request.ChatRequest`` (as ``ChatRagSpec`` builds it), a retrieval
request's passages, and the grammar, compiled once the request holds the model."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Union

from fastapi import Request

from apps.web.openai_api.errors import OpenAIError, checked, first_line
from apps.web.openai_api.parse import ApiRequest, response_format_kind
from apps.web.queue import Ticket
from apps.web.retrieval_api import Documents, RetrievalError, Retrieved, retrieve
from ragspec.chat_request import ChatRequest, chat_prompt
from ragspec.engine.config import DEFAULT_MAX_TOKENS, GenerationConfig, request_config

Event = Union[str, tuple[str, Any], Any]
"""What a job's generation yields: ``("stats", live stats)``, text deltas, then its result."""


@dataclass(frozen=True)
class ApiSettings:
    """The limits of the ``/v1`` routes (``AppConfig`` builds them)."""

    model_id: str
    """The name clients send as ``model``; the model's own name (the generator's ``model_name``) is
    accepted too, and ``/v1/models`` lists both (one entry each, as vLLM lists its served names)."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Most new tokens per request; also the default when a request sets none."""
    queue_timeout_s: float = 120.0
    compile_timeout_s: float = 30.0
    """Longest a request's grammar (``response_format`` or ``tools``) may take to compile, while it holds the model."""
    answer_timeout_s: float = 300.0
    embedding_model: str | None = None
    """The name ``/v1/embeddings`` answers to (``/v1/models`` lists it after the chat model); None: no embeddings."""
    shared_prefix_cache: bool = False
    """Every request reuses every other's prompt prefixes (``ragspec serve --shared-prefix-cache``); by
    default only requests with the same ``cache_salt`` do (``request_scope``)."""


@dataclass(frozen=True)
class Job:
    """A checked request, ready for the generator."""

    request: ApiRequest
    chat: ChatRequest
    """The prompt's token ids, the config (its grammar once ``compile_constraint`` ran) and the drafting references."""
    retrieved: Retrieved | None = None
    """A retrieval request's passages and answer stream (its prompt is the pipeline's: ``chat.prompt`` is empty)."""

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.chat.prompt)  # token ids: prepare encodes a text prompt


def prepare(generator: Any, request: ApiRequest, settings: ApiSettings, documents: Documents | None = None) -> Job:
    """The request's ``ChatRequest``; 400 for what does not fit.
    A retrieval request retrieves over ``documents`` here (``retrieval_api.retrieve``).

    Runs in a worker thread (tokenizing a long prompt takes a while).
    """
    if request.prediction is not None and not hasattr(generator, "drafter"):
        raise OpenAIError(
            400,
            "prediction needs ragspec's own engine, which drafts from it and counts what it accepted; this server "
            "generates on another server (--engine vllm or --generator-url): send the text as extra_body references",
            param="prediction",
            code="unsupported_parameter",
        )
    tokenizer = generator.tokenizer
    vocab = len(tokenizer)
    if any(not isinstance(ref, str) and any(t >= vocab for t in ref) for ref in request.references):
        raise OpenAIError(400, f"reference token ids must be in [0, {vocab})", param="references")
    prompt_ids = _prompt_ids(generator, request, vocab)
    context = generator.context_length
    room = context - len(prompt_ids)
    asked = request.options.get("max_tokens")
    if room < 1 or (asked is not None and asked > room):
        wanted = f" and {asked} for the completion" if asked is not None else ""
        raise OpenAIError(
            400,
            f"this model's maximum context length is {context} tokens; the prompt has {len(prompt_ids)}{wanted}: "
            "shorten the prompt" + (" or lower max_tokens" if asked is not None else ""),
            param="messages" if request.chat else "prompt",
            code="context_length_exceeded",
        )
    if asked is not None and asked > settings.max_tokens:
        raise OpenAIError(
            400, f"max_tokens must be at most {settings.max_tokens} on this server (ragspec serve --max-tokens)", param="max_tokens"
        )
    options = {"max_tokens": min(settings.max_tokens, room), "temperature": 0.0, **request.options}
    config = generator.config if isinstance(getattr(generator, "config", None), GenerationConfig) else GenerationConfig()
    chat = ChatRequest(prompt_ids, checked(lambda: request_config(config, options)), request.drafting_references)
    if request.retrieval is None:
        return Job(request, chat)
    try:
        retrieved = retrieve(documents, request.retrieval, request.prompt, request.options)  # type: ignore[arg-type]
    except RetrievalError as e:
        raise OpenAIError(400, str(e), param=e.param) from e
    except ValueError as e:  # the question does not fit the context with max_tokens (DocumentQA's message says so)
        raise OpenAIError(400, str(e), param="messages", code="context_length_exceeded") from e
    return Job(request, chat, retrieved)


def _prompt_ids(generator: Any, request: ApiRequest, vocab: int) -> list[int]:
    """The prompt's token ids: a chat's as ``ChatRagSpec`` builds them (``ragspec.chat_request.chat_prompt``),
    a completion's text encoded, its ids checked; none for retrieval (the pipeline lays out its prompt)."""
    if request.retrieval is not None:
        return []
    if request.chat:
        json_mode = response_format_kind(request.response_format) == "json_object" and not _calls_tools(request)
        return chat_prompt(generator.tokenizer, request.prompt, request.tools, json_mode)  # type: ignore[arg-type]
    if isinstance(request.prompt, str):
        return generator.encode(request.prompt, special_tokens=True)
    if any(not 0 <= t < vocab for t in request.prompt):  # type: ignore[operator]
        raise OpenAIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(request.prompt)  # type: ignore[arg-type]


def _calls_tools(request: ApiRequest) -> bool:
    return request.tools is not None and request.tools.calls


def served_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """A client's JSON Schema as the grammar holds the answer to: strings without a bound get
    ``maxLength`` ``ragspec.engine.tool_calls.STRING_LIMIT`` and objects take their declared properties
    only (``bounded_strings``, ``closed_objects``, as ``ChatRagSpec.with_structured_output`` does).
    Every answer is still valid against the schema sent; a small model that repeats itself inside
    a string then still finishes the object instead of filling ``max_tokens``."""
    from ragspec.engine.tool_calls import bounded_strings, closed_objects

    return bounded_strings(closed_objects(schema))


def response_constraint(value: object) -> Any:
    """``response_format`` as a ``ragspec.engine.constraints.Constraint`` (None for text); 400 when it cannot be one
    (``ragspec.engine.constraints.response_format_constraint`` reads it, as for the LangChain classes)."""
    if value is None:
        return None
    from ragspec.engine.constraints import ConstraintError, response_format_constraint

    try:
        return response_format_constraint(value, served_schema)
    except ConstraintError as e:
        raise OpenAIError(400, f"response_format: {first_line(str(e))}", param="response_format") from e


def request_constraint(request: ApiRequest) -> Any:
    """The grammar the request's answer must follow: the tool-call format when tools are sent (for
    ``tool_choice: "none"`` without a ``response_format``, text that does not open with markup: the
    default model otherwise echoes a tool result's ``<tool_response>`` wrapper), else its
    ``response_format`` (None: free text); 400 naming the parameter when it cannot be built."""
    from ragspec.engine.tool_calls import ToolError

    tools = request.tools
    if tools is not None and (tools.calls or request.response_format is None):
        try:
            return tools.constraint(served_schema)
        except (ToolError, ValueError) as e:
            raise OpenAIError(400, first_line(str(e)), param="tools") from e
        except RecursionError:
            raise OpenAIError(400, "a tool's parameters schema is nested too deeply", param="tools") from None
    return response_constraint(request.response_format)


async def compile_constraint(job: Job, ticket: Ticket, timeout_s: float) -> Job:
    """``job`` with its grammar compiled (``request_constraint``), in a worker thread while ``ticket``
    holds the model, so compiling a client's schema counts against the queue like generating; a
    grammar that takes longer than ``timeout_s`` is a 400, and the slot stays taken until the
    abandoned compile has ended (``Ticket.keep_until_done``)."""
    request = job.request
    if request.tools is None and response_format_kind(request.response_format) is None:
        return job
    work = asyncio.ensure_future(asyncio.to_thread(request_constraint, request))
    ticket.keep_until_done(work)
    try:
        constraint = await asyncio.wait_for(asyncio.shield(work), timeout_s)
    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11 on
        param = "tools" if _calls_tools(request) else "response_format"
        raise OpenAIError(400, f"{param}: the grammar did not compile within {timeout_s:g} s; simplify it", param=param) from None
    return replace(job, chat=job.chat.constrained(constraint))


def request_scope(request: Request, api_request: ApiRequest, settings: ApiSettings) -> str:
    """The cache scope of a ``/v1`` request (``ragspec.engine.tenancy``). One API key serves every client
    of a server, so it cannot tell them apart: a client that sends a ``cache_salt`` (a secret of its
    own, as vLLM asks) shares its prefixes with requests that send the same salt and key; one that
    sends none gets a scope of its own and reuses nothing. ``shared_prefix_cache``: all share one."""
    from ragspec.engine.tenancy import SHARED, private_scope, scoped_key

    if settings.shared_prefix_cache:
        return SHARED
    if api_request.cache_salt is None:
        return private_scope()
    return scoped_key("v1", request.headers.get("authorization", ""), api_request.cache_salt)


def job_events(generator: Any, job: Job) -> Generator[Event, None, None]:
    """The live stats, the text deltas, then the result (for a worker thread, inside the request's cache scope)."""
    if job.retrieved is not None:
        yield from job.retrieved.events()
        return
    with job.chat.stream(generator) as stream:
        yield ("stats", stream.stats)
        yield from stream
    yield stream.result
