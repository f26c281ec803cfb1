"""The document Q&A web app: one page, per-session indexes, answers streamed as server-sent events.

Endpoints (all JSON unless said otherwise; the session is the ``ragspec_session`` cookie):

- ``GET /``: the page. ``GET /static/...``: its script and style sheet.
- ``GET /api/session``: this session's documents (creates the session).
- ``POST /api/documents``: multipart upload (field ``files``); 413 when a file or the request is
  too large, 415 for a file type that cannot be indexed.
- ``POST /api/folder``: ``{"path": "..."}`` indexes a folder on the server (only when enabled,
  which it is by default only for a loopback-bound server).
- ``DELETE /api/documents``: forget this session's documents and conversation.
- ``POST /api/ask``: ``{"question": "..."}`` answers as ``text/event-stream`` with events
  ``queued``, ``token``, ``done`` (citations and stats) and ``error``.
- ``GET /api/health``.

Generation is serialized (one model, one answer at a time; others wait in a queue with a
timeout), each answer has a time limit, and a client that goes away stops its generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from apps.engine import AppError, Collection, Finished, IndexSummary, Token, build_index
from apps.web.sessions import Answerer, Backend, Session, SessionStore

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
COOKIE = "ragspec_session"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")


@dataclass(frozen=True)
class AppConfig:
    """Limits and defaults of the web app; checked when it is built."""

    max_file_bytes: int = 10 * 2**20
    """Largest uploaded file (413 beyond)."""
    max_request_bytes: int = 50 * 2**20
    """Largest upload request (413 beyond)."""
    max_files: int = 50
    allowed_suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    """File types accepted for upload (415 otherwise)."""
    max_sessions: int = 32
    session_ttl_s: float = 3600.0
    queue_timeout_s: float = 120.0
    """How long a question waits for the model before it gives up."""
    answer_timeout_s: float = 300.0
    """Longest one answer may take; it is cut (and the model freed) after that."""
    max_tokens: int = 256
    max_question_chars: int = 2000
    allow_folders: bool = True
    """Allow ``POST /api/folder`` (reads any folder the server process can read)."""
    secure_cookie: bool = False

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_request_bytes", "max_files", "max_sessions", "max_tokens", "max_question_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("session_ttl_s", "queue_timeout_s", "answer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.allowed_suffixes or any(not s.startswith(".") for s in self.allowed_suffixes):
            raise ValueError(f"allowed_suffixes must be non-empty suffixes like '.md', got {self.allowed_suffixes!r}")


@dataclass
class DefaultBackend:
    """Indexes with ``apps.engine.build_index`` and answers with the ragspec pipeline."""

    max_tokens: int = 256
    k: int = 4
    model: str = "default"

    def index(self, paths: Sequence[Path], workdir: Path) -> tuple[Answerer, IndexSummary]:
        store, summary = build_index(paths)
        index_dir = workdir / "index"
        store.save(index_dir)
        return Collection(index_dir, max_tokens=self.max_tokens, k=self.k, model=self.model), summary


@dataclass
class _Queue:
    """One answer at a time: a FIFO lock that knows how many wait."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


class AskBody(BaseModel):
    question: str = Field(min_length=1)


class FolderBody(BaseModel):
    path: str = Field(min_length=1)


def sse(event: str, data: Any) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class EventStream(StreamingResponse):
    """A streaming response that always closes its iterator, also when the client went away."""

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def create_app(
    config: AppConfig | None = None,
    *,
    backend: Backend | None = None,
    preload: Answerer | None = None,
    sessions_root: Path | None = None,
) -> FastAPI:
    """Build the app. ``preload`` answers for sessions that have not uploaded anything."""
    config = config or AppConfig()
    backend = backend or DefaultBackend(max_tokens=config.max_tokens)
    store = SessionStore(sessions_root, max_sessions=config.max_sessions, ttl_s=config.session_ttl_s)
    queue = _Queue()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="ragspec document Q&A", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.config = config
    app.state.sessions = store
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(_Guard, config=config)

    def session_of(request: Request) -> Session:
        session = store.get(request.cookies.get(COOKIE))
        if session is None:
            session = store.create()
            request.state.new_session = session.id
        return session

    def describe(session: Session) -> dict[str, Any]:
        summary = session.summary
        return {
            "documents": [_display(f, session) for f in summary.files] if summary else [],
            "chunks": summary.chunks if summary else 0,
            "skipped": [{"path": Path(s.path).name, "reason": s.reason} for s in summary.skipped] if summary else [],
            "preloaded": preload is not None,
            "turns": len(session.history),
        }

    @app.get("/", include_in_schema=False)
    async def page(request: Request) -> FileResponse:
        session_of(request)  # the page's own requests then carry the cookie
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/api/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "queue": queue.waiting, "busy": queue.lock.locked()}

    @app.get("/api/session")
    async def get_session(request: Request) -> dict[str, Any]:
        return describe(session_of(request))

    @app.post("/api/documents")
    async def upload(request: Request, files: list[UploadFile]) -> dict[str, Any]:
        session = session_of(request)
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
        async with session.lock:
            session.uploads.mkdir(parents=True, exist_ok=True)
            for upload_file in files:
                name = _safe_name(upload_file.filename or "upload")
                data = await upload_file.read(config.max_file_bytes + 1)
                if len(data) > config.max_file_bytes:
                    raise HTTPException(413, f"{upload_file.filename!r} is larger than {_mib(config.max_file_bytes)}")
                (session.uploads / name).write_bytes(data)
            await _reindex(session, [session.uploads])
            return describe(session)

    @app.post("/api/folder")
    async def add_folder(request: Request, body: FolderBody) -> dict[str, Any]:
        if not config.allow_folders:
            raise HTTPException(403, "indexing server folders is disabled; upload the files instead")
        session = session_of(request)
        folder = Path(body.path).expanduser()
        if not folder.is_dir():
            raise HTTPException(404, f"no such folder on the server: {body.path}")
        async with session.lock:
            paths = [folder, session.uploads] if session.uploads.is_dir() else [folder]
            await _reindex(session, paths)
            return describe(session)

    @app.delete("/api/documents")
    async def reset(request: Request) -> dict[str, Any]:
        session = session_of(request)
        async with session.lock:
            session.reset()
        return describe(session)

    async def _reindex(session: Session, paths: list[Path]) -> None:
        try:
            answerer, summary = await asyncio.to_thread(backend.index, paths, session.root)
        except AppError as e:
            raise HTTPException(422, str(e)) from e
        session.answerer, session.summary = answerer, summary
        session.history.clear()

    @app.post("/api/ask")
    async def ask(request: Request, body: AskBody) -> Response:
        session = session_of(request)
        question = body.question.strip()
        if not question:
            raise HTTPException(422, "the question is empty")
        if len(question) > config.max_question_chars:
            raise HTTPException(413, f"the question is longer than {config.max_question_chars} characters")
        answerer = session.answerer or preload
        if answerer is None:
            raise HTTPException(409, "no documents yet: upload files or index a folder first")
        return EventStream(
            _answer(session, answerer, question),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _answer(session: Session, answerer: Answerer, question: str) -> AsyncIterator[str]:
        from ragspec.bridge import iterate_in_thread

        queue.waiting += 1
        acquired = False
        try:
            if queue.lock.locked():
                yield sse("queued", {"position": queue.waiting})  # answers ahead: the running one and those waiting before this
            try:
                await asyncio.wait_for(queue.lock.acquire(), config.queue_timeout_s)
                acquired = True
            except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11 on
                yield sse("error", {"message": f"the server is busy: no model free after {config.queue_timeout_s:g} s, try again"})
                return
            finally:
                queue.waiting -= 1
            history = list(session.history)
            events = iterate_in_thread(lambda: answerer.stream(question, history))
            deadline = time.monotonic() + config.answer_timeout_s
            try:
                while True:
                    try:
                        event = await asyncio.wait_for(anext(events), max(0.0, deadline - time.monotonic()))
                    except StopAsyncIteration:
                        break
                    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11 on
                        yield sse("error", {"message": f"the answer took longer than {config.answer_timeout_s:g} s and was stopped"})
                        return
                    if isinstance(event, Token):
                        yield sse("token", _live(event))
                    elif isinstance(event, Finished):
                        session.history.append((question, event.text))
                        yield sse(
                            "done",
                            {
                                "text": event.text,
                                "citations": [_shown(c.as_dict(), session) for c in event.citations],
                                "stats": event.stats.as_dict(),
                            },
                        )
            except AppError as e:
                yield sse("error", {"message": str(e)})
            except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, log the rest
                logger.exception("answer failed")
                yield sse("error", {"message": f"{type(e).__name__}: {e}"})
            finally:
                await events.aclose()
        finally:
            if acquired:
                queue.lock.release()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    return app


class _Guard:
    """Pure ASGI middleware (streams and disconnects pass through untouched).

    Sets the session cookie on the response of the request that created the session, and
    answers 413 to an upload whose declared size is over the limit before reading its body.
    """

    def __init__(self, app: Any, config: AppConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST" and scope["path"] == "/api/documents":
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.config.max_request_bytes:
                response = JSONResponse(
                    {"error": f"the upload is larger than {_mib(self.config.max_request_bytes)}"}, status_code=413
                )
                await response(scope, receive, send)
                return
        state = scope.setdefault("state", {})

        async def send_with_cookie(message: dict[str, Any]) -> None:
            new = state.get("new_session")
            if message["type"] == "http.response.start" and new:
                cookie = Response()
                cookie.set_cookie(COOKIE, new, httponly=True, samesite="strict", secure=self.config.secure_cookie)
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *[(k, v) for k, v in cookie.raw_headers if k == b"set-cookie"]]
            await send(message)

        await self.app(scope, receive, send_with_cookie)


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
    """A file name without folders or odd characters (the upload's own path is never trusted)."""
    name = Path(filename.replace("\\", "/")).name
    cleaned = "".join(c if c.isalnum() or c in "-_. " else "_" for c in name).strip(" .")
    return cleaned or "upload"


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    config: AppConfig | None = None,
    preload: Answerer | None = None,
    log_level: str = "info",
) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    config = config or AppConfig(allow_folders=is_loopback(host))
    uvicorn.run(create_app(config, preload=preload), host=host, port=port, log_level=log_level)
