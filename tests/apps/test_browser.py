"""End to end in a real headless browser: upload a document, ask, watch the answer stream, open a citation.

Uses the system's Chromium (``scripts/install-browser.sh`` installs it) driven by Playwright;
nothing downloads a browser. The server and the page talk over 127.0.0.1 only. Set
``RAGSPEC_SCREENSHOT=path.png`` to save a screenshot of the answered page.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.web.server import AppConfig, FolderIndexer, create_app
from tests.apps.conftest import LiveServer, ScriptedIndexer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `bash scripts/install-browser.sh`")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            chromium_sandbox=False,
            viewport={"width": 1280, "height": 760},
            args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
            ],
        )
        try:
            yield context
        finally:
            context.close()


def test_upload_ask_stream_and_open_a_citation(browser: object, apps_corpus: Path, tmp_path: Path) -> None:
    tokens = 55 if os.environ.get("RAGSPEC_SCREENSHOT") else 32  # a longer answer looks better in the picture
    app = create_app(AppConfig(max_tokens=tokens), indexer=FolderIndexer(max_tokens=tokens), sessions_root=tmp_path)
    with LiveServer(app) as server:
        page = browser.new_page()  # type: ignore[attr-defined]
        outside: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(server.url) else outside.append(r.url))
        page.goto(server.url + "/")
        page.set_input_files("#files", str(apps_corpus / "kestrel-lane-handbook.md"))
        page.click("#upload-btn")
        page.wait_for_selector("#doc-list li", timeout=180_000)
        assert "kestrel-lane-handbook.md" in page.inner_text("#doc-list")
        assert "passages indexed" in page.inner_text("#doc-status")

        page.fill("#question", "How long is the trial period?")
        page.click("#ask-btn")
        # streamed: text is on the page while the answer is still marked as streaming
        page.wait_for_function(
            "() => { const a = document.querySelector('.answer.streaming'); return a && /[a-z]{3}/i.test(a.textContent) }",
            timeout=180_000,
        )
        partial = page.inner_text(".answer")
        page.wait_for_selector(".citation", timeout=180_000)
        final = page.inner_text(".answer")  # rendered from Markdown: list numbers and ** are markup now
        assert re.findall(r"[A-Za-z]{3,}", partial)[0] in final
        assert "six months" in final.lower()  # the handbook's answer, not the question's words echoed
        stats = page.inner_text(".stats")
        assert "tokens/s" in stats and "acceptance" in stats and "tokens/forward" in stats

        page.click(".citation")
        page.wait_for_selector("#passage:not([hidden])")
        passage = page.inner_text("#passage-text")
        assert len(passage) > 50 and passage.strip() in (apps_corpus / "kestrel-lane-handbook.md").read_text()
        assert page.inner_text("#passage-source").startswith("kestrel-lane-handbook.md · char ")  # not a server path
        assert page.inner_text("#passage-title").startswith("[1]")
        assert outside == []
        shot = os.environ.get("RAGSPEC_SCREENSHOT")
        if shot:
            time.sleep(0.3)
            page.screenshot(path=shot)
        page.close()


@pytest.mark.timeout(120)
def test_the_page_works_under_its_content_security_policy_and_asks_for_the_api_key(browser: object, tmp_path: Path) -> None:
    key = secrets.token_urlsafe(24)
    app = create_app(AppConfig(api_key=key), indexer=ScriptedIndexer(), sessions_root=tmp_path)
    with LiveServer(app) as server:
        page = browser.new_page()  # type: ignore[attr-defined]
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(server.url + "/")
        page.wait_for_selector("#key-form:not([hidden])")  # the server said 401: the page asks for the key
        page.fill("#api-key", key)
        page.click("#key-btn")
        page.wait_for_selector("#key-form", state="hidden")
        page.set_input_files("#files", [{"name": "..txt", "mimeType": "text/plain", "buffer": b"The trial lasts six months."}])
        page.click("#upload-btn")
        page.wait_for_selector("#doc-list li")
        assert page.inner_text("#doc-list") == "upload.txt"
        assert "'..txt' was saved as 'upload.txt'" in page.inner_text("#notice-list")
        page.fill("#question", "How long is the trial?")
        page.click("#ask-btn")
        page.wait_for_selector(".citation")
        assert page.inner_text(".answer") == "The trial lasts six months [1]."
        assert "tokens/s" in page.inner_text(".stats")
        assert problems == []  # nothing the page does is blocked by its policy
        # ... and the policy is in force: a script injected into the page does not run
        injected = "() => { const s = document.createElement('script'); s.textContent = 'window.x = 1'; document.body.append(s); return window.x }"
        assert page.evaluate(injected) is None
        page.wait_for_timeout(200)
        assert len(problems) == 1 and "Content Security Policy" in problems[0]
        page.close()


def upload_and_ask(page: object, url: str, name: str, body: bytes, question: str) -> None:
    """Open the page, upload one text file, wait until it is indexed, and ask ``question``."""
    page.goto(url + "/")  # type: ignore[attr-defined]
    page.set_input_files("#files", [{"name": name, "mimeType": "text/plain", "buffer": body}])  # type: ignore[attr-defined]
    page.click("#upload-btn")  # type: ignore[attr-defined]
    page.wait_for_selector("#doc-list li")  # type: ignore[attr-defined]
    page.fill("#question", question)  # type: ignore[attr-defined]
    page.click("#ask-btn")  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_an_unsupported_answer_is_marked_on_the_page(browser: object, tmp_path: Path) -> None:
    backend = ScriptedIndexer(words=["The capital of Peru", " is Lima."], supported=False)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        page = browser.new_page()  # type: ignore[attr-defined]
        upload_and_ask(page, server.url, "timetable.txt", b"Ferry at 7:15.", "What is the capital of Peru?")
        page.wait_for_selector(".citations .unsupported")
        assert "I don't know: no passage backs this answer (no passage holds its words)" in page.inner_text(".citations")
        assert page.query_selector(".citation") is None
        page.close()


@pytest.mark.timeout(120)
def test_an_answer_s_markdown_is_rendered_and_hostile_html_in_it_does_not_run(browser: object, tmp_path: Path) -> None:
    words = ["- **Early bake**: 3:30 to 11:30 [1]", "\n- <img src=x onerror=\"window.pwned = 1\">",
             "\n- [click](javascript:window.pwned=2) <script>window.pwned = 3</script>",
             '\n- <a href="javascript:window.pwned=4" onclick="window.pwned=5">x</a>']  # fmt: skip
    backend = ScriptedIndexer(words=words)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        page = browser.new_page()  # type: ignore[attr-defined]
        upload_and_ask(page, server.url, "shifts.txt", b"Early bake 3:30.", "What are the shift hours?")
        page.wait_for_selector(".citation")
        assert page.inner_text(".answer li strong") == "Early bake"  # Markdown, not "**Early bake**"
        assert len(page.query_selector_all(".answer li")) == 4
        page.click(".answer .cite-ref")  # the [1] marker is still a button that opens the passage
        page.wait_for_selector("#passage:not([hidden])")
        assert page.inner_text("#passage-text mark") == "passage of shifts.txt"  # the sentences the answer drew from, marked
        for a in page.query_selector_all(".answer a"):
            a.click()
        page.wait_for_timeout(300)
        assert page.evaluate("window.pwned") is None
        assert page.query_selector_all(".answer img, .answer script, .answer [onclick], .answer [onerror]") == []
        assert page.evaluate("[...document.querySelectorAll('.answer a')].map(a => a.href)") == []
        assert "<script>" in page.inner_text(".answer")  # shown as text, not run
        page.close()


@pytest.mark.timeout(120)
def test_the_stop_button_ends_the_answer_on_the_page_and_on_the_server(browser: object, tmp_path: Path) -> None:
    backend = ScriptedIndexer(delay_s=0.05, words=["word "] * 400)  # 20 s if never stopped
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        page = browser.new_page()  # type: ignore[attr-defined]
        upload_and_ask(page, server.url, "a.txt", b"Words.", "Say many words")
        page.wait_for_function("() => document.querySelector('.answer.streaming')?.textContent.length > 0")
        t0 = time.monotonic()
        page.click("#stop-btn")
        assert backend.answerers[0].ended.wait(5), "the server kept generating after Stop"
        assert time.monotonic() - t0 < 5
        assert backend.answerers[0].closed == 1 and backend.answerers[0].finished == 0
        page.wait_for_selector(".stats .stopped")
        assert page.inner_text(".stats").startswith("stopped after ")
        assert page.query_selector(".answer.streaming") is None and page.inner_text(".answer").startswith("word")
        assert not page.is_visible("#stop-btn") and page.is_enabled("#ask-btn")
        page.fill("#question", "again")  # the page and the model are free for the next question
        backend.answerers[0].words = ["short"]
        page.click("#ask-btn")
        page.wait_for_function("() => document.querySelectorAll('.turn')[1]?.querySelector('.stats b')")
        assert page.inner_text(".turn:nth-child(2) .answer") == "short"
        page.close()


@pytest.mark.timeout(120)
def test_a_preloaded_index_lists_its_documents_and_nothing_the_page_loads_is_missing(browser: object, tmp_path: Path) -> None:
    from apps.collection import Collection

    index = tmp_path / "index"
    index.mkdir()  # the panel reads the index's manifest only (the files `ragspec ingest` recorded)
    files = {"/srv/docs/handbook.md": {}, "/srv/docs/rules/harbour-lights.html": {}}
    (index / "manifest.json").write_text('{"ingest": {"files": ' + json.dumps(files) + "}}")
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), preload=Collection(index), sessions_root=tmp_path / "s")
    with LiveServer(app) as server:
        browser.clear_cookies()  # type: ignore[attr-defined]  # a first visit: no session cookie left by an earlier test's server
        page = browser.new_page()  # type: ignore[attr-defined]
        failed: list[str] = []
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.goto(server.url + "/")
        page.wait_for_selector("#doc-list li")
        assert page.inner_text("#doc-list").split("\n") == ["handbook.md", "harbour-lights.html"]
        assert page.inner_text("#doc-status") == "Using the server's preloaded index (2 document(s))."
        icon = page.request.get(server.url + "/favicon.ico")
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
        page.wait_for_timeout(300)
        assert failed == []  # the favicon included: no 404 in the console
        page.close()
