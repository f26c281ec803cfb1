"""The ``/v1`` routes' errors: OpenAI error objects, and what each failure becomes."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from apps.web.security import plain_error
from ragspec.engine.config import GenerationConfigError

logger = logging.getLogger("apps.web.openai_api")
T = TypeVar("T")

PREFIX = "/v1/"

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


def first_line(message: str, limit: int = 300) -> str:
    """An engine's message without what follows its first line (a Rust panic's backtrace, build paths)."""
    line = message.strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def checked(build: Callable[[], T]) -> T:
    """``build()``, its ``GenerationConfigError`` answered as a 400 that names the parameter."""
    try:
        return build()
    except GenerationConfigError as e:
        raise OpenAIError(400, str(e), param=e.param) from e


def generation_error(e: Exception, constraint_param: str = "response_format") -> OpenAIError:
    """An exception from the generator as an OpenAI error (a constraint's is a 400 naming ``constraint_param``)."""
    from ragspec.engine.constraints import ConstraintError
    from ragspec.engine.results import GeneratorBusyError, PromptTooLongError

    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ConstraintError):  # found when the grammar meets the tokenizer or a remote generator, after the queue
        return OpenAIError(400, f"{constraint_param}: {first_line(str(e))}", param=constraint_param)
    if isinstance(e, PromptTooLongError):
        return OpenAIError(400, str(e), code="context_length_exceeded")
    if isinstance(e, GeneratorBusyError):
        return OpenAIError(503, str(e), code="busy", headers={"Retry-After": "5"})
    if type(e).__name__ == "RemoteGenerationError":
        return OpenAIError(502, f"the upstream generator failed: {e}", code="upstream_error")
    logger.error("generation failed", exc_info=e)
    return OpenAIError(500, "generation failed: an internal error (logged on the server)", code="internal_error")


async def json_body(request: Request) -> object:
    """The request's JSON body; 400 when it is not JSON."""
    body = await request.body()
    try:
        return json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300-digit limit
        raise OpenAIError(400, f"the request body is not valid JSON: {first_line(str(e), 200)}") from None
    except RecursionError:
        raise OpenAIError(400, "the request body is JSON nested too deeply") from None

