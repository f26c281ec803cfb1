"""Issue 30's third probe, files part: Office, CSV and notebook files whose cost outgrew their size,
zip members that under-declare their size, and a file rewritten while it is ingested.

The shapes are the probe's (built by `benchmarks/parse_limits.py`), at sizes that prove the bound
in seconds: memory is measured with tracemalloc around one load and compared with the XML or
the text, not with a wall-clock figure.
"""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.parse_limits import csv_rows, docx_lying_member, docx_with_xml, epub_lying_mimetype, xlsx_with_shared_strings
from retrievers import load_file, sync_index
from retrievers.converters import MAX_JSON_VALUES, ConversionError, convert, zip_kind
from retrievers.ingest import ChunkingSettings
from tests.retrievers.conftest import CountingEmbeddings
from tests.retrievers.office_files import WRITERS

pytestmark = pytest.mark.timeout(120)
MIB = 2**20


@pytest.fixture
def counting_embeddings() -> CountingEmbeddings:
    return CountingEmbeddings(size=8, texts=[])


@pytest.fixture(autouse=True)
def converters_imported(tmp_path: Path) -> None:
    """Each format's modules imported before anything is measured (imports are not the file's cost)."""
    for kind, write in WRITERS.items():
        load_file(write(tmp_path / f"warm.{kind}"))


def peak_bytes(fn: Callable[[], object]) -> tuple[object, int]:
    """`fn()` and the most memory Python held at once while it ran, beyond what it held before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_word_file_with_megabytes_of_xml_costs_memory_of_its_text_not_of_its_xml(tmp_path: Path) -> None:
    path = docx_with_xml(tmp_path / "xml.docx", 4 * MIB)
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("word/document.xml").file_size > 4_000_000 and path.stat().st_size < 100_000
    result, peak = peak_bytes(lambda: load_file(path))
    text = sum(len(d.page_content) for d in result.documents)
    assert "Ferry notes." in result.documents[0].page_content
    assert peak < 8 * text + MIB // 2, (peak, text)  # MarkItDown (mammoth) took ~80 bytes per byte of XML


def test_a_workbook_with_a_huge_shared_string_table_is_refused_within_the_text_limit(tmp_path: Path) -> None:
    path = xlsx_with_shared_strings(tmp_path / "strings.xlsx", 40 * MIB)
    limit = path.stat().st_size * 2  # the per-file limit: the table's 40 MiB are far past it
    result, peak = peak_bytes(lambda: load_file(path, max_file_bytes=limit, warn=False))
    assert result.skipped and result.skipped[0].reason.startswith("its text is larger than the per-file limit")
    assert peak < 2 * MIB + 4 * limit, (peak, limit)


def test_a_workbook_with_a_modest_shared_string_table_still_loads(tmp_path: Path) -> None:
    path = xlsx_with_shared_strings(tmp_path / "strings.xlsx", 200_000)
    docs = load_file(path).documents
    assert docs[0].page_content.split("\n") == ["## Budget", "| Item | Cost |", "| --- | --- |", "| Fuel | 1200 |"]


def test_a_csv_of_many_rows_costs_a_small_multiple_of_its_text(tmp_path: Path) -> None:
    path = csv_rows(tmp_path / "rows.csv", 100_000)
    result, peak = peak_bytes(lambda: load_file(path))
    text = result.documents[0].page_content
    lines = text.split("\n")
    assert lines[:3] == ["| id | name | berth |", "| --- | --- | --- |", "| 0 | boat 0 | 0 |"] and len(lines) == 100_002
    assert peak < 6 * len(text), (peak, len(text))  # MarkItDown held every row as a list of cells


def test_a_member_that_under_declares_its_size_is_not_inflated(tmp_path: Path) -> None:
    path = docx_lying_member(tmp_path / "liar.docx", 300 * MIB)
    result, peak = peak_bytes(lambda: load_file(path, warn=False))
    assert result.skipped and result.skipped[0].reason.startswith("not readable as a Word document (.docx)")
    assert peak < 8 * MIB, peak  # zipfile's read() inflated all 300 MiB before cutting to the declared 2 KiB


def test_an_epub_mimetype_that_under_declares_its_size_is_read_as_a_stream(tmp_path: Path) -> None:
    data = epub_lying_mimetype(tmp_path / "liar.epub", 300 * MIB).read_bytes()
    kind, peak = peak_bytes(lambda: zip_kind(data))
    assert kind is None and peak < 8 * MIB, peak  # its CRC is the 300 MiB's: not an EPUB, found out cheaply


def test_a_slow_conversion_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    data = docx_with_xml(tmp_path / "xml.docx", 8 * MIB).read_bytes()
    with pytest.raises(ConversionError, match=r"took longer than the per-file limit of 0\.05 s"):
        convert(data, "docx", max_text_chars=MIB, max_unzipped_bytes=100 * MIB, time_limit_s=0.05)


def test_members_compressed_with_bzip2_or_lzma_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("content.xml", "<office:document-content/>")
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text")
    with pytest.raises(ConversionError, match="compressed with method 12; only stored and deflated"):
        convert(buffer.getvalue(), "odt", max_text_chars=MIB, max_unzipped_bytes=MIB)


def test_a_notebook_of_millions_of_json_values_is_refused_before_parsing(tmp_path: Path) -> None:
    values = MAX_JSON_VALUES + 10
    text = '{"cells": [], "metadata": {"data": [' + "{}," * values + '{}]}, "nbformat": 4, "nbformat_minor": 5}'
    path = tmp_path / "outputs.ipynb"
    path.write_text(text, encoding="utf-8")
    result = load_file(path, warn=False)
    assert result.skipped and "over the limit of 2,000,000 (large outputs?)" in result.skipped[0].reason
    fine = tmp_path / "fine.ipynb"
    fine.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": ["# Tides, \"high\" [1]"]}], "nbformat": 4}))
    assert load_file(fine).documents[0].metadata["section"] == 'Tides, "high" [1]'


def test_a_file_rewritten_while_it_is_ingested_is_read_again_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counting_embeddings: CountingEmbeddings
) -> None:
    """The scan hashes the saved file; another program then saves it again and the parse reads it
    half written. The catalog records the half it read, so the next sync sees the change."""
    import retrievers.ingest as ingest

    folder = tmp_path / "docs"
    folder.mkdir()
    page = folder / "guide.html"
    paragraphs = [f"<p>Paragraph {i} of the ferry guide.</p>" for i in range(60)]
    full = ("<html><body>" + "".join(paragraphs) + "</body></html>").encode()
    page.write_bytes(full)
    real_load = ingest.load_file

    def saved_while_read(path: object, **kwargs: object) -> object:
        page.write_bytes(full[: len(full) // 5])  # the other program truncated and is writing
        try:
            return real_load(path, **kwargs)
        finally:
            page.write_bytes(full)  # and finished

    monkeypatch.setattr(ingest, "load_file", saved_while_read)
    chunking = ChunkingSettings(chunk_size=400, chunk_overlap=0, length_function=lambda t: len(t.split()))
    store, _ = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert "Paragraph 59" not in " ".join(d.page_content for d in store.documents())
    record = store.catalog.files[str(page)]
    assert record.sha256 == hashlib.sha256(full[: len(full) // 5]).hexdigest() and record.size == len(full) // 5
    monkeypatch.setattr(ingest, "load_file", real_load)
    store, report = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert report.changed == [str(page)]
    assert "Paragraph 59" in " ".join(d.page_content for d in store.documents())
    _, report = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert report.unchanged == [str(page)]
