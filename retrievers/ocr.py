"""Optional OCR of scanned PDF pages and images of text, with Tesseract (Debian's ``tesseract-ocr``) through pytesseract.

It is an extra: ``bash scripts/install-ocr.sh`` installs both (the test command runs it). Without
it a PDF page that has no text layer is left out with that reason, and an image file is skipped.
Each image is bounded before Tesseract sees it (`MAX_PIXELS`; Pillow refuses decompression
bombs past that too) and each run has a time limit (`OCR_TIMEOUT_S`).
"""

from __future__ import annotations

import shutil
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["INSTALL_HINT", "MAX_PIXELS", "OCR_TIMEOUT_S", "OcrError", "available", "ocr_image", "ocr_pdf_page"]

#: What a skip reason tells the user to do when OCR is not installed.
INSTALL_HINT = (
    "install the OCR extra to read it: pip install 'ragspec[ocr]' and the tesseract program "
    "(bash scripts/install-ocr.sh installs both, with Debian's tesseract-ocr)"
)

#: Largest image OCR'd, in pixels: an A4 page scanned at 600 dpi is 35 million.
MAX_PIXELS = 60_000_000

#: Longest one Tesseract run may take, in seconds.
OCR_TIMEOUT_S = 120.0

_MIN_SIDE = 16  # smaller images (rules, bullets, logos' specks) hold no text to read


class OcrError(Exception):
    """OCR could not read an image; the message says why."""


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether pytesseract is installed and finds a ``tesseract`` program."""
    try:
        import pytesseract
    except ImportError:
        return False
    if shutil.which(pytesseract.pytesseract.tesseract_cmd) is None:
        return False
    try:
        pytesseract.get_tesseract_version()
    except Exception:  # noqa: BLE001 - a broken installation is no OCR
        return False
    return True


def ocr_image(image: Image) -> str:
    """The text Tesseract reads in `image` (English), whitespace tidied; empty when there is none.

    Raises:
        OcrError: the image is too large, or Tesseract failed or ran past `OCR_TIMEOUT_S`.
    """
    import pytesseract

    width, height = image.size
    if width * height > MAX_PIXELS:
        raise OcrError(f"an image of {width}x{height} pixels is over the OCR limit of {MAX_PIXELS:,} pixels")
    if min(width, height) < _MIN_SIDE:
        return ""
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    try:
        text = pytesseract.image_to_string(image, lang="eng", timeout=OCR_TIMEOUT_S)
    except RuntimeError as e:  # pytesseract's time-out
        raise OcrError(f"OCR ran past {OCR_TIMEOUT_S:g} s") from e
    except pytesseract.TesseractError as e:
        raise OcrError(f"Tesseract failed: {e.message}") from e
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return "\n".join(lines).strip()


def ocr_pdf_page(page: object) -> str:
    """OCR of the images on a pypdf page (in the order the page lists them), joined by blank lines.

    Raises:
        OcrError: an image could not be decoded or read.
    """
    texts: list[str] = []
    try:
        images = list(page.images)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - pypdf's image decoding fails in many ways on broken files
        raise OcrError(f"its images could not be decoded ({type(e).__name__}: {e})") from e
    for found in images:
        try:
            image = found.image
        except Exception as e:  # noqa: BLE001 - Pillow's DecompressionBombError among them
            raise OcrError(f"an image could not be decoded ({type(e).__name__}: {e})") from e
        if image is not None:
            text = ocr_image(image)
            if text:
                texts.append(text)
    return "\n\n".join(texts)
