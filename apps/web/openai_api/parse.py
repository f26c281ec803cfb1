"""Reading a ``/v1`` request: the body checked field by field into an ``ApiRequest`` in ragspec's terms
(a 400 naming the first bad parameter); nothing is compiled or tokenized here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from apps.web.openai_api.errors import OpenAIError, checked
from apps.web.retrieval_api import Retrieval, RetrievalError, parse_retrieval
from ragspec.chat_request import ToolUse
from ragspec.engine.config import GenerationConfig, request_max_tokens

MAX_STOP = 16
MAX_REFERENCES = 64
MAX_CACHE_SALT = 1024

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
    tools: ToolUse | None = None
    """The tools the model may call, ``tool_choice`` and ``parallel_tool_calls`` (chat only; None: no tools)."""
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
        options["max_tokens"] = checked(lambda: request_max_tokens(body[param], param))
    for name in ("temperature", "top_p", "seed", "top_k", "frequency_penalty", "presence_penalty", "repeat_penalty",
                 "repeat_last_n", "repetition_stop", "speculation"):  # fmt: skip
        if body.get(name) is not None:
            options[name] = body[name]
    checked(lambda: GenerationConfig().merged(options))  # 400 naming the first bad option, before the request queues
    if body.get("stop") is not None:
        options["stop"] = _stop(body["stop"])
    response_format = body.get("response_format")
    format_kind = response_format_kind(response_format)
    tools = _tools(body) if chat else None
    if tools is not None and tools.calls and format_kind is not None:
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
        retrieval = parse_retrieval(body.get("retrieval"), body.get("messages"), tools=tools is not None,
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
        chat, model, prompt, options, _references(body.get("references")), stream, include_usage, tools, response_format,
        retrieval, salt, prediction,
    )


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


def response_format_kind(value: object) -> str | None:
    """``response_format``'s kind (None: text), its shape checked without compiling anything; 400 for a bad shape."""
    from ragspec.engine.constraints import ConstraintError, response_format_kind

    try:
        return None if value is None else response_format_kind(value)
    except ConstraintError as e:
        raise OpenAIError(400, f"response_format: {e}", param="response_format") from e


def _tools(body: Mapping[str, Any]) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` as a ``ToolUse`` (None without tools)."""
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
    return ToolUse(tuple(tools), choice, parallel) if tools else None


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

