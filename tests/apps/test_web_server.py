"""The web app's HTTP behaviour, over a real uvicorn server on 127.0.0.1 with a scripted indexer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from apps.web.documents import _safe_name
from apps.web.server import AppConfig, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer


def events(response: httpx.Response) -> Iterator[tuple[str, dict]]:
    """Parse a text/event-stream response into (event, data) pairs as they arrive."""
    event, data = "message", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            yield event, json.loads(data)
            event, data = "message", ""


def ask(client: httpx.Client, question: str) -> list[tuple[str, dict]]:
    with client.stream("POST", "/api/ask", json={"question": question}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(events(r))


def upload(client: httpx.Client, name: str, body: bytes = b"# Notes\n\nThe trial lasts six months.\n") -> httpx.Response:
    return client.post("/api/documents", files=[("files", (name, body, "text/markdown"))])


@pytest.fixture
def backend() -> ScriptedIndexer:
    return ScriptedIndexer()


@pytest.fixture
def server(backend: ScriptedIndexer, tmp_path: Path) -> Iterator[LiveServer]:
    with LiveServer(create_app(AppConfig(max_file_bytes=2000, max_request_bytes=10_000), indexer=backend, sessions_root=tmp_path)) as s:
        yield s


def client_for(server: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30)


def test_page_is_served_and_the_first_upload_sets_an_httponly_session_cookie(server: LiveServer) -> None:
    with client_for(server) as c:
        page = c.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert 'id="ask-form"' in page.text and "/static/app.js" in page.text
        assert c.get("/static/app.js").status_code == 200
        assert "set-cookie" not in page.headers and "set-cookie" not in c.get("/api/session").headers  # GETs make no session
        r = upload(c, "notes.md")
        cookie = r.headers.get("set-cookie", "")
        assert "ragspec_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        again = c.get("/api/session")
        assert again.json()["documents"] == ["notes.md"] and "set-cookie" not in again.headers  # same session kept


def test_ask_streams_tokens_then_citations_and_stats_and_keeps_history(server: LiveServer, backend: ScriptedIndexer) -> None:
    with client_for(server) as c:
        r = upload(c, "notes.md")
        assert r.status_code == 200, r.text
        assert r.json()["documents"] == ["notes.md"]
        got = ask(c, "How long is the trial?")
        kinds = [k for k, _ in got]
        assert kinds == ["token"] * 7 + ["done"]
        text = "".join(d["text"] for k, d in got if k == "token")
        assert text == "The trial lasts six months [1]."
        tokens = [d["tokens"] for k, d in got if k == "token"]
        assert tokens == sorted(tokens) and tokens[-1] == 7 and all(d["tokens_per_s"] > 0 for k, d in got if k == "token")
        done = got[-1][1]
        assert done["text"] == text and done["supported"] is True
        assert done["citations"][0]["number"] == 1 and done["citations"][0]["text"] == "passage of notes.md"
        assert done["citations"][0]["quote"] == "passage of notes.md" and done["note"] == ""  # the cited sentences
        assert done["stats"]["acceptance_rate"] == 0.5 and done["stats"]["tokens_per_forward"] == 1.5
        assert done["stats"]["decode_tokens_per_s"] == pytest.approx(10.0) and done["stats"]["new_tokens"] == 3
        ask(c, "And after that?")
        assert backend.answerers[0].histories == [[], [("How long is the trial?", text)]]
        r = c.delete("/api/conversation")  # "New conversation": the documents stay
        assert r.status_code == 200 and r.json()["turns"] == 0 and r.json()["documents"] == ["notes.md"]
        ask(c, "How long is the trial?")
        assert backend.answerers[0].histories[-1] == []


def test_an_unsupported_answer_is_marked_and_cites_nothing(tmp_path: Path) -> None:
    backend = ScriptedIndexer(words=["The capital of Peru", " is Lima."], supported=False)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server, client_for(server) as c:
        upload(c, "timetable.md", b"Ferry departures: 7:15 and 9:40.")
        kind, done = ask(c, "What is the capital of Peru?")[-1]
    assert kind == "done" and done["supported"] is False and done["citations"] == []
    assert done["text"] == "The capital of Peru is Lima."
    assert done["note"] == "I don't know: no passage backs this answer (no passage holds its words), so it may be a guess."


def test_upload_type_and_size_limits(server: LiveServer) -> None:
    with client_for(server) as c:
        r = c.post("/api/documents", files=[("files", ("tool.exe", b"MZ", "application/octet-stream"))])
        assert r.status_code == 415 and "unsupported file type" in r.json()["error"]
        r = upload(c, "big.md", b"x" * 2001)
        assert r.status_code == 413 and "larger than" in r.json()["error"]
        r = c.post("/api/documents", files=[("files", (f"f{i}.md", b"x" * 1500, "text/markdown")) for i in range(8)])
        assert r.status_code == 413  # the whole request is over max_request_bytes
        assert c.get("/api/session").json()["documents"] == []
        r = c.post("/api/ask", json={"question": "anything?"})
        assert r.status_code == 409 and "upload" in r.json()["error"]
        assert c.post("/api/ask", json={"question": ""}).status_code == 422


def test_upload_names_cannot_escape_the_session_folder(server: LiveServer, tmp_path: Path) -> None:
    assert _safe_name("../../etc/passwd.md") == "passwd.md"
    assert _safe_name("..\\..\\x.md") == "x.md"
    with client_for(server) as c:
        assert upload(c, "../../escape.md").status_code == 200
    assert not (tmp_path / "escape.md").exists() and not (tmp_path.parent / "escape.md").exists()
    assert len(list(tmp_path.glob("*/uploads/escape.md"))) == 1


def test_sessions_do_not_see_each_other(server: LiveServer) -> None:
    with client_for(server) as a, client_for(server) as b, client_for(server) as stranger:
        assert upload(a, "alpha.md").status_code == 200
        assert upload(b, "beta.md").status_code == 200
        assert a.get("/api/session").json()["documents"] == ["alpha.md"]
        assert b.get("/api/session").json()["documents"] == ["beta.md"]
        assert ask(a, "q")[-1][1]["citations"][0]["source"] == "alpha.md.md"
        assert ask(b, "q")[-1][1]["citations"][0]["source"] == "beta.md.md"
        assert stranger.post("/api/ask", json={"question": "q"}).status_code == 409
        forged = httpx.Client(base_url=server.url, cookies={"ragspec_session": "not-a-session"})
        assert forged.get("/api/session").json()["documents"] == []
        forged.close()
        assert b.delete("/api/documents").json()["documents"] == []
        assert a.get("/api/session").json()["documents"] == ["alpha.md"]


@pytest.mark.timeout(60)
def test_answers_are_serialized_and_the_second_is_queued(tmp_path: Path) -> None:
    backend = ScriptedIndexer(delay_s=0.05)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        clients = [client_for(server) for _ in range(2)]
        for i, c in enumerate(clients):
            upload(c, f"doc{i}.md")
        first_answerer, second_answerer = backend.answerers
        results: list[list[tuple[str, dict]]] = [[], []]

        def run(i: int) -> None:
            results[i] = ask(clients[i], "q")

        first = threading.Thread(target=run, args=(0,))
        first.start()
        assert first_answerer.generating.wait(10), "the first answer never started"
        run(1)
        first.join(timeout=30)
        for c in clients:
            c.close()
    assert results[0][-1][0] == "done" and results[1][-1][0] == "done"
    assert results[1][0] == ("queued", {"position": 1})
    assert (first_answerer.started, second_answerer.started) == (1, 1)
    # one at a time: the second answer started only after the first had ended
    [(_, first_end)] = first_answerer.spans
    [(second_start, _)] = second_answerer.spans
    assert second_start >= first_end


@pytest.mark.timeout(60)
def test_queue_wait_and_answer_time_are_limited(tmp_path: Path) -> None:
    backend = ScriptedIndexer(delay_s=0.25)
    config = AppConfig(queue_timeout_s=0.2, answer_timeout_s=0.6)
    with LiveServer(create_app(config, indexer=backend, sessions_root=tmp_path)) as server:
        a, b = client_for(server), client_for(server)
        upload(a, "a.md")
        upload(b, "b.md")
        out: list[list[tuple[str, dict]]] = []
        t = threading.Thread(target=lambda: out.append(ask(a, "slow")))
        t.start()
        assert backend.answerers[0].generating.wait(10), "the first answer never started"
        queued = ask(b, "waits")
        t.join()
        a.close()
        b.close()
    assert queued[-1][0] == "error" and "busy" in queued[-1][1]["message"]
    cut = out[0]
    assert cut[-1][0] == "error" and "longer than" in cut[-1][1]["message"]
    assert 1 <= sum(k == "token" for k, _ in cut) < 7
    assert backend.answerers[0].ended.wait(5), "the cut answer was never closed"
    assert backend.answerers[0].closed == 1 and backend.answerers[0].finished == 0
    assert backend.answerers[1].started == 0


@pytest.mark.timeout(60)
def test_a_closed_client_stops_its_generation_and_frees_the_model(tmp_path: Path) -> None:
    backend = ScriptedIndexer(delay_s=0.05, words=["word "] * 400)  # 20 s if never stopped
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        a, b = client_for(server), client_for(server)
        upload(a, "a.md")
        upload(b, "b.md")
        with a.stream("POST", "/api/ask", json={"question": "long"}) as r:
            first = next(events(r))
            assert first[0] == "token"
        a.close()  # the tab is gone
        assert backend.answerers[0].ended.wait(5), "the abandoned answer was never closed"
        assert backend.answerers[0].closed == 1 and backend.answerers[0].finished == 0
        backend.answerers[1].words = ["short"]
        t0 = time.monotonic()
        got = ask(b, "next")
        assert got[-1][0] == "done" and time.monotonic() - t0 < 3
        assert b.get("/api/health").json() == {"ok": True, "queue": 0, "busy": False, "running": 0, "waiting": 0, "slots": 1}
        b.close()


def test_folders_only_when_allowed(tmp_path: Path, apps_corpus: Path) -> None:
    backend = ScriptedIndexer()
    with LiveServer(create_app(AppConfig(allow_folders=False), indexer=backend, sessions_root=tmp_path / "s1")) as s:
        with client_for(s) as c:
            r = c.post("/api/folder", json={"path": str(apps_corpus)})
            assert r.status_code == 403
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path / "s2")) as s:
        with client_for(s) as c:
            assert c.post("/api/folder", json={"path": str(tmp_path / "missing")}).status_code == 404
            r = c.post("/api/folder", json={"path": str(apps_corpus)})
            assert r.status_code == 200
            assert "kestrel-lane-handbook.md" in r.json()["documents"]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_file_bytes": 0}, {"queue_timeout_s": 0}, {"allowed_suffixes": ("md",)}, {"allowed_suffixes": ()}],
)
def test_config_is_checked_when_built(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AppConfig(**kwargs)


def test_an_upload_with_no_text_is_refused_without_naming_server_paths(tmp_path: Path) -> None:
    """The message names the files, not the server's session folder (which holds the session id)."""
    from apps.web.server import FolderIndexer

    app = create_app(AppConfig(), indexer=FolderIndexer(max_tokens=8), sessions_root=tmp_path)
    with LiveServer(app) as server, client_for(server) as c:
        r = c.post("/api/documents", files=[("files", ("a.md", b"   \n", "text/markdown"))])
        assert r.status_code == 422
        assert r.json()["error"] == "found no text to index in the uploaded files; 1 file(s) skipped: a.md: empty file"
        assert str(tmp_path) not in r.text and c.cookies.get("ragspec_session", "<none>") not in r.text
        assert not list(tmp_path.glob("*/uploads/*"))  # a refused upload leaves no file behind
