"""Fixtures for the retrievers tests: offline mode, the bundled corpus, a minimal PDF writer, counting fake embeddings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
CORPUS_DIR = REPO / "retrievers" / "data" / "corpus"
QUESTIONS_PATH = REPO / "retrievers" / "data" / "questions.json"


def _pdf_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def build_pdf(pages: list[str], title: str | None = None) -> bytes:
    """A small valid PDF: one page per string (lines split on newlines), Helvetica, optional /Title."""
    objects: list[bytes] = []
    n_pages = len(pages)
    font_num = 3
    first_page = 4
    page_nums = [first_page + 2 * i for i in range(n_pages)]
    info_num = first_page + 2 * n_pages
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{n} 0 R" for n in page_nums)
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        lines = text.split("\n")
        ops = ["BT", "/F1 11 Tf", "14 TL", "72 760 Td"]
        for line in lines:
            ops.append(f"({_pdf_escape(line)}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 {font_num} 0 R >> >> "
            f"/Contents {page_nums[i] + 1} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(f"<< /Title ({_pdf_escape(title or '')}) >>".encode())
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    trailer = f"<< /Size {len(objects) + 1} /Root 1 0 R"
    trailer += f" /Info {info_num} 0 R >>" if title else " >>"
    out += f"trailer\n{trailer}\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@pytest.fixture
def make_pdf() -> Callable[..., bytes]:
    return build_pdf


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return CORPUS_DIR


@pytest.fixture(scope="session")
def questions_path() -> Path:
    return QUESTIONS_PATH


class CountingEmbeddings(DeterministicFakeEmbedding):
    """Deterministic fake vectors (a function of the text) that records every text it embeds."""

    texts: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        self.texts.append(text)
        return super().embed_query(text)


@pytest.fixture
def counting_embeddings() -> CountingEmbeddings:
    """8-dimensional `CountingEmbeddings`; ``.texts`` lists what was embedded."""
    return CountingEmbeddings(size=8, texts=[])
