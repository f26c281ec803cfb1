"""OCR of scanned PDF pages and images of text (the OCR extra), and what happens without it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from retrievers import load_file, ocr
from tests.retrievers.conftest import build_pdf

pytestmark = pytest.mark.timeout(180)

needs_ocr = pytest.mark.skipif(not ocr.available(), reason="the OCR extra is not installed: bash scripts/install-ocr.sh")

LINES = ("The harbour opens at seven", "Ferries leave every hour")


def text_image(lines: tuple[str, ...] = LINES):  # -> PIL.Image.Image
    """A white page with black text rendered by Pillow, as a scanner would give it."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (1400, 120 + 90 * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=56)
    for i, line in enumerate(lines):
        draw.text((60, 60 + 90 * i), line, fill=0, font=font)
    return image


def scanned_pdf(path: Path, with_text_page: bool = False) -> Path:
    """A PDF whose page is only an image of text (no text layer), after a normal text page if asked."""
    from pypdf import PdfReader, PdfWriter

    scan = io.BytesIO()
    text_image().save(scan, format="PDF", resolution=200)
    writer = PdfWriter()
    if with_text_page:
        writer.append(PdfReader(io.BytesIO(build_pdf(["Timetable\nThe office is on pier 2."]))))
    writer.append(PdfReader(scan))
    with path.open("wb") as f:
        writer.write(f)
    return path


def test_the_rendered_page_really_has_no_text_layer(tmp_path: Path) -> None:
    from pypdf import PdfReader

    reader = PdfReader(scanned_pdf(tmp_path / "scan.pdf"))
    assert (reader.pages[0].extract_text() or "").strip() == ""


@needs_ocr
def test_a_scanned_pdf_page_is_read_by_ocr(tmp_path: Path) -> None:
    result = load_file(scanned_pdf(tmp_path / "scan.pdf", with_text_page=True))
    assert not result.skipped and not result.notes
    first, scanned = result.documents
    assert first.metadata["page"] == 1 and "ocr" not in first.metadata
    assert scanned.metadata["page"] == 2 and scanned.metadata["ocr"] is True
    assert scanned.page_content.split("\n") == list(LINES)


@needs_ocr
def test_an_image_file_is_read_by_ocr(tmp_path: Path) -> None:
    text_image().save(tmp_path / "notice.png")
    (document,) = load_file(tmp_path / "notice.png").documents
    assert document.page_content.split("\n") == list(LINES)
    assert document.metadata["file_type"] == "image" and document.metadata["page"] == 1


@needs_ocr
def test_an_image_too_large_or_broken_is_skipped_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text_image().save(tmp_path / "notice.png")
    monkeypatch.setattr(ocr, "MAX_PIXELS", 1000)
    assert load_file(tmp_path / "notice.png", warn=False).skipped[0].reason == (
        "OCR failed: an image of 1400x300 pixels is over the OCR limit of 1,000 pixels"
    )
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    assert load_file(tmp_path / "broken.png", warn=False).skipped[0].reason.startswith("not a readable image (UnidentifiedImageError")


def test_without_ocr_a_scanned_page_is_left_out_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ocr, "available", lambda: False)
    mixed = load_file(scanned_pdf(tmp_path / "mixed.pdf", with_text_page=True))
    assert [d.metadata["page"] for d in mixed.documents] == [1]
    (note,) = mixed.notes
    assert note.message == f"ScannedPageWarning: page 2 has no text layer and was left out; {ocr.INSTALL_HINT}"
    only_scan = load_file(scanned_pdf(tmp_path / "scan.pdf"), warn=False)
    (skipped,) = only_scan.skipped
    assert skipped.reason.startswith(f"no extractable text in 1 page(s) (scanned images?); {ocr.INSTALL_HINT}")
    text_image().save(tmp_path / "notice.png")
    assert load_file(tmp_path / "notice.png", warn=False).skipped[0].reason == f"an image; {ocr.INSTALL_HINT}"
