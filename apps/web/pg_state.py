"""The web app's state in PostgreSQL, so that replicas of ``ragspec serve --store postgresql://...`` are
stateless and interchangeable: a browser's requests may land on any of them.

What lives in the database (tables made once, idempotently, by ``ensure_web_schema``):

- ``ragspec_web_sessions``: one row per session, keyed by the SHA-256 of its cookie (the cookie itself
  is never stored: reading the table does not give a way in), with its last use, the version of its
  documents and what the page shows of them (files, passages, skipped files, the last indexing).
- ``ragspec_web_turns``: the conversation, one row per turn in the order the turns were added. A turn
  is one ``INSERT``, so two replicas answering the same session at once both keep their turn.
- ``ragspec_web_uploads``: the uploaded files' bytes, so that any replica can index the session's
  files again (the next upload) and find them (its listing).
- ``ragspec_web_progress``: the latest progress of each indexing run, so that ``GET /api/progress``
  answers on any replica.

A session's documents are indexed into a collection of their own in the same database
(``apps.web.indexers.StoreIndexer``), which every replica opens. Each change is one
transaction with bound parameters only; a change of a session's documents holds the session's
advisory lock (``PgSessionStore.changing``), so uploads through two replicas take turns instead of
losing files. Texts are stored as JSON text (``\\u0000`` escaped), so a NUL byte or a lone surrogate
in a question or an answer is kept intact. What the process keeps (open collections, the files'
local copies under ``root``) is a cache the database can rebuild.

Where the answers of ``/v1`` retrieval conversations are remembered is ``apps.collection.Collection``'s
business: over a database collection it keeps them there too (``PgVectorStore.remember``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apps.collection import IndexSummary, Skipped
from apps.web.indexers import session_collection
from apps.web.sessions import Answerer, Indexer, Session, SessionLimitError
from apps.web.state import MAX_PROGRESS, PROGRESS_ID, ApiError
from retrievers.extras import needs

with needs("postgres", "the web app's sessions in PostgreSQL"):
    import psycopg
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool

if TYPE_CHECKING:
    from retrievers.ingest import SyncProgress

__all__ = ["PgProgressBoard", "PgSessionStore", "ensure_web_schema", "session_key"]

WEB_LOCK = 0x57_45_42  # "WEB": first key of a session's advisory lock (the second is hashtext of its key)
_ADMIN_LOCK = 0x57_45_41  # "WEA": first key of the locks below (a class of their own: hashtext may give any second key)
_SCHEMA_LOCK = (_ADMIN_LOCK, 0)
"""Serializes creating the tables and creating sessions (which counts them)."""
_PROGRESS_LOCK = (_ADMIN_LOCK, 1)
"""Serializes starting to track a run (which counts them)."""
KEY_CHARS = 32
"""Characters of the key that name a session's folder and collection (128 bits of the SHA-256)."""
LOCK_WAIT_S = 600.0
"""Longest a change to a session's documents waits for another one (through any replica) to finish."""
PROGRESS_EVERY_S = 0.2
"""Most often one run's progress is written to the database (the last word before it ends is kept)."""
PROGRESS_STALE_S = 3600.0
"""A run not heard of for this long (its replica died) leaves the board."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ragspec_web_sessions (
    key text PRIMARY KEY,
    created timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_used timestamptz NOT NULL DEFAULT clock_timestamp(),
    version integer NOT NULL DEFAULT 0,
    documents text
);
CREATE TABLE IF NOT EXISTS ragspec_web_turns (
    session text NOT NULL REFERENCES ragspec_web_sessions ON DELETE CASCADE,
    n bigserial,
    turn text NOT NULL,
    PRIMARY KEY (session, n)
);
CREATE TABLE IF NOT EXISTS ragspec_web_uploads (
    session text NOT NULL REFERENCES ragspec_web_sessions ON DELETE CASCADE,
    name text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session, name)
);
CREATE TABLE IF NOT EXISTS ragspec_web_progress (
    id text PRIMARY KEY,
    snapshot jsonb NOT NULL,
    updated timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def session_key(session_id: str) -> str:
    """What the database knows a session by: the SHA-256 of its cookie, in hex."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def ensure_web_schema(url: str) -> None:
    """The web app's tables, made once (an advisory lock keeps two replicas starting together from racing)."""
    with psycopg.connect(url, autocommit=False) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _SCHEMA_LOCK)
        conn.execute(_SCHEMA)


class Opener(Protocol):
    """A back end that can open the answerer of documents another replica indexed (``apps.web.indexers.StoreIndexer``)."""

    def open(self, workdir: Path) -> Answerer: ...


class PgSessionStore:
    """Sessions in PostgreSQL at ``url`` (see the module docstring); ``indexer`` indexes their files.

    ``root`` holds this replica's copies of the sessions' files (default: a folder of the system's
    temporary folder; copies are remade from the database when missing). ``SessionStore``'s contract.
    """

    def __init__(
        self, url: str, indexer: Indexer, root: Path | None = None, *, max_sessions: int = 32, ttl_s: float = 3600.0,
        pool_size: int = 4,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.url = url
        self.indexer = indexer
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="ragspec-web-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        ensure_web_schema(url)
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=True, kwargs={"autocommit": True})
        self._sessions: dict[str, Session] = {}  # this replica's copies, by key: a cache of the database
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM ragspec_web_sessions WHERE last_used > clock_timestamp() - make_interval(secs => %s)",
                (self.ttl_s,),
            ).fetchone()
        return int(row[0]) if row else 0

    # --- sessions -----------------------------------------------------------------------

    def get(self, session_id: str | None) -> Session | None:
        if not session_id or len(session_id) > 256:
            return None
        key = session_key(session_id)
        with self._pool.connection() as conn:
            row = conn.execute(
                "UPDATE ragspec_web_sessions SET last_used = clock_timestamp() "
                "WHERE key = %s AND last_used > clock_timestamp() - make_interval(secs => %s) RETURNING version, documents",
                (key, self.ttl_s),
            ).fetchone()
            turns = conn.execute("SELECT turn FROM ragspec_web_turns WHERE session = %s ORDER BY n", (key,)).fetchall() if row else []
        if row is None:
            with self._lock:
                dropped = self._sessions.pop(key, None)
            if dropped is not None:
                shutil.rmtree(dropped.root, ignore_errors=True)
            return None
        session = self._local(session_id, key)
        session.history = [tuple(json.loads(t)) for (t,) in turns]  # type: ignore[misc]
        if session.version != row[0]:
            self._load_documents(session, int(row[0]), row[1])
        session.last_used = time.monotonic()
        return session

    def create(self) -> Session:
        session_id = secrets.token_urlsafe(24)
        key = session_key(session_id)
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _SCHEMA_LOCK)  # one create at a time counts the sessions
            expired = conn.execute(
                "DELETE FROM ragspec_web_sessions WHERE last_used <= clock_timestamp() - make_interval(secs => %s) RETURNING key",
                (self.ttl_s,),
            ).fetchall()
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM clock_timestamp() - min(last_used)) FROM ragspec_web_sessions"
            ).fetchone()
            full = row is not None and row[0] >= self.max_sessions
            if not full:
                conn.execute("INSERT INTO ragspec_web_sessions (key) VALUES (%s)", (key,))
        for (gone,) in expired:
            self._drop_documents(gone)
        if full:
            assert row is not None
            raise SessionLimitError(self.max_sessions, max(1, int(self.ttl_s - float(row[1])) + 1))
        session = self._local(session_id, key)
        session.root.mkdir(parents=True, exist_ok=True)
        return session

    def discard(self, session: Session) -> None:
        key = session_key(session.id)
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM ragspec_web_sessions WHERE key = %s", (key,))
        self._drop_documents(key)

    # --- changes ------------------------------------------------------------------------

    @asynccontextmanager
    async def changing(self, session: Session) -> AsyncIterator[None]:
        """This process's lock, then the session's advisory lock in the database (held on a connection of
        its own until the change ends, at most ``LOCK_WAIT_S`` waited for); the session's files are then
        copied in from the database. A request cancelled while it waits leaves no lock behind."""
        key = session_key(session.id)
        async with session.lock:
            taking = asyncio.ensure_future(asyncio.to_thread(self._lock_session, key))
            try:
                conn = await asyncio.shield(taking)
            except asyncio.CancelledError:  # the thread goes on: give the lock back once it has it
                taking.add_done_callback(lambda t: None if t.cancelled() or t.exception() else self._unlock_session(t.result(), key))
                raise
            try:
                await asyncio.to_thread(self._refresh, session)
                yield
            finally:
                await asyncio.to_thread(self._unlock_session, conn, key)  # finishes in its thread even if cancelled

    def _lock_session(self, key: str) -> psycopg.Connection[Any]:
        conn = self._pool.getconn()
        try:
            with conn.transaction():  # the advisory lock is the connection's: it outlives this transaction
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{LOCK_WAIT_S:g}s",))
                conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (WEB_LOCK, key))
        except psycopg.errors.LockNotAvailable as e:
            self._pool.putconn(conn)
            raise ApiError(503, f"another change to this session's documents has taken more than {LOCK_WAIT_S:g} s; "
                                "try again later", code="session_busy", headers={"Retry-After": "30"}) from e  # fmt: skip
        except BaseException:
            self._pool.putconn(conn)
            raise
        return conn

    def _unlock_session(self, conn: psycopg.Connection[Any], key: str) -> None:
        try:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (WEB_LOCK, key))
        finally:
            self._pool.putconn(conn)

    def indexed(self, session: Session, answerer: Answerer, summary: IndexSummary, added: Sequence[Path] = ()) -> None:
        key = session_key(session.id)
        with self._pool.connection() as conn, conn.transaction():
            for path in added:
                conn.execute(
                    "INSERT INTO ragspec_web_uploads (session, name, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (session, name) DO UPDATE SET data = EXCLUDED.data",
                    (key, path.name, path.read_bytes()),
                )  # fmt: skip
            row = conn.execute(
                "UPDATE ragspec_web_sessions SET version = version + 1, documents = %s, last_used = clock_timestamp() "
                "WHERE key = %s RETURNING version",
                (_dump_documents(summary, session), key),
            ).fetchone()
            if row is None:
                raise ApiError(410, "your session expired while its documents were indexed: upload them again", code="session_expired")
            conn.execute("DELETE FROM ragspec_web_turns WHERE session = %s", (key,))
        if session.answerer is not answerer:
            _close(session.answerer)
        session.answerer, session.summary, session.version = answerer, summary, int(row[0])
        session.history.clear()

    def add_turn(self, session: Session, question: str, answer: str) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO ragspec_web_turns (session, turn) SELECT key, %s FROM ragspec_web_sessions WHERE key = %s",
                (json.dumps([question, answer]), session_key(session.id)),
            )  # fmt: skip
        session.history.append((question, answer))

    def clear_history(self, session: Session) -> None:
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM ragspec_web_turns WHERE session = %s", (session_key(session.id),))
        session.history.clear()

    def reset(self, session: Session) -> None:
        key = session_key(session.id)
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM ragspec_web_uploads WHERE session = %s", (key,))
            conn.execute("DELETE FROM ragspec_web_turns WHERE session = %s", (key,))
            row = conn.execute(
                "UPDATE ragspec_web_sessions SET version = version + 1, documents = NULL WHERE key = %s RETURNING version", (key,)
            ).fetchone()
        _close(session.answerer)
        session.forget()
        session.version = int(row[0]) if row else session.version
        _drop_collection(self.url, session_collection(key[:KEY_CHARS]))

    def close(self) -> None:
        self._pool.close()
        with self._lock:
            for session in self._sessions.values():
                _close(session.answerer)
            self._sessions.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- this replica's copies ----------------------------------------------------------

    def _local(self, session_id: str, key: str) -> Session:
        """This replica's copy of the session (made now if it has none); copies idle here longer than ``ttl_s``
        are let go (the session may live on through other replicas: a later request here reloads it)."""
        now = time.monotonic()
        with self._lock:
            idle = [k for k, s in self._sessions.items() if k != key and now - s.last_used > self.ttl_s]
            dropped = [self._sessions.pop(k) for k in idle]
            session = self._sessions.get(key)
            if session is None:
                session = self._sessions[key] = Session(session_id, self.root / key[:KEY_CHARS], last_used=now)
        for gone in dropped:
            _close(gone.answerer)
            shutil.rmtree(gone.root, ignore_errors=True)
        return session

    def _refresh(self, session: Session) -> None:
        """The session's files and documents as the database has them now (inside its lock)."""
        key = session_key(session.id)
        with self._pool.connection() as conn:
            row = conn.execute("SELECT version, documents FROM ragspec_web_sessions WHERE key = %s", (key,)).fetchone()
            files = conn.execute("SELECT name, data FROM ragspec_web_uploads WHERE session = %s", (key,)).fetchall()
        shutil.rmtree(session.uploads, ignore_errors=True)
        if files:
            session.uploads.mkdir(parents=True)
            for name, data in files:
                (session.uploads / Path(name).name).write_bytes(data)
        if row is not None and session.version != row[0]:
            self._load_documents(session, int(row[0]), row[1], copied=True)

    def _load_documents(self, session: Session, version: int, documents: str | None, copied: bool = False) -> None:
        """Take the documents another replica indexed: what the page lists, and their answerer."""
        _close(session.answerer)
        session.answerer = session.summary = session.update = None
        if documents is not None:
            session.summary, session.update = _load_summary(documents, session)
            if hasattr(self.indexer, "open"):
                opener: Opener = self.indexer  # type: ignore[assignment]
                session.answerer = opener.open(session.root)
            else:  # a back end that keeps its index in this process: index the stored files here too
                if not copied:
                    self._refresh(session)
                session.answerer, _ = self.indexer.index([session.uploads], session.root)
        session.version = version

    def _drop_documents(self, key: str) -> None:
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is not None:
            _close(session.answerer)
        shutil.rmtree(self.root / key[:KEY_CHARS], ignore_errors=True)
        _drop_collection(self.url, session_collection(key[:KEY_CHARS]))


def _close(answerer: Answerer | None) -> None:
    """Let go of an answerer's connections (a ``Collection``'s pool), if it holds any."""
    close = getattr(answerer, "close", None)
    if callable(close):
        close()


def _drop_collection(url: str, name: str) -> None:
    from retrievers.pg_schema import drop_collection

    drop_collection(url, name)


def _dump_documents(summary: IndexSummary, session: Session) -> str:
    """What the page shows of the documents, as JSON text: uploaded files by their name (each replica has its
    own folder), other sources as they are."""
    files = [("upload", Path(f).relative_to(session.uploads).as_posix()) if Path(f).is_relative_to(session.uploads)
             else ("path", str(f)) for f in summary.files]  # fmt: skip
    return json.dumps({
        "files": files, "chunks": summary.chunks, "skipped": [[s.path, s.reason] for s in summary.skipped],
        "update": session.update,
    })  # fmt: skip


def _load_summary(text: str, session: Session) -> tuple[IndexSummary, dict[str, Any] | None]:
    data = json.loads(text)
    files = [str(session.uploads / name) if kind == "upload" else name for kind, name in data["files"]]
    return IndexSummary(files=files, chunks=int(data["chunks"]), skipped=[Skipped(p, r) for p, r in data["skipped"]]), data["update"]


class PgProgressBoard:
    """The progress of indexing runs in PostgreSQL at ``url``, readable from every replica (``ProgressStore``)."""

    def __init__(self, url: str, limit: int = MAX_PROGRESS, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.limit = limit
        self.clock = clock
        ensure_web_schema(url)
        self._pool = ConnectionPool(url, min_size=1, max_size=2, open=True, kwargs={"autocommit": True})

    def get(self, run_id: str) -> dict[str, Any]:
        if not PROGRESS_ID.fullmatch(run_id):
            return {"active": False}
        with self._pool.connection() as conn:
            row = conn.execute("SELECT snapshot FROM ragspec_web_progress WHERE id = %s", (run_id,)).fetchone()
        return {"active": True, **row[0]} if row is not None else {"active": False}

    @contextmanager
    def track(self, run_id: str) -> Iterator[Callable[[SyncProgress], None] | None]:
        tracked = False
        if PROGRESS_ID.fullmatch(run_id):
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _PROGRESS_LOCK)  # one start at a time counts the runs
                conn.execute("DELETE FROM ragspec_web_progress WHERE updated < clock_timestamp() - make_interval(secs => %s)",
                             (PROGRESS_STALE_S,))  # fmt: skip
                tracked = conn.execute(
                    "INSERT INTO ragspec_web_progress (id, snapshot) SELECT %s, %s "
                    "WHERE (SELECT count(*) FROM ragspec_web_progress) < %s ON CONFLICT (id) DO NOTHING RETURNING id",
                    (run_id, Jsonb({"stage": "starting"}), self.limit),
                ).fetchone() is not None  # fmt: skip
        if not tracked:
            yield None
            return
        last = [-PROGRESS_EVERY_S]

        def report(progress: SyncProgress) -> None:
            now = self.clock()
            if now - last[0] < PROGRESS_EVERY_S:
                return
            last[0] = now
            with self._pool.connection() as conn:
                conn.execute("UPDATE ragspec_web_progress SET snapshot = %s, updated = clock_timestamp() WHERE id = %s",
                             (Jsonb(progress.as_dict()), run_id))  # fmt: skip

        try:
            yield report
        finally:
            with self._pool.connection() as conn:
                conn.execute("DELETE FROM ragspec_web_progress WHERE id = %s", (run_id,))

    def close(self) -> None:
        self._pool.close()
