"""The OpenAI-compatible API of ``ragspec serve``: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

Any OpenAI client (the ``openai`` package, LangChain's ``ChatOpenAI``, curl, editors, agents)
talks to the served model through these routes; docs/serving.md is the reference. In short:

- Requests map onto one ``GenerationConfig``: ``max_tokens`` / ``max_completion_tokens``,
  ``temperature`` (default 0, greedy: ragspec's default, not OpenAI's 1), ``top_p``, ``seed``,
  ``stop``, ``frequency_penalty``, ``presence_penalty``, and the extensions ``top_k``,
  ``repeat_penalty``, ``repeat_last_n`` (llama.cpp's names), ``repetition_stop``, ``speculation`` (``false``, ``{"enabled": false}`` or ``{"max_draft": 4}``) and ``references``
  (passages the drafter copies from: ``extra_body={"references": [...]}`` in the ``openai`` client), and
  vLLM's ``cache_salt``: only requests with the same salt reuse each other's prompt prefixes
  (``request_scope``; docs/threat-model.md).
  ``response_format`` (``json_object``, ``json_schema``) constrains the output with a grammar
  (``ragspec.engine.constraints``), on both routes. ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
  list functions in the system turn and constrain the answer to well-formed calls with the same
  grammar as ``ChatRagSpec.bind_tools`` (``ragspec.engine.tool_calls``); calls come back as OpenAI's
  ``tool_calls`` (whole, and in stream deltas as each call completes), and ``tool`` messages and
  assistant ``tool_calls`` enter the conversation. ``retrieval`` (chat) answers the conversation over the
  server's documents as ``DocumentQA`` does (``apps.web.retrieval_api``). ``prediction`` (OpenAI's Predicted
  Outputs, ``{"type": "content", "content": ...}``) is drafted from as one more reference: the output is
  unchanged, and ``usage.completion_tokens_details`` counts the prediction's drafted tokens the model
  accepted and rejected (``prediction_details``). A bad value is a 400 naming the parameter; so is
  anything ragspec does not do yet (``n`` > 1, logprobs, ``logit_bias``, legacy ``functions``) and any
  argument OpenAI does not define.
- Every response has ``usage``, and a ``ragspec`` object beside the standard fields with the
  speculative statistics (tokens per forward, acceptance, by draft source), the finish reason in
  ragspec's terms (``eos``, ``stop``, ``length`` or ``repetition``) and the seconds spent in the queue;
  figures the engine did not measure are left out (behind vLLM: forwards, by source, draft time), never
  sent as zeros. A request that drafted also has vLLM's per-request ``metrics.speculative_decoding``
  (``GenerationStats.speculative_decoding``), from either engine. Streams (``stream: true``) send both
  in the chunk that carries the ``finish_reason``; with ``stream_options: {"include_usage": true}``
  one more chunk carries ``usage``.
- Errors are OpenAI error objects ``{"error": {"message", "type", "param", "code"}}`` with
  OpenAI's status codes, the security guard's own rejections included (``openai_error_body``).
- Generation goes through the app's one ``ModelQueue``, shared with the web page's questions: a
  full queue is a 429 with ``Retry-After``, a request that waited ``queue_timeout_s`` a 503 with
  ``Retry-After``, an answer longer than ``answer_timeout_s`` is cut (``finish_reason: "length"``,
  ``ragspec.finish_reason: "timeout"``), and a client that disconnects, streaming or not, stops
  its generation and frees the model at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, Union

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from apps.web.queue import ModelQueue, QueueFullError, QueueTimeoutError, Ticket
from apps.web.retrieval_api import Documents, Retrieval, RetrievalError, Retrieved, parse_retrieval, retrieve
from apps.web.retrieval_api import extension as retrieval_extension
from apps.web.security import plain_error
from apps.web.streaming import ClientGone, EventStream, unless_gone
from ragspec.bridge import iterate_in_thread, next_before
from ragspec.engine.config import DEFAULT_MAX_TOKENS, GenerationConfig, GenerationConfigError, request_config, request_max_tokens
from ragspec.engine.tenancy import in_cache_scope

logger = logging.getLogger(__name__)

PREFIX = "/v1/"
MAX_STOP = 16
MAX_REFERENCES = 64
MAX_CACHE_SALT = 1024
"""Longest ``cache_salt`` (vLLM's limit)."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    410: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    503: "server_error",
}
"""OpenAI error ``type`` by status (500 and anything else: ``server_error``)."""
_GUARD_CODES = {401: "invalid_api_key", 413: "request_too_large"}


class Source(Protocol):
    """What the routes generate with: ``ragspec.registry.LocalModel`` or ``ragspec.remote.RemoteModel``."""

    def load(self, model: str | None = None) -> Any: ...


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


class OpenAIError(Exception):
    """An error answered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_object(self.status, self.message, param=self.param, code=self.code),
            status_code=self.status,
            headers=self.headers,
        )


def error_object(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
    from ragspec.engine.text import clean_text

    return {
        "error": {
            "message": clean_text(message),
            "type": ERROR_TYPES.get(status, "server_error"),
            "param": None if param is None else clean_text(param),  # a name sent with a lone surrogate in it
            "code": code,
        }
    }


def openai_error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """The security guard's error hook: OpenAI error objects under ``/v1/``, the web app's shape elsewhere."""
    if path.startswith(PREFIX):
        return error_object(status, message, code=_GUARD_CODES.get(status))
    return plain_error(path, status, message)


# -- requests ---------------------------------------------------------------------------------------

_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "response_format",
    "top_k", "repeat_penalty", "repeat_last_n", "repetition_stop", "speculation", "references",  # ragspec's extensions (response_format on completions, as vLLM)
    "cache_salt",  # vLLM's
    "prediction",
}  # fmt: skip
_CHAT_ONLY = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
    "function_call", "parallel_tool_calls", "metadata", "store", "service_tier", "modalities",
    "retrieval",  # ragspec's extension
}  # fmt: skip
_COMPLETION_ONLY = {"prompt", "echo", "suffix", "best_of"}
Prompt = Union[list[dict[str, str]], str, list[int]]
T = TypeVar("T")


@dataclass(frozen=True)
class ApiRequest:
    """One request's fields, checked and in ragspec's terms."""

    chat: bool
    model: str
    prompt: Prompt
    """Chat: role/content turns. Completions: text or token ids."""
    options: dict[str, Any]
    """``GenerationConfig`` fields the request sets (``max_tokens`` only when given)."""
    references: tuple[str | list[int], ...]
    stream: bool
    include_usage: bool
    tools: tuple[Any, ...] = ()
    """``ragspec.engine.tool_calls.Tool``s the model may call (chat only)."""
    tool_choice: str = "auto"
    """``ragspec.engine.tool_calls.check_choice``'s spelling: ``"auto"``, ``"any"``, ``"none"`` or a tool's name."""
    parallel_tool_calls: bool = True
    response_format: object = None
    """Checked in shape only; compiled, like the tools' grammar, once the request holds the model (``compile_constraint``)."""
    retrieval: Retrieval | None = None
    """Answer over the server's documents (chat only; ``apps.web.retrieval_api``)."""
    cache_salt: str | None = None
    """vLLM's ``cache_salt``: requests that send the same one (with the same API key) reuse each other's prompt prefixes."""
    prediction: str | None = None
    """Predicted Outputs' text: drafted from as the reference after ``references``."""

    @property
    def drafting_references(self) -> tuple[str | list[int], ...]:
        """What the drafter copies from: ``references``, then the prediction."""
        return self.references if self.prediction is None else (*self.references, self.prediction)


def parse_request(body: object, *, chat: bool) -> ApiRequest:
    """Check a request body; ``OpenAIError`` (400) names the first bad parameter."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    known = _COMMON | (_CHAT_ONLY if chat else _COMPLETION_ONLY)
    for name in body:
        if name not in known:
            raise OpenAIError(400, f"unrecognized request argument supplied: {str(name)[:100]}", param=str(name)[:100])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "model is required: a model name from GET /v1/models", param="model")
    _unsupported(body, chat)
    prompt = _messages(body.get("messages")) if chat else _prompt(body.get("prompt"))
    options: dict[str, Any] = {}
    param = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(param) is not None:
        options["max_tokens"] = _checked(lambda: request_max_tokens(body[param], param))
    for name in ("temperature", "top_p", "seed", "top_k", "frequency_penalty", "presence_penalty", "repeat_penalty",
                 "repeat_last_n", "repetition_stop", "speculation"):  # fmt: skip
        if body.get(name) is not None:
            options[name] = body[name]
    _checked(lambda: GenerationConfig().merged(options))  # 400 naming the first bad option, before the request queues
    if body.get("stop") is not None:
        options["stop"] = _stop(body["stop"])
    response_format = body.get("response_format")
    format_kind = _response_format_kind(response_format)
    tools, tool_choice, parallel = _tools(body) if chat else ((), "auto", True)
    if tools and tool_choice != "none" and format_kind is not None:
        raise OpenAIError(400, "a request cannot have both tools and a response_format: send one of them", param="response_format")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(400, f"stream must be true or false, got {stream!r}", param="stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise OpenAIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        if not isinstance(stream_options, dict) or not isinstance(stream_options.get("include_usage", False), bool):
            raise OpenAIError(400, 'stream_options must be like {"include_usage": true}', param="stream_options")
        include_usage = bool(stream_options.get("include_usage", False))
    try:
        retrieval = parse_retrieval(body.get("retrieval"), body.get("messages"), tools=bool(tools),
                                    response_format=format_kind is not None) if chat else None  # fmt: skip
    except RetrievalError as e:
        raise OpenAIError(400, str(e), param=e.param) from e
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT):
        raise OpenAIError(400, f"cache_salt must be a string of 1 to {MAX_CACHE_SALT} characters", param="cache_salt")
    prediction = _prediction(body.get("prediction"))
    if prediction is not None and retrieval is not None:
        raise OpenAIError(400, "prediction cannot be combined with retrieval (the answer's passages are its references)",
                          param="prediction")
    return ApiRequest(
        chat, model, prompt, options, _references(body.get("references")), stream, include_usage, tools, tool_choice, parallel,
        response_format, retrieval, salt, prediction,
    )


def _checked(build: Callable[[], T]) -> T:
    """``build()``, its ``GenerationConfigError`` answered as a 400 that names the parameter."""
    try:
        return build()
    except GenerationConfigError as e:
        raise OpenAIError(400, str(e), param=e.param) from e


def _unsupported(body: Mapping[str, Any], chat: bool) -> None:
    """A 400 for each OpenAI feature ragspec does not have (yet), naming it."""

    def refuse(param: str, message: str) -> None:
        raise OpenAIError(400, message, param=param, code="unsupported_parameter")

    n = body.get("n")
    if n is not None and n != 1:
        refuse("n", f"n must be 1 (got {n!r}): ragspec decodes one sequence per request; send separate requests instead")
    if body.get("best_of") not in (None, 1):
        refuse("best_of", "best_of is not supported: ragspec decodes one sequence per request")
    if body.get("echo"):
        refuse("echo", "echo is not supported: the response holds the completion only")
    if body.get("suffix"):
        refuse("suffix", "suffix (insertion) is not supported")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        refuse("logprobs", "logprobs are not supported yet")
    if body.get("logit_bias"):
        refuse("logit_bias", "logit_bias is not supported")
    if not chat:
        return
    for legacy, current in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(legacy) is not None:
            refuse(legacy, f"{legacy} (OpenAI's deprecated form) is not supported: send {current} instead")
    if body.get("modalities") not in (None, ["text"]):
        refuse("modalities", 'only text output is supported: modalities ["text"]')


def response_constraint(value: object) -> Any:
    """``response_format`` as a ``ragspec.engine.constraints.Constraint`` (None for text); 400 when it cannot be one
    (``ragspec.engine.constraints.response_format_constraint`` reads it, as for the LangChain classes)."""
    if value is None:
        return None
    from ragspec.engine.constraints import ConstraintError, response_format_constraint

    try:
        return response_format_constraint(value, served_schema)
    except ConstraintError as e:
        raise OpenAIError(400, f"response_format: {_first_line(str(e))}", param="response_format") from e


def _response_format_kind(value: object) -> str | None:
    """``response_format``'s kind (None: text), its shape checked without compiling anything; 400 for a bad shape."""
    from ragspec.engine.constraints import ConstraintError, response_format_kind

    try:
        return None if value is None else response_format_kind(value)
    except ConstraintError as e:
        raise OpenAIError(400, f"response_format: {e}", param="response_format") from e


def _first_line(message: str, limit: int = 300) -> str:
    """An engine's message without what follows its first line (a Rust panic's backtrace, build paths)."""
    line = message.strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def served_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """A client's JSON Schema as the grammar holds the answer to: strings without a bound get
    ``maxLength`` ``ragspec.engine.tool_calls.STRING_LIMIT`` and objects take their declared properties
    only (``bounded_strings``, ``closed_objects``, as ``ChatRagSpec.with_structured_output`` does).
    Every answer is still valid against the schema sent; a small model that repeats itself inside
    a string then still finishes the object instead of filling ``max_tokens``."""
    from ragspec.engine.tool_calls import bounded_strings, closed_objects

    return bounded_strings(closed_objects(schema))


def _tools(body: Mapping[str, Any]) -> tuple[tuple[Any, ...], str, bool]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` as ragspec ``Tool``s, a choice and a flag."""
    from ragspec.engine.tool_calls import ToolError, openai_tool, parse_choice

    value, choice = body.get("tools"), body.get("tool_choice")
    if value is not None and not isinstance(value, list):
        raise OpenAIError(400, "tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", param="tools")
    tools = []
    for i, item in enumerate(value or []):
        try:
            tools.append(openai_tool(item))
        except ToolError as e:
            raise OpenAIError(400, f"tools[{i}]: {e}", param=f"tools[{i}]") from e
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        raise OpenAIError(400, "two tools have the same name: a call names its tool", param="tools")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise OpenAIError(400, f"tool_choice must be a string or an object, got {choice!r}", param="tool_choice")
    if not tools and choice not in (None, "none", "auto"):
        raise OpenAIError(400, f"tool_choice {choice!r} needs tools: send the tools it may call", param="tool_choice")
    try:
        choice = parse_choice(choice, tools)
    except ToolError as e:
        raise OpenAIError(400, str(e), param="tool_choice") from e
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise OpenAIError(400, f"parallel_tool_calls must be true or false, got {parallel!r}", param="parallel_tool_calls")
    return tuple(tools), choice, parallel


def _messages(value: object) -> list[dict[str, str]]:
    """The turns as the chat template takes them; tool calls and results in ``ragspec.engine.tool_calls``' form."""
    from ragspec.engine.text import clean_text
    from ragspec.engine.tool_calls import call_turn, result_turn

    if not isinstance(value, list) or not value:
        raise OpenAIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    turns = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise OpenAIError(400, f"{where} must be an object with role and content", param=where)
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise OpenAIError(
                400, f"{where}.role {role!r} is not supported: use system, developer, user, assistant or tool",
                param=f"{where}.role",
            )  # fmt: skip
        if message.get("function_call"):
            raise OpenAIError(400, f"{where}.function_call (OpenAI's deprecated form) is not supported: send tool_calls", param=where)
        calls = _message_calls(message.get("tool_calls"), where) if role == "assistant" else []
        content = message.get("content")
        if content is None and (calls or role == "tool"):
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise OpenAIError(400, f"{where}.content: only text parts are supported, got {kind!r}", param=f"{where}.content")
            content = "".join(parts)
        if not isinstance(content, str):
            raise OpenAIError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
        content = clean_text(content)
        if role == "tool":
            turns.append(result_turn(content))
        elif calls:
            turns.append(call_turn(content, calls))
        else:
            turns.append({"role": role, "content": content})
    return turns


def _message_calls(value: object, where: str) -> list[tuple[str, dict[str, Any]]]:
    """An assistant message's ``tool_calls`` as (name, arguments) pairs."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise OpenAIError(400, f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    calls = []
    for j, call in enumerate(value):
        here = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name or not isinstance(arguments, str):
            raise OpenAIError(
                400, f'{here} must be {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": "<JSON text>"}}}}',
                param=here,
            )  # fmt: skip
        try:
            args = json.loads(arguments or "{}")
        except (json.JSONDecodeError, RecursionError) as e:
            raise OpenAIError(400, f"{here}.function.arguments is not JSON text: {e}", param=here) from None
        if not isinstance(args, dict):
            raise OpenAIError(400, f"{here}.function.arguments must be a JSON object", param=here)
        calls.append((name, args))
    return calls


def _prompt(value: object) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        if not value:
            raise OpenAIError(400, "prompt is empty", param="prompt")
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return list(value)
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise OpenAIError(400, "a batch of prompts is not supported: send one prompt per request", param="prompt")
    raise OpenAIError(400, "prompt must be a non-empty string or a list of token ids", param="prompt")


def _stop(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise OpenAIError(400, "stop must be a non-empty string or a list of them", param="stop")
    if len(items) > MAX_STOP:
        raise OpenAIError(400, f"stop takes at most {MAX_STOP} strings, got {len(items)}", param="stop")
    return tuple(items)


def _references(value: object) -> tuple[str | list[int], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_REFERENCES:
        raise OpenAIError(400, f"references must be a list of at most {MAX_REFERENCES} passages", param="references")
    out: list[str | list[int]] = []
    for ref in value:
        if isinstance(ref, str):
            out.append(ref)
        elif isinstance(ref, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ref):
            out.append(list(ref))
        else:
            raise OpenAIError(400, "each reference must be a string or a list of token ids", param="references")
    return tuple(out)


def _prediction(value: object) -> str | None:
    """OpenAI's ``prediction``: ``{"type": "content", "content": str or [{"type": "text", "text": str}, ...]}``."""
    if value is None:
        return None
    shape = 'prediction must be {"type": "content", "content": "..."} (content: a string or a list of text parts)'
    if not isinstance(value, dict) or value.get("type") != "content" or set(value) - {"type", "content"}:
        raise OpenAIError(400, shape, param="prediction")
    content = value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and set(p) == {"type", "text"}
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise OpenAIError(400, shape, param="prediction")


# -- prompt and config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A checked request, ready for the generator."""

    request: ApiRequest
    prompt_ids: list[int]
    config: GenerationConfig
    retrieved: Retrieved | None = None
    """A retrieval request's passages and answer stream (its prompt is the pipeline's: ``prompt_ids`` is empty)."""


def prepare(generator: Any, request: ApiRequest, settings: ApiSettings, documents: Documents | None = None) -> Job:
    """The prompt's token ids and the request's ``GenerationConfig``; 400 for what does not fit.
    A retrieval request retrieves over ``documents`` here (``retrieval_api.retrieve``).

    Runs in a worker thread (tokenizing a long prompt takes a while).
    """
    from ragspec.prompts import chat_prompt_ids

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
    options = dict(request.options)
    if request.retrieval is not None:
        prompt_ids = []  # the pipeline lays out the prompt and fits the passages to the context
    elif request.chat:
        prompt_ids = chat_prompt_ids(tokenizer, _chat_turns(request))  # as ChatRagSpec and the pipeline build it
    elif isinstance(request.prompt, str):
        prompt_ids = generator.encode(request.prompt, special_tokens=True)
    else:
        if any(not 0 <= t < vocab for t in request.prompt):
            raise OpenAIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompt_ids = list(request.prompt)
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
        param = "max_tokens"
        raise OpenAIError(
            400, f"max_tokens must be at most {settings.max_tokens} on this server (ragspec serve --max-tokens)", param=param
        )
    options = {"max_tokens": min(settings.max_tokens, room), "temperature": 0.0, **options}
    config = generator.config if isinstance(getattr(generator, "config", None), GenerationConfig) else GenerationConfig()
    config = _checked(lambda: request_config(config, options))
    if request.retrieval is not None:
        try:
            retrieved = retrieve(documents, request.retrieval, request.prompt, request.options)  # type: ignore[arg-type]
        except RetrievalError as e:
            raise OpenAIError(400, str(e), param=e.param) from e
        except ValueError as e:  # the question does not fit the context with max_tokens (DocumentQA's message says so)
            raise OpenAIError(400, str(e), param="messages", code="context_length_exceeded") from e
        return Job(request, prompt_ids, config, retrieved)
    return Job(request, prompt_ids, config)


JSON_INSTRUCTION = "Answer with one JSON object."
"""Added to the system turn under ``response_format: {"type": "json_object"}`` when no message
mentions JSON (OpenAI asks the client to say so; ragspec does it for a client that did not)."""


def _chat_turns(request: ApiRequest) -> list[dict[str, str]]:
    """The conversation with the tools' listing (``ragspec.engine.tool_calls.system_prompt``) or the JSON instruction."""
    from ragspec.engine import tool_calls

    assert isinstance(request.prompt, list)
    turns: list[dict[str, str]] = list(request.prompt)  # type: ignore[arg-type]
    if request.tools:
        turns = tool_calls.with_system_text(turns, tool_calls.system_prompt(request.tools, request.tool_choice))
    json_mode = _response_format_kind(request.response_format) == "json_object" and not _calls_tools(request)
    if json_mode and not any("json" in t["content"].lower() for t in turns):
        turns = tool_calls.with_system_text(turns, JSON_INSTRUCTION)
    return turns


def _calls_tools(request: ApiRequest) -> bool:
    return bool(request.tools) and request.tool_choice != "none"


def request_constraint(request: ApiRequest) -> Any:
    """The grammar the request's answer must follow: the tool-call format when tools are sent (for
    ``tool_choice: "none"`` without a ``response_format``, text that does not open with markup: the
    default model otherwise echoes a tool result's ``<tool_response>`` wrapper), else its
    ``response_format`` (None: free text); 400 naming the parameter when it cannot be built."""
    from ragspec.engine import tool_calls

    if _calls_tools(request) or (request.tools and request.response_format is None):
        try:
            bounded = [tool_calls.Tool(t.name, t.description, served_schema(t.parameters)) for t in request.tools]
            return tool_calls.tool_call_constraint(bounded, request.tool_choice, request.parallel_tool_calls)
        except (tool_calls.ToolError, ValueError) as e:
            raise OpenAIError(400, _first_line(str(e)), param="tools") from e
        except RecursionError:
            raise OpenAIError(400, "a tool's parameters schema is nested too deeply", param="tools") from None
    return response_constraint(request.response_format)


async def compile_constraint(job: Job, ticket: Ticket, timeout_s: float) -> Job:
    """``job`` with its grammar compiled (``request_constraint``), in a worker thread while ``ticket``
    holds the model, so compiling a client's schema counts against the queue like generating; a
    grammar that takes longer than ``timeout_s`` is a 400, and the slot stays taken until the
    abandoned compile has ended (``Ticket.keep_until_done``)."""
    request = job.request
    if not request.tools and _response_format_kind(request.response_format) is None:
        return job
    work = asyncio.ensure_future(asyncio.to_thread(request_constraint, request))
    ticket.keep_until_done(work)
    try:
        constraint = await asyncio.wait_for(asyncio.shield(work), timeout_s)
    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11 on
        param = "tools" if _calls_tools(request) else "response_format"
        raise OpenAIError(400, f"{param}: the grammar did not compile within {timeout_s:g} s; simplify it", param=param) from None
    return job if constraint is None else replace(job, config=job.config.merged({"constraint": constraint}))


# -- responses --------------------------------------------------------------------------------------


def _finish(reason: str) -> str:
    """ragspec's finish reason in OpenAI's terms."""
    return "length" if reason in ("length", "timeout") else "stop"


def _usage(stats: Any, prompt_tokens: int, prediction: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with a ``prediction`` (its index among the drafting references) its details too."""
    completion = int(getattr(stats, "new_tokens", 0))
    prompt = int(getattr(stats, "prompt_tokens", 0) or prompt_tokens)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if prediction is not None:
        usage["completion_tokens_details"] = prediction_details(stats, prediction)
    return usage


def prediction_details(stats: Any, index: int) -> dict[str, int]:
    """Predicted Outputs' counts from ragspec's drafting stats of the prediction (reference ``index``):
    ``accepted_prediction_tokens``, tokens copied from the prediction as drafts that the model verified
    and kept; ``rejected_prediction_tokens``, tokens copied from it that the model verified and refused
    (each draft stops at the first refused token, so these are the refused token and what followed it in
    that draft). Prediction tokens never proposed (no match, or the policy chose a shorter draft) count in
    neither; neither changes ``completion_tokens``, which counts the output's tokens."""
    drafts = getattr(stats, "by_reference", {}).get(index)
    accepted = drafts.accepted if drafts is not None else 0
    drafted = drafts.drafted if drafts is not None else 0
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}


def _ragspec(stats: Any, finish_reason: str, ticket: Ticket, model_name: str) -> dict[str, Any]:
    shown = stats.reported() if hasattr(stats, "reported") else {}
    return {**shown, "finish_reason": finish_reason, "queue_s": round(ticket.waited_s, 3), "model": model_name}


def _metrics(stats: Any) -> dict[str, Any]:
    """vLLM's per-request ``metrics`` member, or nothing where no drafting figures exist."""
    drafting = stats.speculative_decoding() if hasattr(stats, "speculative_decoding") else None
    return {"metrics": {"speculative_decoding": drafting}} if drafting is not None else {}


def sse_data(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


_Event = Union[str, Any]


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


def _events(generator: Any, job: Job) -> Generator[_Event, None, None]:
    """The live stats, the text deltas, then the result (for a worker thread, inside the request's cache scope)."""
    if job.retrieved is not None:
        yield from job.retrieved.events()
        return
    with generator.stream(job.prompt_ids, job.config, references=job.request.drafting_references) as stream:
        yield ("stats", stream.stats)
        yield from stream
    yield stream.result


def add_openai_routes(
    app: FastAPI, *, source: Source, queue: ModelQueue, settings: ApiSettings, documents: Documents | None = None
) -> None:
    """Add the ``/v1`` routes to ``app``; they generate with ``source`` through ``queue``, and retrieval
    requests retrieve over ``documents`` (None: they are refused)."""

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        """An unknown route or method: an OpenAI error under ``/v1/``, FastAPI's usual answer elsewhere."""
        if request.url.path.startswith(PREFIX):
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
            body = error_object(exc.status_code, str(exc.detail), code=code)
            return JSONResponse(body, status_code=exc.status_code, headers=dict(exc.headers or {}))
        return await http_exception_handler(request, exc)

    async def generator() -> Any:
        return await asyncio.to_thread(source.load)

    def names(gen: Any) -> list[str]:
        """What clients may send as ``model``: the server's name for it, then the model's own."""
        return list(dict.fromkeys((settings.model_id, gen.model_name)))

    def check_model(model: str, gen: Any) -> None:
        if model not in names(gen):
            served = " or ".join(repr(n) for n in names(gen))
            raise OpenAIError(
                404, f"the model {model[:100]!r} does not exist here: this server serves {served}",
                param="model", code="model_not_found",
            )  # fmt: skip

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        gen = await generator()
        entries = [model_entry(gen, name) for name in names(gen)]
        return {"object": "list", "data": [*entries, *([embedding_entry()] if settings.embedding_model else [])]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        if settings.embedding_model and model == settings.embedding_model:
            return embedding_entry()
        gen = await generator()
        check_model(model, gen)
        return model_entry(gen, model)

    def embedding_entry() -> dict[str, Any]:
        return {"id": settings.embedding_model, "object": "model", "created": 0, "owned_by": "ragspec",
                "ragspec": {"kind": "embeddings"}}  # fmt: skip

    def model_entry(gen: Any, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "ragspec",
            "max_model_len": gen.context_length,
            "ragspec": {"name": gen.model_name, "max_tokens": settings.max_tokens},
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await respond(request, parse_request(await _json_body(request), chat=True))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await respond(request, parse_request(await _json_body(request), chat=False))

    async def respond(request: Request, api_request: ApiRequest) -> Response:
        gen = await generator()
        check_model(api_request.model, gen)
        job = await asyncio.to_thread(prepare, gen, api_request, settings, documents)
        try:
            ticket = queue.ticket()
        except QueueFullError as e:
            raise OpenAIError(429, str(e), code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from e
        try:
            await unless_gone(request, ticket.wait(settings.queue_timeout_s))
        except QueueTimeoutError as e:
            raise OpenAIError(503, str(e), code="queue_timeout", headers={"Retry-After": str(e.retry_after_s)}) from e
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the place in the queue is given back
        except BaseException:
            ticket.release()
            raise
        try:
            job = await unless_gone(request, compile_constraint(job, ticket, settings.compile_timeout_s))
        except ClientGone:
            ticket.release()
            return Response(status_code=499)
        except BaseException:
            ticket.release()
            raise
        scope = request_scope(request, api_request, settings)
        events = iterate_in_thread(lambda: in_cache_scope(scope, lambda: _events(gen, job)))
        answer = Completion(job, ticket, events, gen.model_name, time.monotonic() + settings.answer_timeout_s)
        if api_request.stream:
            return EventStream(
                answer.chunks(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
                on_close=ticket.release,
            )
        try:
            return JSONResponse(await unless_gone(request, answer.whole()))
        except ClientGone:
            return Response(status_code=499)
        finally:
            await events.aclose()
            ticket.release()


class Completion:
    """One generation of a ``/v1`` request, collected whole or as stream chunks."""

    def __init__(self, job: Job, ticket: Ticket, events: AsyncIterator[_Event], model_name: str, deadline: float) -> None:
        self.job = job
        self.ticket = ticket
        self.events = events
        self.model_name = model_name
        self.deadline = deadline
        self.id = ("chatcmpl-" if job.request.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.stats: Any = None
        self.result: Any = None
        """The generation's result: a ``GenerationResult``, or a retrieval request's ``ragspec.answers.Answer``."""
        self.text = ""

    async def _next(self) -> _Event | None:
        """The next event; None at the end; ``TimeoutError`` past the deadline."""
        try:
            return await next_before(self.events, self.deadline)
        except StopAsyncIteration:
            return None

    async def run(self) -> AsyncIterator[str]:
        """Text deltas; afterwards ``finish_reason`` and ``stats`` are set."""
        self.finish_reason = "timeout"
        while True:
            try:
                event = await self._next()
            except TimeoutError:
                return  # cut: the events' clean-up has stopped the generation
            if event is None:
                return
            if isinstance(event, tuple):
                self.stats = event[1]
            elif isinstance(event, str):
                self.text += event
                yield event
            else:
                self.result, self.stats, self.finish_reason = event, event.stats, event.finish_reason

    def usage(self) -> dict[str, Any]:
        request = self.job.request
        return _usage(self.stats, len(self.job.prompt_ids), None if request.prediction is None else len(request.references))

    def extension(self) -> dict[str, Any]:
        out = _ragspec(self.stats, self.finish_reason, self.ticket, self.model_name)
        if self.job.retrieved is not None and self.result is not None:
            out["retrieval"] = retrieval_extension(self.result)
        return out

    async def whole(self) -> dict[str, Any]:
        try:
            async for _ in self.run():
                pass
        except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
            raise _generation_error(e, self._constraint_param()) from e
        request = self.job.request
        finish = _finish(self.finish_reason)
        if request.chat:
            shown = self.result.text if self.job.retrieved is not None and self.result is not None else self.text
            message: dict[str, Any] = {"role": "assistant", "content": shown}  # an abstaining retrieval answer: its note
            if request.tools:
                calls = self._calls()
                pieces = [*calls.add(self.text), *calls.flush()]
                message, finish = self._call_message(pieces, finish)
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": self.text, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion" if request.chat else "text_completion",
            "created": self.created,
            "model": request.model,
            "choices": [choice],
            "usage": self.usage(),
            "ragspec": self.extension(),
            **_metrics(self.stats),
        }

    def _constraint_param(self) -> str:
        """The parameter the answer's grammar came from."""
        return "tools" if self.job.request.tools and self.job.request.response_format is None else "response_format"

    def _calls(self) -> Any:
        """A ``ragspec.engine.tool_calls.CallStream`` for this answer's text."""
        from ragspec.engine.tool_calls import CallStream

        return CallStream()

    def _call_message(self, pieces: list[Any], finish: str) -> tuple[dict[str, Any], str]:
        """The message of an answer with tools and its finish reason: ``tool_calls`` when it made
        them, its text when it answered in text or left a call unfinished."""
        calls = [_tool_call(p) for p in pieces if p.name is not None and p.error is None]
        if any(p.error for p in pieces) or not calls:
            return {"role": "assistant", "content": self.text, **({"tool_calls": calls} if calls else {})}, finish
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"

    def chunk(self, delta: dict[str, Any] | str | None, finish: str | None = None) -> dict[str, Any]:
        """One stream chunk: a chat ``delta`` object or a completion's text, and the finish reason."""
        request = self.job.request
        if request.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": delta} if isinstance(delta, str) else delta or {}}
        else:
            choice = {"index": 0, "text": delta or ""}
        choice.update({"logprobs": None, "finish_reason": finish})
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if request.chat else "text_completion",
            "created": self.created,
            "model": request.model,
            "choices": [choice],
        }
        if request.include_usage:
            out["usage"] = None  # as OpenAI: null on every chunk but the last
        return out

    async def chunks(self) -> AsyncIterator[str]:
        """The SSE stream: a role chunk (chat), text chunks, the finish chunk with ``ragspec``, usage, ``[DONE]``."""
        request = self.job.request
        try:
            finish = None
            if request.chat:
                yield sse_data(self.chunk({"role": "assistant", "content": ""}))
            if request.tools:  # calls are sent whole, each once it is complete
                calls = self._calls()
                async for delta in self.run():
                    for piece in calls.add(delta):
                        yield sse_data(self.chunk(_piece_delta(piece)))
                held = calls.flush()
                for piece in held:
                    yield sse_data(self.chunk(_piece_delta(piece)))
                if calls.mode == "calls" and not held:
                    finish = "tool_calls"
            else:
                async for delta in self.run():
                    yield sse_data(self.chunk(delta))
                if self.job.retrieved is not None and self.result is not None and self.result.stream_flag:
                    yield sse_data(self.chunk(self.result.stream_flag))  # an abstaining retrieval answer's note
            yield sse_data({**self.chunk(None, finish or _finish(self.finish_reason)), "ragspec": self.extension(),
                            **_metrics(self.stats)})
            if request.include_usage:
                yield sse_data({**self.chunk(None), "choices": [], "usage": self.usage()})
        except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, as OpenAI does
            error = _generation_error(e, self._constraint_param())
            yield sse_data(error_object(error.status, error.message, code=error.code))
        finally:
            await self.events.aclose()  # stops the generation if the stream ended early
        yield "data: [DONE]\n\n"


def _tool_call(piece: Any) -> dict[str, Any]:
    """One complete call (a ``CallStreamPiece``) in OpenAI's form."""
    return {"id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": piece.args}}


def _piece_delta(piece: Any) -> dict[str, Any]:
    """A stream delta for one ``CallStreamPiece``: text, a whole call, or (a call the answer left
    unfinished) the answer's text as written."""
    if piece.error is not None:
        return {"content": piece.args}
    if piece.name is None:
        return {"content": piece.text}
    return {"tool_calls": [{"index": piece.index, **_tool_call(piece)}]}


def _generation_error(e: Exception, constraint_param: str = "response_format") -> OpenAIError:
    """An exception from the generator as an OpenAI error (a constraint's is a 400 naming ``constraint_param``)."""
    from ragspec.engine.constraints import ConstraintError
    from ragspec.engine.results import GeneratorBusyError, PromptTooLongError

    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ConstraintError):  # found when the grammar meets the tokenizer or a remote generator, after the queue
        return OpenAIError(400, f"{constraint_param}: {_first_line(str(e))}", param=constraint_param)
    if isinstance(e, PromptTooLongError):
        return OpenAIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, GeneratorBusyError):
        return OpenAIError(503, str(e), code="busy", headers={"Retry-After": "5"})
    if type(e).__name__ == "RemoteGenerationError":
        return OpenAIError(502, f"the upstream generator failed: {e}", code="upstream_error")
    logger.error("generation failed", exc_info=e)
    return OpenAIError(500, "generation failed: an internal error (logged on the server)", code="internal_error")


async def _json_body(request: Request) -> object:
    body = await request.body()
    try:
        return json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300-digit limit
        raise OpenAIError(400, f"the request body is not valid JSON: {_first_line(str(e), 200)}") from None
    except RecursionError:
        raise OpenAIError(400, "the request body is JSON nested too deeply") from None


__all__ = [
    "ApiRequest", "ApiSettings", "OpenAIError", "add_openai_routes", "error_object", "openai_error_body",
    "parse_request", "prepare",
]  # fmt: skip
