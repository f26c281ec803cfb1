"""Office, e-book and spreadsheet uploads through the web app: accepted by type, and a broken one refused with its reason."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from apps.web.config import DEFAULT_SUFFIXES
from apps.web.server import AppConfig, create_app
from retrievers.converters import CONVERTED_TYPES
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.retrievers.office_files import write_docx, write_pptx, write_xlsx

pytestmark = pytest.mark.timeout(120)


def test_every_converted_type_is_an_allowed_upload_and_in_the_page_picker() -> None:
    assert set(CONVERTED_TYPES) <= set(DEFAULT_SUFFIXES)
    page = (Path(__file__).resolve().parents[2] / "apps" / "web" / "static" / "index.html").read_text(encoding="utf-8")
    accept = page.split('accept="', 1)[1].split('"', 1)[0].split(",")
    assert set(accept) == set(DEFAULT_SUFFIXES)


def test_office_files_upload(tmp_path: Path) -> None:
    files = [write_docx(tmp_path / "handbook.docx"), write_pptx(tmp_path / "deck.pptx"), write_xlsx(tmp_path / "budget.xlsx")]
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path / "sessions")
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/api/documents", files=[("files", (f.name, f.read_bytes(), "application/octet-stream")) for f in files])
        assert r.status_code == 200, r.text
        assert sorted(c.get("/api/session").json()["documents"]) == ["budget.xlsx", "deck.pptx", "handbook.docx"]


def test_a_broken_office_upload_is_refused_with_its_reason(tmp_path: Path) -> None:
    from apps.web.server import FolderIndexer

    data = write_docx(tmp_path / "src.docx").read_bytes()
    app = create_app(AppConfig(), indexer=FolderIndexer(max_tokens=8), sessions_root=tmp_path / "sessions")
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/api/documents", files=[("files", ("report.docx", data[: len(data) // 3], "application/octet-stream"))])
        assert r.status_code == 422
        assert r.json()["error"].startswith(
            "found no text to index in the uploaded files; 1 file(s) skipped: report.docx: not a valid zip container"
        )
