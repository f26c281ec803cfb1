"""Per-browser sessions: each has its own upload folder, index and conversation.

A session is named by a random id kept in an HttpOnly cookie; nothing one session uploads or
asks is reachable from another. Sessions idle longer than ``ttl_s`` are dropped together with
their files. At most ``max_sessions`` live at once: beyond that ``create`` raises
``SessionLimitError`` (the web app answers 503) instead of dropping a session someone is using.

Where sessions live is a ``SessionStore``: this process's memory (``MemorySessionStore``, the
default) or a PostgreSQL database that several replicas of the app share
(``apps.web.pg_state.PgSessionStore``, ``ragspec serve --store postgresql://...``). The routes
change a session only through its store.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apps.collection import Event, IndexSummary

if TYPE_CHECKING:
    from retrievers.ingest import SyncProgress


class Answerer(Protocol):
    """Answers questions over one set of documents (``apps.collection.Collection`` is one)."""

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Generator[Event, None, None]:
        """``Token`` events, then the ``Answer``; closing the generator early stops the answer."""
        ...


class Indexer(Protocol):
    """Turns files into an ``Answerer``; the web app calls it in a worker thread."""

    def index(
        self, paths: Sequence[Path], workdir: Path, progress: Callable[[SyncProgress], None] | None = None
    ) -> tuple[Answerer, IndexSummary]:
        """Index ``paths`` (keeping what it needs under ``workdir``), reporting to ``progress`` as it goes."""
        ...


@dataclass
class Session:
    """One browser's documents and conversation."""

    id: str
    root: Path
    answerer: Answerer | None = None
    summary: IndexSummary | None = None
    update: dict[str, Any] | None = None
    """What the last indexing did, for the page's status line (``apps.web.state.WebState.reindex`` sets it)."""
    history: list[tuple[str, str]] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the session's documents change, so two uploads never interleave (in this process;
    a shared store adds a lock in its database: ``SessionStore.changing``)."""
    last_used: float = 0.0
    """When a request last used it, by its store's clock."""
    version: int = 0
    """How many times its documents changed (a shared store's replicas reload them when theirs is older)."""

    @property
    def uploads(self) -> Path:
        return self.root / "uploads"

    def forget(self) -> None:
        """Forget the documents and the conversation here (the store keeps what it shares)."""
        shutil.rmtree(self.uploads, ignore_errors=True)
        shutil.rmtree(self.root / "index", ignore_errors=True)
        self.answerer = None
        self.summary = None
        self.update = None
        self.history.clear()


class SessionLimitError(RuntimeError):
    """Every session slot is taken by a session that is still in use."""

    def __init__(self, max_sessions: int, retry_after_s: int) -> None:
        super().__init__(
            f"the server already holds {max_sessions} active sessions, its limit; "
            f"try again in {retry_after_s} s (an idle session expires) or ask its operator to raise the limit"
        )
        self.retry_after_s = retry_after_s


class SessionStore(Protocol):
    """Where sessions live, and the only way routes change one (so that a shared store can write it through)."""

    max_sessions: int
    ttl_s: float

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (its cookie), or None (unknown, expired or malformed id)."""
        ...

    def create(self) -> Session:
        """A new session; ``SessionLimitError`` when ``max_sessions`` are live (none is evicted)."""
        ...

    def discard(self, session: Session) -> None:
        """Drop a session and its files now (one made for a request that then failed)."""
        ...

    def changing(self, session: Session) -> AbstractAsyncContextManager[None]:
        """Held while the session's documents change: one change at a time, with its files under
        ``session.uploads`` as the store holds them."""
        ...

    def indexed(self, session: Session, answerer: Answerer, summary: IndexSummary, added: Sequence[Path] = ()) -> None:
        """The documents (``added``: the files just saved under ``session.uploads``) are now answered by
        ``answerer``; the conversation starts over. Called from a worker thread."""
        ...

    def add_turn(self, session: Session, question: str, answer: str) -> None:
        """Append a turn to the conversation."""
        ...

    def clear_history(self, session: Session) -> None:
        """Start the conversation over; the documents stay."""
        ...

    def reset(self, session: Session) -> None:
        """Forget the documents and the conversation (inside ``changing``)."""
        ...

    def close(self) -> None:
        """Let go of what the store holds in this process."""
        ...


class MemorySessionStore:
    """Sessions by id in this process, bounded in number and idle time (measured by ``clock``, in seconds)."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        max_sessions: int = 32,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="ragspec-web-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, or None (unknown, expired or malformed id)."""
        with self._lock:
            self._expire()
            session = self._sessions.get(session_id or "")
            if session is not None:
                session.last_used = self.clock()
            return session

    def create(self) -> Session:
        """A new session; ``SessionLimitError`` when ``max_sessions`` are live (none is evicted)."""
        with self._lock:
            self._expire()
            if len(self._sessions) >= self.max_sessions:
                oldest = min(s.last_used for s in self._sessions.values())
                raise SessionLimitError(self.max_sessions, max(1, math.ceil(self.ttl_s - (self.clock() - oldest))))
            session_id = secrets.token_urlsafe(24)
            root = self.root / session_id
            root.mkdir()
            session = self._sessions[session_id] = Session(session_id, root, last_used=self.clock())
            return session

    def discard(self, session: Session) -> None:
        """Drop a session and its files now (one made for a request that then failed)."""
        with self._lock:
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]
        shutil.rmtree(session.root, ignore_errors=True)

    @asynccontextmanager
    async def changing(self, session: Session) -> AsyncIterator[None]:
        async with session.lock:
            yield

    def indexed(self, session: Session, answerer: Answerer, summary: IndexSummary, added: Sequence[Path] = ()) -> None:
        session.answerer, session.summary = answerer, summary
        session.history.clear()

    def add_turn(self, session: Session, question: str, answer: str) -> None:
        session.history.append((question, answer))

    def clear_history(self, session: Session) -> None:
        session.history.clear()

    def reset(self, session: Session) -> None:
        session.forget()

    def _expire(self) -> None:
        now = self.clock()
        for session_id in [s.id for s in self._sessions.values() if now - s.last_used > self.ttl_s]:
            shutil.rmtree(self._sessions.pop(session_id).root, ignore_errors=True)

    def close(self) -> None:
        """Drop every session and, when this store made its folder, the folder."""
        with self._lock:
            for session in self._sessions.values():
                shutil.rmtree(session.root, ignore_errors=True)
            self._sessions.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
