"""Two replicas of the web app over ONE real PostgreSQL (the session's `pg_server`): each a FastAPI app with its
own sessions folder, served by uvicorn on its own port. A browser's requests may land on either: the
conversation, the uploads (listed, searched, indexing progress) and the session itself are the database's.

Uploads are indexed for real into the session's collection (``StoreIndexer``, deterministic fake
embeddings); answers are scripted, citing the passage the collection finds for the question, so that
"searchable on the other replica" is checked without a model.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

import psycopg  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402

from apps.collection import Event, Token  # noqa: E402
from apps.web.indexers import StoreIndexer, session_collection  # noqa: E402
from apps.web.server import AppConfig, create_app  # noqa: E402
from retrievers.pg_store import PgVectorStore  # noqa: E402
from tests.apps.conftest import LiveServer  # noqa: E402
from tests.apps.fakes import fake_answer  # noqa: E402
from tests.apps.test_web_server import ask  # noqa: E402

pytestmark = pytest.mark.timeout(300)

EMBEDDINGS = DeterministicFakeEmbedding(size=8)
HOSTILE_NAME = "x'); DROP TABLE ragspec_web_sessions; --\x00.md"
HOSTILE_TEXT = "Robert'); DROP TABLE ragspec_web_turns; -- says hi \\u0000 and 'quotes' \"too\"."


@dataclass
class Heard:
    """What every replica's answerers were asked: (replica, question, history)."""

    asked: list[tuple[str, str, list[tuple[str, str]]]] = field(default_factory=list)


@dataclass
class SearchingAnswerer:
    """Answers with ``words``, citing the passage the session's collection finds first for the question (by its keywords)."""

    store: PgVectorStore
    replica: str
    heard: Heard
    words: Sequence[str]

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        self.heard.asked.append((self.replica, question, list(history)))
        found = self.store.keyword_search(question, k=1)  # the fake embeddings rank at random: keywords decide
        for i, word in enumerate(self.words):
            yield Token(word, 0.01 * (i + 1), i + 1, i + 1)
        sources = [(d.document.metadata["source"], "passage", d.document.page_content) for d in found]
        yield fake_answer("".join(self.words), sources, question=question)

    def close(self) -> None:
        self.store.close()


@dataclass
class ReplicaIndexer(StoreIndexer):
    """``StoreIndexer`` (real indexing into the session's collection) with scripted answers; ``gate``, when set,
    holds the indexing after its first progress report until it is set."""

    replica: str = ""
    heard: Heard = field(default_factory=Heard)
    words: Sequence[str] = ("It", " lasts", " six", " months", " [1]", ".")
    gate: threading.Event | None = None

    def index(self, paths, workdir, progress=None):  # type: ignore[no-untyped-def]
        if self.gate is not None and progress is not None:
            from retrievers.ingest import SyncProgress

            progress(SyncProgress("embed", chunks_done=3, chunks_total=7, elapsed_s=1.0))
            assert self.gate.wait(60)
        return super().index(paths, workdir, progress)

    def open(self, workdir: Path) -> SearchingAnswerer:  # type: ignore[override]
        store = PgVectorStore(self.url, EMBEDDINGS, collection=session_collection(workdir.name))
        return SearchingAnswerer(store, self.replica, self.heard, self.words)


@dataclass
class Replicas:
    a: LiveServer
    b: LiveServer
    backends: tuple[ReplicaIndexer, ReplicaIndexer]
    heard: Heard
    url: str


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[Replicas]:
    heard = Heard()
    backends = tuple(ReplicaIndexer(url=pg_url, embeddings=EMBEDDINGS, replica=name, heard=heard) for name in "ab")
    apps = [create_app(AppConfig(), indexer=backend, sessions_root=tmp_path / backend.replica, state_url=pg_url)
            for backend in backends]  # fmt: skip
    with LiveServer(apps[0]) as a, LiveServer(apps[1]) as b:
        yield Replicas(a, b, backends, heard, pg_url)  # type: ignore[arg-type]


def browser(server: LiveServer, cookies: httpx.Cookies | None = None) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=60, cookies=cookies)


def upload(client: httpx.Client, name: str, body: bytes, progress: str = "") -> httpx.Response:
    return client.post("/api/documents" + (f"?progress={progress}" if progress else ""), files=[("files", (name, body, "text/markdown"))])


def test_a_conversation_started_on_one_replica_continues_on_the_other(replicas: Replicas) -> None:
    with browser(replicas.a) as on_a:
        assert upload(on_a, "trial.md", b"# Trial\n\nThe trial lasts six months.\n").status_code == 200
        first = ask(on_a, "How long is the trial?")
        with browser(replicas.b, on_a.cookies) as on_b:
            session = on_b.get("/api/session").json()
            assert session["documents"] == ["trial.md"] and session["turns"] == 1 and session["chunks"] >= 1
            second = ask(on_b, "And the trial after that?")
        third = ask(on_a, "Who runs it?")
    assert [e for e, _ in first][-1] == [e for e, _ in second][-1] == [e for e, _ in third][-1] == "done"
    answer = "It lasts six months [1]."
    assert replicas.heard.asked == [
        ("a", "How long is the trial?", []),
        ("b", "And the trial after that?", [("How long is the trial?", answer)]),
        ("a", "Who runs it?", [("How long is the trial?", answer), ("And the trial after that?", answer)]),
    ]
    done = dict(second)["done"]
    assert [c["source"] for c in done["citations"]] == ["trial.md"]  # replica b found a's passage, shown by its name
    assert "The trial lasts six months." in done["citations"][0]["text"]


def test_an_upload_on_one_replica_is_listed_searched_and_extended_on_the_other(replicas: Replicas) -> None:
    with browser(replicas.a) as on_a, browser(replicas.b) as on_b:
        assert upload(on_a, "ferry.md", b"# Ferry\n\nThe ferry leaves at nine every morning.\n").status_code == 200
        on_b.cookies = on_a.cookies
        assert on_b.get("/api/session").json()["documents"] == ["ferry.md"]
        # an upload on b adds to what a uploaded (b copies a's file from the database first)
        listed = upload(on_b, "bus.md", b"# Bus\n\nThe bus comes every hour on the hour.\n").json()
        assert sorted(listed["documents"]) == ["bus.md", "ferry.md"]
        assert sorted(on_a.get("/api/session").json()["documents"]) == ["bus.md", "ferry.md"]
        for client, question, source in ((on_a, "When does the bus come?", "bus.md"), (on_b, "ferry nine morning", "ferry.md")):
            citations = dict(ask(client, question))["done"]["citations"]
            assert [c["source"] for c in citations] == [source], question
        # forgetting them on a forgets them everywhere, the session's collection included
        key = hashlib.sha256(on_a.cookies["ragspec_session"].encode()).hexdigest()
        assert on_a.delete("/api/documents").json()["documents"] == []
        assert on_b.get("/api/session").json() == on_a.get("/api/session").json()
        assert on_b.get("/api/session").json()["documents"] == []
    with psycopg.connect(replicas.url) as conn:
        assert conn.execute("SELECT count(*) FROM ragspec_collections WHERE name = %s",
                            (session_collection(key[:32]),)).fetchone() == (0,)  # fmt: skip
        assert conn.execute("SELECT count(*) FROM ragspec_web_uploads").fetchone() == (0,)


def test_indexing_progress_on_one_replica_is_visible_on_the_other(replicas: Replicas) -> None:
    gate = threading.Event()
    replicas.backends[0].gate = gate
    run = "run_" + "x" * 20
    result: list[httpx.Response] = []
    with browser(replicas.a) as on_a, browser(replicas.b) as on_b:
        worker = threading.Thread(target=lambda: result.append(upload(on_a, "slow.md", b"# Slow\n\nIt takes a while.\n", run)))
        worker.start()
        try:
            deadline = time.monotonic() + 30
            while (seen := on_b.get("/api/progress", params={"id": run}).json())["active"] is False or "chunks_done" not in seen:
                assert time.monotonic() < deadline, seen
                time.sleep(0.05)
            assert (seen["stage"], seen["chunks_done"], seen["chunks_total"]) == ("embed", 3, 7)
        finally:
            gate.set()
            worker.join(60)
        assert result[0].status_code == 200
        assert on_b.get("/api/progress", params={"id": run}).json() == {"active": False}


def test_turns_asked_at_once_on_both_replicas_are_all_kept(replicas: Replicas) -> None:
    with browser(replicas.a) as on_a:
        assert upload(on_a, "trial.md", b"# Trial\n\nThe trial lasts six months.\n").status_code == 200
        cookies = on_a.cookies
    questions = [f"question {i}?" for i in range(6)]

    def asker(i: int) -> None:
        with browser((replicas.a, replicas.b)[i % 2], cookies) as client:
            assert dict(ask(client, questions[i]))["done"]

    threads = [threading.Thread(target=asker, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with browser(replicas.b, cookies) as on_b:
        assert on_b.get("/api/session").json()["turns"] == len(questions)
        on_b.delete("/api/conversation")
    with browser(replicas.a, cookies) as on_a:
        assert on_a.get("/api/session").json()["turns"] == 0


def test_hostile_names_and_texts_are_stored_intact_and_the_cookie_is_not(replicas: Replicas) -> None:
    words = ("Robert'); DROP TABLE ragspec_web_turns; --", " \x00", " ok")
    for backend in replicas.backends:
        backend.words = words
    with browser(replicas.a) as on_a:
        binary = upload(on_a, "nul.md", b"text with a \x00 NUL byte")  # refused clearly, and nothing kept
        assert binary.status_code == 422 and "contains NUL bytes" in binary.json()["error"]
        response = upload(on_a, HOSTILE_NAME, HOSTILE_TEXT.encode())
        listed = response.json()
        assert response.status_code == 200, listed
        (name,) = listed["documents"]
        assert "\x00" not in name and name.endswith(".md")  # saved under a safe name, said in a notice
        question = "'; DELETE FROM ragspec_web_sessions; --"
        assert dict(ask(on_a, question))["done"]
        cookie = on_a.cookies["ragspec_session"]
        with browser(replicas.b, on_a.cookies) as on_b:
            assert on_b.get("/api/session").json()["documents"] == [name]
            assert dict(ask(on_b, "Robert quotes"))["done"]
    assert replicas.heard.asked[1] == ("b", "Robert quotes", [(question, "".join(words))])  # the NUL intact
    with psycopg.connect(replicas.url) as conn:
        keys = [k for (k,) in conn.execute("SELECT key FROM ragspec_web_sessions").fetchall()]
        assert keys == [hashlib.sha256(cookie.encode()).hexdigest()]
        (data,) = conn.execute("SELECT data FROM ragspec_web_uploads").fetchone()  # type: ignore[misc]
        assert bytes(data) == HOSTILE_TEXT.encode()  # the bytes as uploaded
        dump = "".join(str(row) for row in conn.execute("SELECT * FROM ragspec_web_sessions").fetchall())
        assert cookie not in dump


def test_a_gone_session_is_gone_on_every_replica(replicas: Replicas) -> None:
    with browser(replicas.a) as on_a:
        assert upload(on_a, "trial.md", b"# Trial\n\nThe trial lasts six months.\n").status_code == 200
        cookies = on_a.cookies
    with psycopg.connect(replicas.url) as conn:
        conn.execute("UPDATE ragspec_web_sessions SET last_used = last_used - interval '2 hours'")
    with browser(replicas.b, cookies) as on_b:
        r = on_b.post("/api/ask", json={"question": "still there?"})
        assert r.status_code == 410 and r.json()["code"] == "session_expired"
    with browser(replicas.a, cookies) as on_a:
        assert on_a.get("/api/session").json()["expired"] is True  # a's copy of it is gone too
    with browser(replicas.b, httpx.Cookies({"ragspec_session": "x" * 1000})) as forged:
        assert forged.get("/api/session").json()["expired"] is True


def test_uploads_at_once_through_both_replicas_take_turns_and_keep_every_file(replicas: Replicas) -> None:
    gate = threading.Event()
    with browser(replicas.a) as on_a:
        assert upload(on_a, "first.md", b"# First\n\nThe first note is about apples.\n").status_code == 200
        cookies = on_a.cookies
    replicas.backends[0].gate = gate  # a's next indexing waits after its first progress report
    results: dict[str, httpx.Response] = {}

    def send(replica: str, name: str, body: bytes) -> None:
        with browser(replicas.a if replica == "a" else replicas.b, cookies) as client:
            results[replica] = upload(client, name, body, "run_" + replica * 20)

    slow = threading.Thread(target=send, args=("a", "apples.md", b"# Apples\n\nApples grow on trees in the orchard.\n"))
    slow.start()
    try:
        with browser(replicas.b) as watcher:  # a holds the session's lock now
            deadline = time.monotonic() + 30
            while not watcher.get("/api/progress", params={"id": "run_" + "a" * 20}).json()["active"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        fast = threading.Thread(target=send, args=("b", "pears.md", b"# Pears\n\nPears ripen after they are picked.\n"))
        fast.start()
        time.sleep(1.0)
        assert "b" not in results  # b waits for a's change to end
    finally:
        gate.set()
        slow.join(60)
    fast.join(60)
    assert results["a"].status_code == results["b"].status_code == 200
    assert sorted(results["b"].json()["documents"]) == ["apples.md", "first.md", "pears.md"]
    with browser(replicas.a, cookies) as on_a:
        assert sorted(on_a.get("/api/session").json()["documents"]) == ["apples.md", "first.md", "pears.md"]
        for question, source in (("apples orchard trees", "apples.md"), ("pears ripen picked", "pears.md")):
            assert [c["source"] for c in dict(ask(on_a, question))["done"]["citations"]] == [source]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_two_serve_processes_over_one_database_serve_one_user(pg_url: str, tmp_path: Path) -> None:
    """The real thing: ``ragspec serve --store URL`` twice (the default models), one browser alternating between them."""
    from apps import cli
    from tests.apps.ragspec_server import ServeProcess

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ferry.md").write_text("# Ferry\n\nThe ferry to the island leaves at nine in the morning.\n")
    assert cli.main(["ingest", str(docs), "--store", pg_url, "--collection", "notes", "--no-progress"]) == 0
    replicas = [ServeProcess("--store", pg_url, "--collection", "notes", "--max-tokens", "24") for _ in range(2)]
    try:
        a, b = (p.wait_ready() for p in replicas)
        with httpx.Client(base_url=a.url, timeout=300) as on_a:
            listed = upload(on_a, "trial.md", b"# Trial\n\nThe trial of the new drug lasts six months.\n").json()
            assert listed["documents"] == ["trial.md"]
            first = dict(ask(on_a, "How long does the trial last?"))["done"]
            with httpx.Client(base_url=b.url, timeout=300, cookies=on_a.cookies) as on_b:
                assert on_b.get("/api/session").json()["turns"] == 1
                second = dict(ask(on_b, "And how long does the trial of the drug last?"))["done"]
            for done in (first, second):  # what the model cites is its own; it can only be the session's upload
                assert done["text"] and all(c["source"] == "trial.md" for c in done["citations"])
            assert on_a.get("/api/session").json()["turns"] == 2
    finally:
        for process in replicas:
            process.stop()


def test_the_session_limit_counts_every_replicas_sessions(pg_url: str, tmp_path: Path) -> None:
    from apps.web.pg_state import PgSessionStore
    from apps.web.sessions import SessionLimitError

    backend = ReplicaIndexer(url=pg_url, embeddings=EMBEDDINGS)
    a, b = (PgSessionStore(pg_url, backend, tmp_path / name, max_sessions=2, ttl_s=60) for name in "ab")
    try:
        made = [a.create(), b.create()]
        with pytest.raises(SessionLimitError) as refused:
            a.create()
        assert 1 <= refused.value.retry_after_s <= 61
        b.discard(made[0])  # a slot is free again, whichever replica frees it
        assert a.create().id != made[0].id and len(a) == len(b) == 2
        assert b.get(made[0].id) is None and b.get(made[1].id) is not None
    finally:
        a.close()
        b.close()


async def test_a_request_cancelled_while_it_waits_for_the_session_leaves_no_lock(pg_url: str, tmp_path: Path) -> None:
    import asyncio

    from apps.web.pg_state import PgSessionStore

    backend = ReplicaIndexer(url=pg_url, embeddings=EMBEDDINGS)
    a, b = (PgSessionStore(pg_url, backend, tmp_path / name) for name in "ab")
    try:
        session = a.create()
        on_b = b.get(session.id)
        assert on_b is not None
        async with a.changing(session):
            waiting = asyncio.create_task(b.changing(on_b).__aenter__())
            await asyncio.sleep(0.5)
            assert not waiting.done()  # b waits for a's lock in the database
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        await asyncio.sleep(0.5)  # b's thread takes the lock once a lets go, and gives it back
        async with asyncio.timeout(10):
            async with b.changing(on_b):
                pass
            async with a.changing(session):
                pass
    finally:
        a.close()
        b.close()
