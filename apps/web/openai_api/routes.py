"""The ``/v1`` routes as an ``APIRouter`` (like ``apps.web.ask`` and ``apps.web.documents``): the model list,
and the two completion routes, which parse, prepare, take the queue, generate and render."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from apps.web.openai_api.errors import PREFIX, OpenAIError, error_object, json_body
from apps.web.openai_api.jobs import ApiSettings, compile_constraint, job_events, prepare, request_scope
from apps.web.openai_api.parse import ApiRequest, parse_request
from apps.web.openai_api.render import Completion
from apps.web.queue import ModelQueue, QueueFullError, QueueTimeoutError
from apps.web.retrieval_api import Documents
from apps.web.streaming import ClientGone, EventStream, unless_gone
from ragspec.bridge import iterate_in_thread
from ragspec.engine.tenancy import in_cache_scope

router = APIRouter()


class Source(Protocol):
    """What the routes generate with: ``ragspec.registry.LocalModel`` or ``ragspec.remote.RemoteModel``."""

    def load(self, model: str | None = None) -> Any: ...


@dataclass(frozen=True)
class OpenAIState:
    """What the ``/v1`` routes serve (``app.state.openai``): they generate with ``source`` through
    ``queue``, and retrieval requests retrieve over ``documents`` (None: they are refused)."""

    source: Source
    queue: ModelQueue
    settings: ApiSettings
    documents: Documents | None = None

    async def generator(self) -> Any:
        return await asyncio.to_thread(self.source.load)

    def names(self, gen: Any) -> list[str]:
        """What clients may send as ``model``: the server's name for it, then the model's own."""
        return list(dict.fromkeys((self.settings.model_id, gen.model_name)))

    def check_model(self, model: str, gen: Any) -> None:
        if model not in self.names(gen):
            served = " or ".join(repr(n) for n in self.names(gen))
            raise OpenAIError(
                404, f"the model {model[:100]!r} does not exist here: this server serves {served}",
                param="model", code="model_not_found",
            )  # fmt: skip

    def model_entry(self, gen: Any, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "ragspec",
            "max_model_len": gen.context_length,
            "ragspec": {"name": gen.model_name, "max_tokens": self.settings.max_tokens},
        }

    def embedding_entry(self) -> dict[str, Any]:
        return {"id": self.settings.embedding_model, "object": "model", "created": 0, "owned_by": "ragspec",
                "ragspec": {"kind": "embeddings"}}  # fmt: skip


def openai_state(request: Request) -> OpenAIState:
    """The app's ``OpenAIState`` (a FastAPI dependency)."""
    state: OpenAIState = request.app.state.openai
    return state


def add_openai_routes(
    app: FastAPI, *, source: Source, queue: ModelQueue, settings: ApiSettings, documents: Documents | None = None
) -> None:
    """Add the ``/v1`` routes to ``app``; they generate with ``source`` through ``queue``, and retrieval
    requests retrieve over ``documents`` (None: they are refused)."""
    app.state.openai = OpenAIState(source, queue, settings, documents)
    app.add_exception_handler(OpenAIError, _openai_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _routing_error)  # type: ignore[arg-type]
    app.include_router(router)


async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


async def _routing_error(request: Request, exc: StarletteHTTPException) -> Response:
    """An unknown route or method: an OpenAI error under ``/v1/``, FastAPI's usual answer elsewhere."""
    if request.url.path.startswith(PREFIX):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        body = error_object(exc.status_code, str(exc.detail), code=code)
        return JSONResponse(body, status_code=exc.status_code, headers=dict(exc.headers or {}))
    return await http_exception_handler(request, exc)


@router.get("/v1/models")
async def list_models(v1: OpenAIState = Depends(openai_state)) -> dict[str, Any]:
    gen = await v1.generator()
    entries = [v1.model_entry(gen, name) for name in v1.names(gen)]
    return {"object": "list", "data": [*entries, *([v1.embedding_entry()] if v1.settings.embedding_model else [])]}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, v1: OpenAIState = Depends(openai_state)) -> dict[str, Any]:
    if v1.settings.embedding_model and model == v1.settings.embedding_model:
        return v1.embedding_entry()
    gen = await v1.generator()
    v1.check_model(model, gen)
    return v1.model_entry(gen, model)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, v1: OpenAIState = Depends(openai_state)) -> Response:
    return await respond(request, parse_request(await json_body(request), chat=True), v1)


@router.post("/v1/completions")
async def completions(request: Request, v1: OpenAIState = Depends(openai_state)) -> Response:
    return await respond(request, parse_request(await json_body(request), chat=False), v1)


async def respond(request: Request, api_request: ApiRequest, v1: OpenAIState) -> Response:
    """Prepare the request, hold a place in the queue for it (``async with ticket``: given back on every
    exit, or handed to a stream, which gives it back when it ends), generate and render."""
    settings = v1.settings
    gen = await v1.generator()
    v1.check_model(api_request.model, gen)
    job = await asyncio.to_thread(prepare, gen, api_request, settings, v1.documents)
    try:
        ticket = v1.queue.ticket()
    except QueueFullError as e:
        raise OpenAIError(429, str(e), code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from e
    async with ticket:
        try:
            await unless_gone(request, ticket.wait(settings.queue_timeout_s))
            job = await unless_gone(request, compile_constraint(job, ticket, settings.compile_timeout_s))
        except QueueTimeoutError as e:
            raise OpenAIError(503, str(e), code="queue_timeout", headers={"Retry-After": str(e.retry_after_s)}) from e
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the place in the queue is given back
        scope = request_scope(request, api_request, settings)
        events = iterate_in_thread(lambda: in_cache_scope(scope, lambda: job_events(gen, job)))
        answer = Completion(job, ticket, events, gen.model_name, time.monotonic() + settings.answer_timeout_s)
        if api_request.stream:
            return EventStream(
                answer.chunks(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
                on_close=ticket.hand_over(),
            )
        try:
            return JSONResponse(await unless_gone(request, answer.whole()))
        except ClientGone:
            return Response(status_code=499)
        finally:
            await events.aclose()
