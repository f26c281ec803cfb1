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
  ``queued``, ``token``, ``done`` (citations, ``supported``: false when no passage backs the
  answer, and stats) and ``error``.
- ``GET /api/health``.
- ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``: the OpenAI-compatible API
  (``apps.web.openai_api``, docs/serving.md), over the same model and the same queue.

Errors are ``{"error": message}`` (plus ``"code": "session_expired"`` on the 410 of a session
that expired). Sessions are made only by the POSTs above, at most ``max_sessions`` at once
(then 503, no session is evicted), and expire after ``session_ttl_s`` idle.

Every request first passes ``apps.web.security.Guard``: trusted ``Host``, same-origin
state-changing requests, the API key on ``/api/`` and ``/v1/`` when one is set, and body-size limits enforced
while the body streams in. See docs/threat-model.md.

Generation goes through one ``ModelQueue`` (``apps.web.queue``) shared by ``/api/ask`` and
``/v1``: one answer at a time on a local model, at most ``max_queue`` waiting (then 429 with
``Retry-After``), each for at most ``queue_timeout_s``; each answer has a time limit, and a
client that goes away stops its generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from apps.engine import AppError, Collection, IndexSummary, Token, update_index
from apps.web.embeddings_api import add_embeddings_route
from apps.web.openai_api import ApiSettings, Source, add_openai_routes, openai_error_body
from apps.web.queue import ModelQueue, QueueFullError, QueueTimeoutError, Ticket
from apps.web.retrieval_api import Documents
from apps.web.security import (
    LOCAL_HOSTS,
    Guard,
    SecurityPolicy,
    is_loopback,
    require_key_off_loopback,
    trusted_hosts_for,
)
from apps.web.sessions import Answerer, Backend, Session, SessionLimitError, SessionStore
from apps.web.streaming import EventStream
from ragspec.config import DEFAULT_MAX_TOKENS, request_max_tokens
from ragspec.text import question_text

if TYPE_CHECKING:
    from ragspec.pipeline import Answer
    from retrievers.ingest import SyncProgress

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
COOKIE = "ragspec_session"
DEFAULT_SUFFIXES = (
    ".txt", ".md", ".markdown", ".html", ".htm", ".pdf", ".docx", ".pptx", ".xlsx", ".csv", ".epub", ".odt", ".ipynb"
)
MAX_NAME_CHARS = 120
MAX_NAME_BYTES = 200
"""An upload's saved name in UTF-8 stays under this, leaving room for `` (N)`` within the 255 bytes
file systems allow (130 mathematical letters are 520 bytes)."""
MAX_SUFFIX_CHARS = 16
MAX_FOLDER_CHARS = 4096
PROGRESS_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
MAX_PROGRESS = 256
"""Most indexing runs whose progress is tracked at once (a run beyond that is not tracked)."""
__all__ = ["AppConfig", "DefaultBackend", "ProgressBoard", "create_app", "is_loopback", "serve", "trusted_hosts_for"]


@dataclass(frozen=True)
class AppConfig:
    """Limits and defaults of the web app; checked when it is built."""

    max_file_bytes: int = 10 * 2**20
    """Largest uploaded file (413 beyond)."""
    max_request_bytes: int = 50 * 2**20
    """Largest upload request (413 beyond, as soon as that much has arrived)."""
    max_body_bytes: int = 2**20
    """Largest body of any other request (413 beyond)."""
    max_session_bytes: int = 100 * 2**20
    """Most bytes of uploaded files one session keeps (413 beyond)."""
    max_files: int = 50
    allowed_suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    """File types accepted for upload (415 otherwise)."""
    max_sessions: int = 32
    """Most sessions at once; a new one beyond gets a 503 (none is evicted)."""
    session_ttl_s: float = 3600.0
    """A session idle this long is dropped with its files."""
    queue_timeout_s: float = 120.0
    """How long a question waits for the model before it gives up."""
    max_queue: int = 16
    """Most requests waiting for the model (web questions and ``/v1`` calls together); 429 beyond."""
    concurrency: int = 1
    """Answers generated at once: 1 for a local model; more only for a remote generator that batches."""
    answer_timeout_s: float = 300.0
    """Longest one answer may take; it is cut (and the model freed) after that."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_question_chars: int = 2000
    allow_folders: bool = True
    """Allow ``POST /api/folder`` (reads any folder the server process can read)."""
    secure_cookie: bool = False
    trusted_hosts: tuple[str, ...] = LOCAL_HOSTS
    """Names accepted in the ``Host`` header; ``trusted_hosts_for(bind_address)`` makes the list."""
    api_key: str | None = field(default=None, repr=False)
    """When set, every ``/api/`` and ``/v1/`` request needs ``Authorization: Bearer KEY``."""

    def __post_init__(self) -> None:
        names = (
            "max_file_bytes", "max_request_bytes", "max_body_bytes", "max_session_bytes", "max_files", "max_sessions",
            "max_question_chars", "concurrency",
        )  # fmt: skip
        request_max_tokens(self.max_tokens)
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        for name in ("session_ttl_s", "queue_timeout_s", "answer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.allowed_suffixes or any(not s.startswith(".") for s in self.allowed_suffixes):
            raise ValueError(f"allowed_suffixes must be non-empty suffixes like '.md', got {self.allowed_suffixes!r}")
        self.security()  # checks trusted_hosts and api_key

    def security(self) -> SecurityPolicy:
        """The request checks this config asks for (uploads get their own body limit; ``/v1`` errors are OpenAI's)."""
        return SecurityPolicy(
            trusted_hosts=self.trusted_hosts,
            api_key=self.api_key,
            max_body_bytes=self.max_body_bytes,
            body_limits={"/api/documents": self.max_request_bytes, "/v1/": self.max_body_bytes},
            error_body=openai_error_body,
        )


@dataclass
class DefaultBackend:
    """Indexes with ``apps.engine.update_index`` (incremental, into ``workdir/index``) and answers with the ragspec pipeline."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    k: int = 4
    model: str = "default"
    model_backend: str = "auto"
    """What runs the local ``model``: ``"auto"``, ``"torch"`` or ``"llamacpp"`` (``ragspec.backends``)."""
    source: Source | None = None
    """Where answers are generated (a ``RemoteModel``); None: the local ``model``."""

    def index(
        self, paths: Sequence[Path], workdir: Path, progress: Callable[[SyncProgress], None] | None = None
    ) -> tuple[Answerer, IndexSummary]:
        index_dir = workdir / "index"
        summary = update_index(paths, index_dir, progress=progress)
        collection = Collection(index_dir, max_tokens=self.max_tokens, k=self.k, model=self.model,
                                source=self.source, backend=self.model_backend)
        return collection, summary


class AskBody(BaseModel):
    question: str


class FolderBody(BaseModel):
    path: str = Field(min_length=1, max_length=MAX_FOLDER_CHARS)


def sse(event: str, data: Any) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class ApiError(HTTPException):
    """An error answered as ``{"error": message, "code": code}``."""

    def __init__(self, status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers=headers)
        self.code = code


def _without_session_paths(message: str, root: Path) -> str:
    """``message`` with the session's folder left out: it names the server's temporary folder and
    holds the session id, which the HttpOnly cookie keeps from the page's scripts."""
    uploads = str(root / "uploads")
    return message.replace(uploads + os.sep, "").replace(uploads, "the uploaded files").replace(str(root), "the session folder")


def create_app(
    config: AppConfig | None = None,
    *,
    backend: Backend | None = None,
    preload: Answerer | None = None,
    sessions_root: Path | None = None,
    generation: Source | None = None,
    embeddings: Any = None,
) -> FastAPI:
    """Build the app. ``preload`` answers for sessions that have not uploaded anything.

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
    if backend is None:  # the page answers with the same model as /v1: local (its own Collection) or remote
        local = generation if isinstance(generation, LocalModel) else None
        backend = DefaultBackend(max_tokens=config.max_tokens, source=None if local else generation,
                                 model=local.model if local else "default", model_backend=local.backend if local else "auto")
    store = SessionStore(sessions_root, max_sessions=config.max_sessions, ttl_s=config.session_ttl_s)
    queue = ModelQueue(config.concurrency, config.max_queue)
    progress_board = ProgressBoard()
    gone = f"your session expired (idle for more than {config.session_ttl_s / 60:g} min, or the server restarted)"
    expired_message = f"{gone} and its documents are gone: upload them again"
    replaced_notice = f"{gone}: its documents are gone, and only these are indexed now"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="ragspec document Q&A", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = config
    app.state.sessions = store
    app.state.backend = backend
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(_SessionCookie, secure=config.secure_cookie)
    app.add_middleware(Guard, policy=config.security())  # outermost: nothing reaches the app unchecked
    add_openai_routes(
        app,
        source=generation,
        queue=queue,
        settings=ApiSettings(
            model_id=getattr(generation, "model", "") or generation.load().lm.name,
            max_tokens=config.max_tokens,
            queue_timeout_s=config.queue_timeout_s,
            answer_timeout_s=config.answer_timeout_s,
            embedding_model=embeddings.model_id,
        ),
        documents=preload if isinstance(preload, Documents) else None,  # "retrieval" requests answer over it
    )
    add_embeddings_route(app, embeddings, embeddings.model_id)

    def live_session(request: Request) -> Session | None:
        """The request's session; None without one. A cookie naming a gone session clears the cookie."""
        session = store.get(request.cookies.get(COOKIE))
        if session is None and COOKIE in request.cookies:
            request.state.session_cookie = "clear"
        return session

    def new_session(request: Request) -> Session:
        try:
            session = store.create()
        except SessionLimitError as e:
            raise ApiError(503, str(e), code="too_many_sessions", headers={"Retry-After": str(e.retry_after_s)}) from e
        request.state.session_cookie = session.id
        return session

    def describe(session: Session | None, notices: Sequence[str] = (), expired: bool = False) -> dict[str, Any]:
        summary = session.summary if session else None
        return {
            "documents": [_display(f, session) for f in summary.files] if summary and session else [],
            "chunks": summary.chunks if summary else 0,
            "skipped": [{"path": Path(s.path).name, "reason": s.reason} for s in summary.skipped] if summary else [],
            "notices": list(notices),
            "update": _update(summary),
            "preloaded": preload is not None,
            "turns": len(session.history) if session else 0,
            **({"expired": True, "message": expired_message} if expired else {}),
        }

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/api/health")
    async def health() -> dict[str, Any]:
        # running counts a request until its generation has really stopped (a client that left
        # frees its slot only once the worker has ended: ragspec.bridge), so this is what the model does.
        return {"ok": True, "queue": queue.waiting, "busy": queue.busy, "running": queue.running,
                "waiting": queue.waiting, "slots": queue.slots}

    @app.get("/api/progress")
    async def get_progress(id: str = "") -> dict[str, Any]:  # noqa: A002 - the query parameter's name
        return progress_board.get(id)

    @app.get("/api/session")
    async def get_session(request: Request) -> dict[str, Any]:
        session = live_session(request)
        return describe(session, expired=session is None and COOKIE in request.cookies)

    @app.post("/api/documents")
    async def upload(request: Request, files: list[UploadFile], progress: str = "") -> dict[str, Any]:
        if not files:
            raise HTTPException(400, "no files in the upload (field 'files')")
        if len(files) > config.max_files:
            raise HTTPException(413, f"too many files: at most {config.max_files} per upload")
        for upload_file in files:
            suffix = Path(upload_file.filename or "").suffix.lower()
            if suffix not in config.allowed_suffixes:
                raise HTTPException(
                    415, f"{upload_file.filename!r}: unsupported file type; upload {', '.join(config.allowed_suffixes)}"
                )
            if upload_file.size is not None and upload_file.size > config.max_file_bytes:
                raise HTTPException(413, f"{upload_file.filename!r} is larger than {_mib(config.max_file_bytes)}")
        session, notices = _session_for_change(request)
        async with session.lock, _dropped_if_unused(request, session):
            incoming = sum(f.size or 0 for f in files)  # the multipart parser counts every file's bytes
            if _folder_bytes(session.uploads) + incoming > config.max_session_bytes:
                raise HTTPException(
                    413, f"this session's uploads would pass {_mib(config.max_session_bytes)}: clear the documents first"
                )
            session.uploads.mkdir(parents=True, exist_ok=True)
            written: list[Path] = []
            try:
                for upload_file in files:
                    filename = upload_file.filename or "upload"
                    data = await upload_file.read(config.max_file_bytes + 1)
                    if len(data) > config.max_file_bytes:
                        raise HTTPException(413, f"{filename!r} is larger than {_mib(config.max_file_bytes)}")
                    safe = _safe_name(filename)
                    target = _free_name(session.uploads, safe)
                    shown = Path(filename.replace("\\", "/")).name
                    if target.name != shown:
                        notices.append(f"{shown!r} was saved as {target.name!r}: {_rename_reason(shown, target.name, safe)}")
                    target.write_bytes(data)
                    written.append(target)
                await _reindex(session, [session.uploads], progress)
            except BaseException:  # the index is unchanged: so are the session's files
                for path in written:
                    path.unlink(missing_ok=True)
                raise
            return describe(session, notices)

    @app.post("/api/folder")
    async def add_folder(request: Request, body: FolderBody, progress: str = "") -> dict[str, Any]:
        if not config.allow_folders:
            raise HTTPException(403, "indexing server folders is disabled; upload the files instead")
        try:
            folder = Path(body.path).expanduser()
            found = folder.is_dir()
        except RuntimeError:  # ~name of a user that does not exist
            raise HTTPException(404, f"no such folder on the server: {body.path[:200]!r} (no such user)") from None
        except (OSError, ValueError) as e:  # a name too long, a NUL byte
            raise HTTPException(422, f"not a usable folder path: {body.path[:200]!r} ({e.strerror or e})") from None
        if not found:
            raise HTTPException(404, f"no such folder on the server: {body.path[:200]!r}")
        session, notices = _session_for_change(request)
        async with session.lock, _dropped_if_unused(request, session):
            paths = [folder, session.uploads] if session.uploads.is_dir() else [folder]
            await _reindex(session, paths, progress)
            return describe(session, notices)

    @asynccontextmanager
    async def _dropped_if_unused(request: Request, session: Session) -> AsyncIterator[None]:
        """Drop a session made for this request when the request fails before storing anything."""
        try:
            yield
        except BaseException:
            if getattr(request.state, "session_cookie", None) == session.id and not any(session.uploads.glob("*")):
                store.discard(session)
                request.state.session_cookie = None
            raise

    def _session_for_change(request: Request) -> tuple[Session, list[str]]:
        """The session to change, made now if there is none (its earlier one may have expired)."""
        session = live_session(request)
        if session is not None:
            return session, []
        return new_session(request), [replaced_notice] if COOKIE in request.cookies else []

    @app.delete("/api/conversation")
    async def new_conversation(request: Request) -> dict[str, Any]:
        """Start the conversation over; the documents stay."""
        session = live_session(request)
        if session is not None:
            session.history.clear()
        return describe(session)

    @app.delete("/api/documents")
    async def reset(request: Request) -> dict[str, Any]:
        session = live_session(request)
        if session is not None:
            async with session.lock:
                session.reset()
        return describe(session)

    async def _reindex(session: Session, paths: list[Path], progress_id: str = "") -> None:
        with progress_board.track(progress_id) as report:
            try:
                answerer, summary = await asyncio.to_thread(backend.index, paths, session.root, report)
            except AppError as e:
                raise HTTPException(422, _without_session_paths(str(e), session.root)) from e
        session.answerer, session.summary = answerer, summary
        session.history.clear()

    @app.post("/api/ask")
    async def ask(request: Request, body: AskBody) -> Response:
        try:
            question = question_text(body.question)
        except ValueError as e:
            raise HTTPException(422, str(e)) from e
        if len(question) > config.max_question_chars:
            raise HTTPException(413, f"the question is longer than {config.max_question_chars} characters")
        session = live_session(request)
        if session is None and COOKIE in request.cookies:
            raise ApiError(410, expired_message, code="session_expired")
        answerer = (session.answerer if session else None) or preload
        if answerer is None:
            raise HTTPException(409, "no documents yet: upload files or index a folder first")
        if session is None:
            session = new_session(request)  # keeps the conversation with the preloaded index
        try:
            ticket = queue.ticket()
        except QueueFullError as e:
            raise ApiError(429, str(e), code="queue_full", headers={"Retry-After": str(e.retry_after_s)}) from e
        return EventStream(
            _answer(session, answerer, question, ticket),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            on_close=ticket.release,
        )

    async def _answer(session: Session, answerer: Answerer, question: str, ticket: Ticket) -> AsyncIterator[str]:
        from ragspec.bridge import iterate_in_thread, next_before

        try:
            if queue.running >= queue.slots:
                yield sse("queued", {"position": queue.waiting})  # answers ahead: the running one and those waiting before this
            try:
                await ticket.wait(config.queue_timeout_s)
            except QueueTimeoutError:
                yield sse("error", {"message": f"the server is busy: no model free after {config.queue_timeout_s:g} s, try again"})
                return
            history = list(session.history)
            events = iterate_in_thread(lambda: answerer.stream(question, history))
            deadline = time.monotonic() + config.answer_timeout_s
            try:
                while True:
                    try:
                        event = await next_before(events, deadline)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        yield sse("error", {"message": f"the answer took longer than {config.answer_timeout_s:g} s and was stopped"})
                        return
                    if isinstance(event, Token):
                        yield sse("token", _live(event))
                    else:  # the Answer
                        session.history.append((question, event.text))
                        yield sse("done", _done(event, session))
            except AppError as e:
                yield sse("error", {"message": str(e)})
            except Exception:  # noqa: BLE001 - the stream has started: report in-band, log the rest
                logger.exception("answer failed")
                yield sse("error", {"message": "the answer failed (an error in the server; its log has the details)"})
            finally:
                await events.aclose()
        finally:
            ticket.release()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = getattr(exc, "code", None)
        body = {"error": exc.detail, **({"code": code} if code else {})}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid_request(exc)

    return app


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


class ProgressBoard:
    """The latest progress of each indexing run, by the id its page chose; written from worker threads."""

    def __init__(self, limit: int = MAX_PROGRESS) -> None:
        self.limit = limit
        self._runs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            latest = self._runs.get(run_id)
        return {"active": True, **latest} if latest is not None else {"active": False}

    @contextmanager
    def track(self, run_id: str) -> Iterator[Callable[[SyncProgress], None] | None]:
        """A progress callback that records under `run_id` until the run ends; None for no (valid) id or a full board."""
        with self._lock:
            tracked = bool(PROGRESS_ID.fullmatch(run_id)) and run_id not in self._runs and len(self._runs) < self.limit
            if tracked:
                self._runs[run_id] = {"stage": "starting"}
        if not tracked:
            yield None
            return

        def report(progress: SyncProgress) -> None:
            snapshot = progress.as_dict()
            with self._lock:
                if run_id in self._runs:
                    self._runs[run_id] = snapshot

        try:
            yield report
        finally:
            with self._lock:
                self._runs.pop(run_id, None)


def _invalid_request(exc: RequestValidationError) -> JSONResponse:
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


def _update(summary: IndexSummary | None) -> dict[str, Any] | None:
    """What the last indexing did (``update_index``'s report), for the page's status line."""
    report = summary.update if summary is not None else None
    if report is None:
        return None
    return {
        "files": report.files_line(),
        "embedded": report.embedded,
        "removed": report.removed_chunks,
        "rebuilt": report.rebuilt,
        "seconds": round(report.seconds, 2),
    }


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def _free_name(folder: Path, name: str) -> Path:
    """``folder / name``, or ``name (2)``, ``name (3)``... when that is taken."""
    target = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    n = 2
    while target.exists():
        target = folder / f"{stem} ({n}){suffix}"
        n += 1
    return target


def _done(answer: Answer, session: Session) -> dict[str, Any]:
    """The ``done`` event: the text, whether a passage backs it, the citations (each with its whole
    passage, for the page's passage panel) and the generation's stats."""
    return {
        "text": answer.text,
        "supported": answer.supported,
        "citations": [
            _shown({**c.as_dict(), "text": answer.passages[c.number - 1].page_content.strip()}, session)
            for c in answer.citations
        ],
        "stats": answer.stats.as_dict(),
    }


def _shown(citation: dict[str, Any], session: Session) -> dict[str, Any]:
    """An uploaded file's source as its name, not the server's temporary path."""
    citation["source"] = _display(citation["source"], session)
    return citation


def _display(source: str, session: Session) -> str:
    path = Path(source)
    return path.relative_to(session.uploads).as_posix() if path.is_relative_to(session.uploads) else source


def _live(token: Token) -> dict[str, Any]:
    """A token event: the text and the live speed (tokens/s; tokens per forward, approximately)."""
    return {
        "text": token.text,
        "elapsed_s": round(token.elapsed_s, 3),
        "tokens": token.tokens,
        "tokens_per_s": round(token.tokens / token.elapsed_s, 2) if token.elapsed_s > 0 else 0.0,
        "tokens_per_step": round(token.tokens / token.steps, 2) if token.steps else 0.0,
        **({"acceptance": round(token.acceptance, 4)} if token.acceptance is not None else {}),
        **({"tokens_per_forward": round(token.tokens_per_forward, 3)} if token.tokens_per_forward is not None else {}),
    }


def _safe_name(filename: str) -> str:
    """A file name without folders or odd characters (the upload's own path is never trusted).

    The suffix is kept (lower case), so the file is still indexed by its type: ``..txt`` becomes
    ``upload.txt``, not ``txt``.
    """
    name = Path(filename.replace("\\", "/")).name
    stem, dot, suffix = name.rpartition(".")
    if not dot:
        stem, suffix = name, ""

    def clean(part: str) -> str:
        return "".join(c if c.isalnum() or c in "-_. ()" else "_" for c in part).strip(" .")

    suffix = clean(suffix).lower()[:MAX_SUFFIX_CHARS]
    room = MAX_NAME_BYTES - len(suffix.encode()) - 1
    stem = clean(stem)[:MAX_NAME_CHARS].encode()[:room].decode(errors="ignore").strip(" .") or "upload"
    return f"{stem}.{suffix}" if suffix else stem


def _rename_reason(shown: str, saved: str, safe: str) -> str:
    """Why an upload called ``shown`` was saved as ``saved`` (``safe``: its cleaned name)."""
    if saved != safe:
        return "a file of that name is already uploaded"
    if shown.lower() == safe.lower():
        return "its suffix is kept in lower case"
    if len(shown.encode()) > MAX_NAME_BYTES or len(shown) > MAX_NAME_CHARS:
        return "its name was too long to keep whole"
    return "its name had characters a file name cannot keep"


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    config: AppConfig | None = None,
    preload: Answerer | None = None,
    generation: Source | None = None,
    log_level: str = "info",
) -> None:
    """Run the app with uvicorn until interrupted.

    Without ``config``: folders only on loopback, and the hosts ``trusted_hosts_for(host)``.
    Raises ``InsecureBindError`` for a non-loopback ``host`` without ``config.api_key``.
    ``generation``: see ``create_app``; its model is loaded before the server listens.
    """
    import uvicorn

    from ragspec.registry import LocalModel

    config = config or AppConfig(allow_folders=is_loopback(host), trusted_hosts=trusted_hosts_for(host))
    require_key_off_loopback(host, config.api_key)
    generation = generation if generation is not None else LocalModel()
    generation.load()  # before listening: the first request should not wait for the model
    app = create_app(config, preload=preload, generation=generation)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
