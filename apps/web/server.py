"""The document Q&A web app: one page, per-session indexes, answers streamed as server-sent events.

Endpoints (all JSON unless said otherwise; the session is the ``ragspec_session`` cookie):

- ``GET /``: the page. ``GET /static/...``: its script and style sheet.
- ``GET /api/session``: this session's documents (never creates a session; ``"expired": true``
  when the cookie names a session that is gone).
- ``POST /api/documents``: multipart upload (field ``files``); 413 when a file, the request or
  the session's uploads are too large, 415 for a file type that cannot be indexed. Every file is
  kept: an unusable name gets a safe one and a name already taken gets a `` (2)`` suffix, each
  said in ``notices``.
- ``POST /api/folder``: ``{"path": "..."}`` indexes a folder on the server (only when enabled,
  which it is by default only for a loopback-bound server). Indexing is incremental: the same
  folder again reads and embeds only new and changed files.
- ``GET /api/progress?id=ID``: how far the indexing started by a ``POST /api/folder?progress=ID``
  (or ``POST /api/documents?progress=ID``) has got: ``{"active": true, "stage", "files_done",
  "files_total", "bytes_done", "bytes_total", "chunks_done", "chunks_total", "rate", "eta_s"}``
  (``retrievers.SyncProgress.as_dict``), or ``{"active": false}``. ``ID`` is a random token
  the page makes (16 to 64 letters, digits, ``-`` or ``_``); only counts are reported.
- ``DELETE /api/documents``: forget this session's documents and conversation.
- ``POST /api/ask``: ``{"question": "..."}`` answers as ``text/event-stream`` with events
  ``queued``, ``token``, ``done`` (the text and its Markdown as sanitized ``html``, citations,
  ``supported``: false when no passage backs the answer, and stats) and ``error``. A client that
  leaves (the page's Stop button) stops the generation.
- ``GET /api/health``.
- ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``: the OpenAI-compatible API
  (``apps.web.openai_api``, docs/serving.md), over the same model and the same queue.

The routes sit in routers over one shared ``apps.web.state.WebState`` (config, sessions, queue,
progress, back end): the page, ``/api/health`` and ``/api/session`` here; ``apps.web.documents``
(upload, folder, progress, reset); ``apps.web.ask`` (questions, conversation); ``apps.web.openai_api``
and ``apps.web.embeddings_api`` (``/v1``). ``create_app`` only wires them together.

Errors are ``{"error": message}`` (plus ``"code": "session_expired"`` on the 410 of a session
that expired). Sessions are made only by the POSTs above, at most ``max_sessions`` at once
(then 503, no session is evicted), and expire after ``session_ttl_s`` idle. They live in this
process, or with ``create_app(state_url=...)`` (``ragspec serve --store postgresql://...``) in that
database with their conversations, uploaded files and indexing progress (``apps.web.pg_state``), so
that replicas over it serve one user interchangeably.

Every request first passes ``apps.web.security.Guard``: trusted ``Host``, same-origin
state-changing requests, the API key on ``/api/`` and ``/v1/`` when one is set, and body-size limits enforced
while the body streams in. See docs/threat-model.md.

Generation goes through one ``ModelQueue`` (``apps.web.queue``) shared by ``/api/ask`` and
``/v1``: one answer at a time on a local model, at most ``max_queue`` waiting (then 429 with
``Retry-After``), each for at most ``queue_timeout_s``; each answer has a time limit, and a
client that goes away stops its generation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from apps.collection import Collection
from apps.web import ask, documents
from apps.web.config import AppConfig
from apps.web.indexers import FolderIndexer, StoreIndexer
from apps.web.embeddings_api import add_embeddings_route
from apps.web.openai_api import ApiSettings, Source, add_openai_routes
from apps.web.queue import ModelQueue
from apps.web.retrieval_api import Documents
from apps.web.security import Guard, is_loopback, require_key_off_loopback, trusted_hosts_for
from apps.web.sessions import Answerer, Indexer, MemorySessionStore, SessionStore
from apps.web.state import COOKIE, ProgressBoard, ProgressStore, WebState, web_state

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
__all__ = ["AppConfig", "FolderIndexer", "ProgressBoard", "create_app", "is_loopback", "serve", "trusted_hosts_for"]


pages = APIRouter()
"""The page, the health check and the session's documents."""


@pages.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@pages.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    """The page's icon (an SVG; browsers ask for /favicon.ico whatever the page links)."""
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


@pages.get("/api/health")
async def health(web: WebState = Depends(web_state)) -> dict[str, Any]:
    # running counts a request until its generation has really stopped (a client that left
    # frees its slot only once the worker has ended: ragspec.bridge), so this is what the model does.
    queue = web.queue
    return {"ok": True, "queue": queue.waiting, "busy": queue.busy, "running": queue.running,
            "waiting": queue.waiting, "slots": queue.slots}


@pages.get("/api/session")
async def get_session(request: Request, web: WebState = Depends(web_state)) -> dict[str, Any]:
    session = web.live_session(request)
    return web.describe(session, expired=session is None and COOKIE in request.cookies)


def create_app(
    config: AppConfig | None = None,
    *,
    indexer: Indexer | None = None,
    preload: Answerer | None = None,
    sessions_root: Path | None = None,
    generation: Source | None = None,
    embeddings: Any = None,
    state_url: str | None = None,
) -> FastAPI:
    """Build the app. ``indexer`` indexes a session's uploads (default: ``FolderIndexer``, or ``StoreIndexer``
    with ``state_url``); ``preload`` answers for sessions that have not uploaded anything.

    ``state_url`` (a ``postgresql://`` URL): the sessions, their conversations and uploaded files and
    the indexing progress live in that database (``apps.web.pg_state``), and uploads are indexed into
    a collection per session there, so that several replicas of the app over it serve one user
    interchangeably. Without it they live in this process.

    ``generation`` is what the ``/v1`` routes generate with (default: the local default model,
    ``ragspec.registry.LocalModel()``; a ``ragspec.remote.RemoteModel`` serves a remote one).
    ``embeddings`` is what ``/v1/embeddings`` serves (default: ``retrievers.default_embeddings()``,
    the model the indexes are built with; loaded at the first request).
    """
    from retrievers import default_embeddings
    from ragspec.registry import LocalModel

    config = config or AppConfig()
    generation = generation if generation is not None else LocalModel()
    embeddings = embeddings if embeddings is not None else default_embeddings()
    if indexer is None:  # the page answers with the same model as /v1: local (its own Collection) or remote
        local = generation if isinstance(generation, LocalModel) else None
        indexer = _default_indexer(config, generation if local is None else None, local, state_url, embeddings)
    store, progress = _state(config, indexer, sessions_root, state_url)
    queue = ModelQueue(config.concurrency, config.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()
        getattr(progress, "close", lambda: None)()

    app = FastAPI(title="ragspec document Q&A", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    preloaded = tuple(preload.documents()) if isinstance(preload, Collection) else ()
    app.state.web = WebState(config, store, queue, progress, indexer, preload, preloaded)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(_SessionCookie, secure=config.secure_cookie)
    app.add_middleware(Guard, policy=config.security())  # outermost: nothing reaches the app unchecked
    add_openai_routes(
        app,
        source=generation,
        queue=queue,
        settings=ApiSettings(
            model_id=config.model_name or getattr(generation, "model", "") or generation.load().model_name,
            max_tokens=config.max_tokens,
            queue_timeout_s=config.queue_timeout_s,
            answer_timeout_s=config.answer_timeout_s,
            embedding_model=embeddings.model_id,
            shared_prefix_cache=config.shared_prefix_cache,
        ),
        documents=preload if isinstance(preload, Documents) else None,  # "retrieval" requests answer over it
    )
    add_embeddings_route(app, embeddings, embeddings.model_id)
    for router in (pages, documents.router, ask.router):
        app.include_router(router)
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    return app


def _default_indexer(config: AppConfig, remote: Source | None, local: Any, state_url: str | None, embeddings: Any) -> Indexer:
    """What indexes uploads: into a folder per session, or a collection per session in the ``state_url`` database."""
    settings: dict[str, Any] = {"max_tokens": config.max_tokens, "source": remote,
                                "model": local.model if local else "default", "model_backend": local.backend if local else "auto"}  # fmt: skip
    if state_url is None:
        return FolderIndexer(**settings)
    return StoreIndexer(**settings, url=state_url, embeddings=embeddings)


def _state(config: AppConfig, indexer: Indexer, root: Path | None, state_url: str | None) -> tuple[SessionStore, ProgressStore]:
    """Where sessions and indexing progress live: this process, or the ``state_url`` database."""
    if state_url is None:
        return MemorySessionStore(root, max_sessions=config.max_sessions, ttl_s=config.session_ttl_s), ProgressBoard()
    from apps.web.pg_state import PgProgressBoard, PgSessionStore

    store = PgSessionStore(state_url, indexer, root, max_sessions=config.max_sessions, ttl_s=config.session_ttl_s)
    return store, PgProgressBoard(state_url)


class _SessionCookie:
    """Pure ASGI middleware (streams and disconnects pass through untouched) for the session cookie.

    Sets it on the response of the request that made a session (``request.state.session_cookie``
    holds the id) and deletes it when the request named a session that is gone (``"clear"``).
    """

    def __init__(self, app: Any, secure: bool = False) -> None:
        self.app = app
        self.secure = secure

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_cookie(message: dict[str, Any]) -> None:
            value = state.get("session_cookie")
            if message["type"] == "http.response.start" and value:
                cookie = Response()
                if value == "clear":
                    cookie.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=self.secure)
                else:
                    cookie.set_cookie(COOKIE, value, httponly=True, samesite="strict", secure=self.secure)
                message["headers"] = [*message.get("headers", []), *[(k, v) for k, v in cookie.raw_headers if k == b"set-cookie"]]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    code = getattr(exc, "code", None)
    body = {"error": exc.detail, **({"code": code} if code else {})}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 400/422 naming the bad field; never echoes the input (it may not even encode)."""
    problems = []
    status = 422
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        if error.get("type") == "string_unicode":
            status = 400
            problems.append(f"{where}: not valid text (a lone surrogate such as \\ud800); send valid Unicode")
        else:
            problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return JSONResponse({"error": "; ".join(problems) or "invalid request"}, status_code=status)


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    config: AppConfig | None = None,
    preload: Answerer | None = None,
    generation: Source | None = None,
    log_level: str = "info",
    state_url: str | None = None,
) -> None:
    """Run the app with uvicorn until interrupted.

    Without ``config``: folders only on loopback, and the hosts ``trusted_hosts_for(host)``.
    Raises ``InsecureBindError`` for a non-loopback ``host`` without ``config.api_key``.
    ``generation``, ``state_url``: see ``create_app``; the model is loaded before the server listens.
    """
    import uvicorn

    from ragspec.registry import LocalModel

    config = config or AppConfig(allow_folders=is_loopback(host), trusted_hosts=trusted_hosts_for(host))
    require_key_off_loopback(host, config.api_key)
    generation = generation if generation is not None else LocalModel()
    generation.load()  # before listening: the first request should not wait for the model
    app = create_app(config, preload=preload, generation=generation, state_url=state_url)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
