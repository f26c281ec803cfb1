"""Probes of the web app as a hostile page, a hostile network neighbour and a careless user would try it.

Each runs a real uvicorn server on 127.0.0.1 with the scripted backend of tests/apps, and
sends the requests an attacker could: a rebound ``Host``, a cross-site ``Origin``, a burst of
cookie-less requests, a chunked upload with no size, requests without the API key, awkward
file names and a question that is not valid Unicode.
"""

from __future__ import annotations

import json
import re
import secrets
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps import cli
from apps.web.security import InsecureBindError, trusted_hosts_for
from apps.web.server import AppConfig, create_app, serve
from tests.apps.conftest import LiveServer, ScriptedIndexer

DOC = b"# Notes\n\nThe trial lasts six months.\n"


@pytest.fixture
def backend() -> ScriptedIndexer:
    return ScriptedIndexer()


def live(config: AppConfig, backend: ScriptedIndexer, root: Path) -> LiveServer:
    return LiveServer(create_app(config, indexer=backend, sessions_root=root))


def client(server: LiveServer, **kwargs: Any) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=20, **kwargs)


def upload(c: httpx.Client, *names: str, body: bytes = DOC, **kwargs: Any) -> httpx.Response:
    return c.post("/api/documents", files=[("files", (n, body, "text/markdown")) for n in names], **kwargs)


def answer(c: httpx.Client, question: str, **kwargs: Any) -> str:
    r = c.post("/api/ask", json={"question": question}, **kwargs)
    assert r.status_code == 200, r.text
    done = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")][-1]
    return str(done["text"])


# -- 1. DNS rebinding and cross-site requests ---------------------------------------------------


@pytest.mark.timeout(180)
def test_a_rebound_host_name_is_refused(backend: ScriptedIndexer, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir()
    (private / "diary.md").write_text("my secrets")
    with live(AppConfig(), backend, tmp_path / "sessions") as server, client(server) as c:
        evil = {"Host": f"evil.example:{server.port}"}
        # the attack: index a private folder, then read it back through the answer's citations
        r = c.post("/api/folder", json={"path": str(private)}, headers={**evil, "Origin": f"http://evil.example:{server.port}"})
        assert r.status_code == 400 and "untrusted Host" in r.json()["error"]
        assert c.get("/", headers=evil).status_code == 400
        assert c.get("/api/session", headers=evil).status_code == 400
        assert backend.answerers == []  # nothing was indexed
        for host in ("localhost", "127.0.0.1", "LOCALHOST."):
            assert c.get("/api/session", headers={"Host": f"{host}:{server.port}"}).status_code == 200


@pytest.mark.timeout(180)
def test_cross_site_state_changing_requests_are_refused(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(), backend, tmp_path) as server, client(server) as c:
        own = server.url  # http://127.0.0.1:PORT, the page's own origin
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},  # sandboxed frame, file:// page
            {"Origin": f"http://localhost:{server.port + 1}"},  # another local app on another port
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
        ):
            r = upload(c, "notes.md", headers=headers)
            assert r.status_code == 403 and "cross-origin" in r.json()["error"], headers
            assert c.request("DELETE", "/api/documents", headers=headers).status_code == 403
        assert backend.answerers == []
        r = upload(c, "notes.md", headers={"Origin": own, "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 200, r.text
        assert answer(c, "q?", headers={"Origin": own}) == "The trial lasts six months [1]."
        assert upload(c, "other.md").status_code == 200  # no Origin: curl or a script, not a page


@pytest.mark.timeout(180)
def test_every_response_carries_the_security_headers(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(max_body_bytes=100), backend, tmp_path) as server, client(server) as c:
        responses = [
            c.get("/"),
            c.get("/static/app.js"),
            c.get("/api/session"),
            c.get("/no/such/page"),
            c.get("/", headers={"Host": "evil.example"}),
            c.post("/api/ask", content=b"x" * 200),
        ]
        assert [r.status_code for r in responses] == [200, 200, 200, 404, 400, 413]
        for r in responses:
            csp = r.headers.get("content-security-policy", "")
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, r.url
            assert r.headers.get("x-frame-options") == "DENY" and r.headers.get("x-content-type-options") == "nosniff"
        page = responses[0].text
        # the policy forbids inline code: the page must not need any (tests/apps/test_browser.py runs it for real)
        assert not re.search(r"<script(?![^>]*\bsrc=)", page) and "<style" not in page and " style=" not in page
        assert not re.search(r"\son[a-z]+=", page)


class FailingBackend(ScriptedIndexer):
    def index(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a detail of /srv/secret that must not reach the page")


@pytest.mark.timeout(180)
def test_an_unexpected_error_is_a_500_with_the_headers_and_without_its_details(tmp_path: Path) -> None:
    with live(AppConfig(), FailingBackend(), tmp_path) as server, client(server) as c:
        r = upload(c, "notes.md")
        assert r.status_code == 500 and r.json() == {"error": "internal server error (logged on the server)"}
        assert "default-src 'self'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
        deep = c.post("/v1/chat/completions", content=b"[" * 200_000, headers={"Content-Type": "application/json"})
        assert deep.status_code == 400 and deep.json()["error"]["message"] == "the request body is JSON nested too deeply"
        assert deep.headers["x-content-type-options"] == "nosniff"
        assert [c.get(p).status_code for p in ("/openapi.json", "/docs", "/redoc")] == [404, 404, 404]
        assert c.get("/api/health").status_code == 200  # still serving


def test_a_websocket_is_refused_before_any_route() -> None:
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    with TestClient(create_app(AppConfig(), indexer=ScriptedIndexer())) as c, pytest.raises(WebSocketDisconnect) as closed:
        with c.websocket_connect("/api/session"):
            pass
    assert closed.value.code == 1008


@pytest.mark.timeout(60)
def test_trusting_any_host_needs_an_api_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("apps.web.server.serve", lambda *a, **k: pytest.fail("the server started"))
    monkeypatch.delenv("RAGSPEC_API_KEY", raising=False)
    with pytest.raises(InsecureBindError, match="DNS rebinding"):
        AppConfig(trusted_hosts=("localhost", "*")).security()
    assert cli.main(["serve", "--trusted-host", "*"]) == 1
    assert "trusting any Host header needs an API key" in capsys.readouterr().err
    AppConfig(trusted_hosts=("*",), api_key=secrets.token_urlsafe(24)).security()


# -- 2. sessions ---------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_burst_of_cookieless_requests_does_not_evict_a_session(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(), backend, tmp_path) as server, client(server) as owner:
        assert upload(owner, "mine.md").status_code == 200
        for _ in range(40):
            with client(server) as stranger:  # a fresh client each time: no cookie
                assert "set-cookie" not in stranger.get("/api/session").headers
                assert "set-cookie" not in stranger.get("/").headers
                assert stranger.post("/api/ask", json={"question": "q?"}).status_code == 409  # no documents: no session
        assert owner.get("/api/session").json()["documents"] == ["mine.md"]
        assert answer(owner, "still there?") == "The trial lasts six months [1]."


@pytest.mark.timeout(180)
def test_a_full_server_refuses_new_sessions_with_a_503_and_keeps_the_old_ones(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(max_sessions=2), backend, tmp_path) as server:
        a, b, c = client(server), client(server), client(server)
        assert upload(a, "a.md").status_code == 200 and upload(b, "b.md").status_code == 200
        r = upload(c, "c.md")
        assert r.status_code == 503 and "active sessions" in r.json()["error"] and int(r.headers["retry-after"]) > 0
        assert a.get("/api/session").json()["documents"] == ["a.md"]
        assert b.get("/api/session").json()["documents"] == ["b.md"]
        for x in (a, b, c):
            x.close()


@pytest.mark.timeout(180)
def test_uploads_are_bounded_per_session_and_a_refused_upload_leaves_no_session(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(max_sessions=1, max_session_bytes=100), backend, tmp_path) as server:
        with client(server) as greedy:
            r = upload(greedy, "big.md", body=b"x" * 101)
            assert r.status_code == 413 and "this session's uploads" in r.json()["error"]
            assert "ragspec_session" not in greedy.cookies
        with client(server) as c:
            assert upload(c, "a.md", body=b"x" * 60).status_code == 200  # the refused upload took no session slot
            r = upload(c, "b.md", body=b"x" * 60)
            assert r.status_code == 413
            assert c.get("/api/session").json()["documents"] == ["a.md"]


@pytest.mark.timeout(180)
def test_an_expired_session_is_reported_as_expired(backend: ScriptedIndexer, tmp_path: Path) -> None:
    app = create_app(AppConfig(session_ttl_s=0.5), indexer=backend, sessions_root=tmp_path)
    now = [0.0]
    app.state.web.store.clock = lambda: now[0]  # the sessions' clock, moved on by hand instead of sleeping

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with LiveServer(app) as server, client(server) as c:
        assert upload(c, "notes.md").status_code == 200
        sleep(0.8)
        r = c.post("/api/ask", json={"question": "q?"})
        assert r.status_code == 410 and r.json()["code"] == "session_expired" and "expired" in r.json()["error"]
        assert "ragspec_session=" in r.headers.get("set-cookie", "")  # the dead cookie is cleared
        assert "ragspec_session" not in c.cookies
        info = c.get("/api/session").json()
        assert info["documents"] == [] and "expired" not in info  # told once; a fresh start after that
        # a page reloaded with the dead cookie is told, too
        with client(server) as reloaded:
            assert upload(reloaded, "x.md").status_code == 200
            sleep(0.8)
            info = reloaded.get("/api/session").json()
            assert info["expired"] is True and "upload them again" in info["message"]
            assert upload(reloaded, "y.md").status_code == 200
            sleep(0.8)
            r = upload(reloaded, "z.md")  # straight to an upload with the dead cookie: a new session, and it says so
            assert r.status_code == 200 and r.json()["documents"] == ["z.md"]
            assert "expired" in r.json()["notices"][0]


# -- 3. body size ----------------------------------------------------------------------------------


class Counting:
    """ASGI wrapper that counts the request-body bytes the app takes from the server."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.consumed = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            self.consumed += len(message.get("body", b""))
            return message

        await self.app(scope, counted if scope["type"] == "http" else receive, send)


def raw_request(port: int, head: str, chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """Send ``head`` then the chunks (chunked encoding) until the server answers; (response, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sent = 0
    try:
        sock.sendall(head.encode("ascii"))
        try:
            for chunk in chunks:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server has answered (or closed): stop sending
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            else:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = b""
        try:
            while data := sock.recv(65536):
                response += data
        except (ConnectionResetError, TimeoutError):
            pass
        return response, sent
    finally:
        sock.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("route", ["/api/documents", "/api/ask"])
def test_a_chunked_body_over_the_limit_is_cut_while_it_streams(route: str, backend: ScriptedIndexer, tmp_path: Path) -> None:
    limit = 64 * 1024
    config = AppConfig(max_file_bytes=limit, max_request_bytes=limit, max_body_bytes=limit)
    app = Counting(create_app(config, indexer=backend, sessions_root=tmp_path / "sessions"))
    total = 32 * 2**20  # 500 times the limit, no Content-Length

    def body() -> Iterator[bytes]:
        if route == "/api/documents":
            yield b'--b\r\nContent-Disposition: form-data; name="files"; filename="big.md"\r\nContent-Type: text/markdown\r\n\r\n'
        else:
            yield b'{"question": "'
        for _ in range(total // 65536):
            yield b"x" * 65536

    content_type = "multipart/form-data; boundary=b" if route == "/api/documents" else "application/json"
    with LiveServer(app) as server:
        head = (
            f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: {content_type}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        )
        response, sent = raw_request(server.port, head, body())
    assert app.consumed < limit + 2**20, app.consumed  # read at most about the limit, not the 32 MiB
    assert sent < total
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"larger than" in response
    assert not list((tmp_path / "sessions").rglob("big.md"))


@pytest.mark.timeout(180)
def test_a_declared_length_over_the_limit_is_refused_before_the_body(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(max_request_bytes=10_000), backend, tmp_path) as server:
        for route, length in (("/api/ask", 2 * 2**20), ("/api/folder", 2 * 2**20), ("/api/documents", 10_001)):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(
                    f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {length}\r\n\r\n".encode()
                )  # no body follows: an answer now proves the server did not wait for it
                assert sock.recv(65536).startswith(b"HTTP/1.1 413"), route


# -- 4. API key ----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_the_api_key_is_required_on_every_api_route(backend: ScriptedIndexer, tmp_path: Path) -> None:
    key = secrets.token_urlsafe(24)
    with live(AppConfig(api_key=key), backend, tmp_path) as server, client(server) as c:
        assert c.get("/").status_code == 200 and c.get("/static/app.js").status_code == 200  # the page asks for the key
        for auth in (None, "Bearer wrong-key-wrong-key-wrong", f"Basic {key}", f"Bearer {key[:-1]}", key):
            headers = {"Authorization": auth} if auth else {}
            for method, path in (("GET", "/api/session"), ("GET", "/api/health"), ("POST", "/api/ask"), ("DELETE", "/api/documents")):
                r = c.request(method, path, headers=headers, json={"question": "q?"} if method == "POST" else None)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (auth, path)
                assert key not in r.text
            assert upload(c, "notes.md", headers=headers).status_code == 401
        assert c.get("/v1/models").status_code == 401  # the OpenAI-style routes to come are covered too
        good = {"Authorization": f"Bearer {key}"}
        assert upload(c, "notes.md", headers=good).status_code == 200
        assert answer(c, "q?", headers=good) == "The trial lasts six months [1]."


@pytest.mark.timeout(180)
def test_serve_refuses_a_non_loopback_address_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[tuple[str, AppConfig]] = []
    monkeypatch.setattr("apps.web.server.serve", lambda host, port, *, config, preload, **_: started.append((host, config)))
    monkeypatch.delenv("RAGSPEC_API_KEY", raising=False)
    monkeypatch.delenv("RAGSPEC_DEBUG", raising=False)
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        assert cli.main(["serve", "--host", host]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "needs an API key" in err and "RAGSPEC_API_KEY" in err, err
    assert started == []
    with pytest.raises(InsecureBindError):
        serve("0.0.0.0", 8000)

    key = secrets.token_urlsafe(24)
    monkeypatch.setenv("RAGSPEC_API_KEY", key)
    assert cli.main(["serve", "--host", "0.0.0.0", "--trusted-host", "notes.example"]) == 0
    (host, config), = started
    assert host == "0.0.0.0" and config.api_key == key and not config.allow_folders
    assert "notes.example" in config.trusted_hosts and "localhost" in config.trusted_hosts
    captured = capsys.readouterr()
    assert key not in captured.out + captured.err and key not in repr(config)
    assert cli.main(["serve", "--host", "0.0.0.0", "--api-key", "short"]) == 1
    assert "at least 16" in capsys.readouterr().err


def test_trusted_hosts_for_a_bind_address() -> None:
    assert trusted_hosts_for("127.0.0.1") == ("localhost", "127.0.0.1", "::1")
    assert trusted_hosts_for("192.168.1.5", ["Notes.Example."]) == ("localhost", "127.0.0.1", "::1", "192.168.1.5", "notes.example")
    assert trusted_hosts_for("0.0.0.0") == ("*",)  # no single name to check; the required key defends it
    with pytest.raises(ValueError, match="bare name"):
        trusted_hosts_for("127.0.0.1", ["http://notes.example"])


# -- 10. upload names ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_odd_and_repeated_upload_names_keep_every_file(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(), backend, tmp_path) as server, client(server) as c:
        r = c.post(
            "/api/documents",
            files=[
                ("files", ("..txt", b"dots", "text/plain")),
                ("files", ("notes.md", b"first", "text/markdown")),
                ("files", ("notes.md", b"second", "text/markdown")),
                ("files", ("Report.TXT", b"upper", "text/plain")),
            ],
        )
        assert r.status_code == 200, r.text
        assert upload(c, "notes.md", body=b"third").status_code == 200
        info = c.get("/api/session").json()
        saved = {p.name: p.read_bytes() for p in tmp_path.glob("*/uploads/*")}
    assert saved == {
        "upload.txt": b"dots",
        "notes.md": b"first",
        "notes (2).md": b"second",
        "Report.txt": b"upper",
        "notes (3).md": b"third",
    }
    assert sorted(info["documents"]) == sorted(saved)  # every file reached the index
    notices = " | ".join(r.json()["notices"])
    assert "'..txt' was saved as 'upload.txt'" in notices and "'notes.md' was saved as 'notes (2).md'" in notices


# -- 12. text that is not valid Unicode ------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_lone_surrogate_question_is_a_clear_400_not_a_500(backend: ScriptedIndexer, tmp_path: Path) -> None:
    with live(AppConfig(), backend, tmp_path) as server, client(server) as c:
        assert upload(c, "notes.md").status_code == 200
        json_headers = {"Content-Type": "application/json"}
        r = c.post("/api/ask", content=b'{"question": "caf\\ud800 hours?"}', headers=json_headers)
        assert r.status_code == 400 and "not valid text" in r.json()["error"], r.text
        r = c.post("/api/ask", content=b'{"question": "caf\xe9"}', headers=json_headers)  # latin-1 bytes in the JSON
        assert r.status_code == 400
        assert answer(c, "and now?") == "The trial lasts six months [1]."  # the server and the session are fine
