"""What the web app's routers share (``WebState``): the config, the sessions, the model queue,
the indexing progress board and the back end, with the session handling every route uses."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import HTTPException, Request

from apps.collection import AppError, IndexSummary
from apps.web.config import AppConfig
from apps.web.queue import ModelQueue
from apps.web.sessions import Answerer, Indexer, Session, SessionLimitError, SessionStore
from retrievers.extras import MissingExtraError

if TYPE_CHECKING:
    from retrievers.ingest import SyncProgress

COOKIE = "ragspec_session"
PROGRESS_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
MAX_PROGRESS = 256
"""Most indexing runs whose progress is tracked at once (a run beyond that is not tracked)."""


class ApiError(HTTPException):
    """An error answered as ``{"error": message, "code": code}``."""

    def __init__(self, status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers=headers)
        self.code = code


class ProgressStore(Protocol):
    """Where indexing runs report their progress: this process (``ProgressBoard``) or a database that
    replicas share (``apps.web.pg_state.PgProgressBoard``)."""

    def get(self, run_id: str) -> dict[str, Any]:
        """``{"active": True, **latest snapshot}`` while the run is tracked, else ``{"active": False}``."""
        ...

    def track(self, run_id: str) -> AbstractContextManager[Callable[[SyncProgress], None] | None]:
        """A progress callback that records under `run_id` until the run ends; None for no (valid) id or a full board."""
        ...


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


@dataclass
class WebState:
    """One app's shared objects (``create_app`` makes it; routes read ``request.app.state.web``)."""

    config: AppConfig
    store: SessionStore
    queue: ModelQueue
    progress: ProgressStore
    indexer: Indexer
    preload: Answerer | None
    preloaded_documents: tuple[str, ...] = ()
    """The files of the preloaded index (``serve --index``), listed to sessions that have none of their own."""

    @property
    def gone(self) -> str:
        return f"your session expired (idle for more than {self.config.session_ttl_s / 60:g} min, or the server restarted)"

    @property
    def expired_message(self) -> str:
        return f"{self.gone} and its documents are gone: upload them again"

    @property
    def replaced_notice(self) -> str:
        return f"{self.gone}: its documents are gone, and only these are indexed now"

    def live_session(self, request: Request) -> Session | None:
        """The request's session; None without one. A cookie naming a gone session clears the cookie."""
        session = self.store.get(request.cookies.get(COOKIE))
        if session is None and COOKIE in request.cookies:
            request.state.session_cookie = "clear"
        return session

    def new_session(self, request: Request) -> Session:
        try:
            session = self.store.create()
        except SessionLimitError as e:
            raise ApiError(503, str(e), code="too_many_sessions", headers={"Retry-After": str(e.retry_after_s)}) from e
        request.state.session_cookie = session.id
        return session

    def session_for_change(self, request: Request) -> tuple[Session, list[str]]:
        """The session to change, made now if there is none (its earlier one may have expired)."""
        session = self.live_session(request)
        if session is not None:
            return session, []
        return self.new_session(request), [self.replaced_notice] if COOKIE in request.cookies else []

    @asynccontextmanager
    async def dropped_if_unused(self, request: Request, session: Session) -> AsyncIterator[None]:
        """Drop a session made for this request when the request fails before storing anything."""
        try:
            yield
        except BaseException:
            if getattr(request.state, "session_cookie", None) == session.id and not any(session.uploads.glob("*")):
                self.store.discard(session)
                request.state.session_cookie = None
            raise

    def describe(self, session: Session | None, notices: Sequence[str] = (), expired: bool = False) -> dict[str, Any]:
        summary = session.summary if session else None
        return {
            "documents": [display(f, session) for f in summary.files] if summary and session else [],
            "chunks": summary.chunks if summary else 0,
            "skipped": [{"path": Path(s.path).name, "reason": s.reason} for s in summary.skipped] if summary else [],
            "notices": list(notices),
            "update": session.update if session else None,
            "preloaded": self.preload is not None,
            "preloaded_documents": list(self.preloaded_documents) if not (summary and session) else [],
            "turns": len(session.history) if session else 0,
            **({"expired": True, "message": self.expired_message} if expired else {}),
        }

    async def reindex(self, session: Session, paths: list[Path], progress_id: str = "", added: Sequence[Path] = ()) -> None:
        """Index ``paths`` for the session (inside ``store.changing``); ``added``: the files just saved for it."""
        with self.progress.track(progress_id) as report:
            try:
                answerer, summary = await asyncio.to_thread(self.indexer.index, paths, session.root, report)
            except AppError as e:
                raise HTTPException(422, _without_session_paths(str(e), session.root)) from e
            except MissingExtraError as e:  # a server installed without the retrieval extra answers /v1, indexes nothing
                raise HTTPException(501, str(e)) from e
        session.update = _update(summary)
        await asyncio.to_thread(self.store.indexed, session, answerer, summary, added)


def web_state(request: Request) -> WebState:
    """The app's ``WebState`` (a FastAPI dependency)."""
    state: WebState = request.app.state.web
    return state


def _without_session_paths(message: str, root: Path) -> str:
    """``message`` with the session's folder left out: it names the server's temporary folder and
    holds the session id, which the HttpOnly cookie keeps from the page's scripts."""
    uploads = str(root / "uploads")
    return message.replace(uploads + os.sep, "").replace(uploads, "the uploaded files").replace(str(root), "the session folder")


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


def display(source: str, session: Session) -> str:
    """An uploaded file's path as its name in the uploads folder (this replica's or, for a session in a shared
    store, another replica's copy of it: ``.../<session folder>/uploads/NAME``); other sources as they are."""
    path = Path(source)
    if path.is_relative_to(session.uploads):
        return path.relative_to(session.uploads).as_posix()
    parts, marker = path.parts, (session.root.name, "uploads")
    for i in range(len(parts) - 2):
        if parts[i : i + 2] == marker:
            return Path(*parts[i + 2 :]).as_posix()
    return source
