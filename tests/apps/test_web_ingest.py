"""The web app's folder indexing: incremental through FolderIndexer, and progress the page can poll."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from apps.web.server import AppConfig, FolderIndexer, ProgressBoard, create_app
from retrievers.ingest import SyncProgress
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import counting_embeddings

pytestmark = pytest.mark.timeout(60)

RUN_ID = "0123456789abcdef0123456789abcdef"


def test_progress_of_a_folder_being_indexed_can_be_polled(tmp_path: Path, apps_corpus: Path) -> None:
    steps = [
        SyncProgress("scan", files_done=5, files_total=5, bytes_done=30_000, bytes_total=30_000, elapsed_s=0.1),
        SyncProgress("embed", chunks_done=16, chunks_total=32, elapsed_s=2.0),
        SyncProgress("embed", chunks_done=32, chunks_total=32, elapsed_s=4.0),
    ]
    backend = ScriptedIndexer(progress_steps=steps, progress_delay_s=0.4)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            result: dict[str, httpx.Response] = {}
            post = threading.Thread(
                target=lambda: result.setdefault("r", client.post(f"/api/folder?progress={RUN_ID}", json={"path": str(apps_corpus)}))
            )
            post.start()
            seen = []
            with httpx.Client(base_url=server.url, timeout=30) as poller:
                while post.is_alive():
                    seen.append(poller.get("/api/progress", params={"id": RUN_ID}).json())
                    time.sleep(0.05)
                after = poller.get("/api/progress", params={"id": RUN_ID}).json()
            post.join()
    assert result["r"].status_code == 200 and "kestrel-lane-handbook.md" in result["r"].json()["documents"]
    active = [s for s in seen if s["active"]]
    stages = [s["stage"] for s in active]
    assert "scan" in stages and "embed" in stages
    half = next(s for s in active if s["stage"] == "embed" and s["chunks_done"] == 16)
    assert half["chunks_total"] == 32 and half["rate"] == 8.0 and half["eta_s"] == 2.0
    assert after == {"active": False}


def test_progress_ids_are_checked_and_the_board_is_bounded() -> None:
    board = ProgressBoard(limit=1)
    with board.track("short") as none:
        assert none is None
    with board.track(RUN_ID) as report, board.track("f" * 32) as second:
        assert report is not None and second is None  # the board is full
        report(SyncProgress("embed", chunks_done=1, chunks_total=4, elapsed_s=1.0))
        assert board.get(RUN_ID)["chunks_done"] == 1 and board.get(RUN_ID)["active"] is True
        assert board.get("f" * 32) == {"active": False}
    assert board.get(RUN_ID) == {"active": False}


def test_the_default_backend_indexes_a_folder_incrementally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apps_corpus: Path) -> None:
    embedded = counting_embeddings(monkeypatch)
    backend = FolderIndexer()
    progress: list[SyncProgress] = []
    _, first = backend.index([apps_corpus], tmp_path, progress.append)
    assert first.update is not None and len(first.update.new) == 5 and len(embedded) == first.chunks > 0
    assert progress[-1].stage == "save" and any(p.stage == "embed" and p.chunks_done == len(embedded) for p in progress)
    _, second = backend.index([apps_corpus], tmp_path)
    assert second.update is not None and len(second.update.unchanged) == 5 and not second.update.saved
    assert len(embedded) == first.chunks and second.chunks == first.chunks


@pytest.mark.integration  # a real headless Chromium, as in test_browser.py (no model is loaded)
def test_the_page_shows_indexing_progress(tmp_path: Path, apps_corpus: Path) -> None:
    from tests.apps.test_browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `bash scripts/install-browser.sh`")
    from playwright.sync_api import sync_playwright

    steps = [SyncProgress("embed", chunks_done=16, chunks_total=32, elapsed_s=2.0)] * 8
    backend = ScriptedIndexer(progress_steps=steps, progress_delay_s=0.25)
    with LiveServer(create_app(AppConfig(), indexer=backend, sessions_root=tmp_path / "s")) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, chromium_sandbox=False, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#folder", str(apps_corpus))
            page.click("#folder-btn")
            page.wait_for_function(
                "() => document.querySelector('#doc-status').textContent.includes('embedding passages 16/32')", timeout=20_000
            )
            status = page.inner_text("#doc-status")
            assert "8.0 passages/s" in status and "about 2 s left" in status
            page.wait_for_selector("#doc-list li", timeout=20_000)
            assert "passages indexed" in page.inner_text("#doc-status")
        finally:
            browser.close()
