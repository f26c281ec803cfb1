"""Office, e-book, spreadsheet, CSV and notebook files through `load_documents`: text, citable parts, hostile files."""

from __future__ import annotations

import io
import re
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
from langchain_core.documents import Document

from ragspec.answers import Citation
from retrievers import load_documents, load_file, split_documents, sync_index
from retrievers.converters import MAX_ZIP_MEMBERS, ConversionError, check_zip, zip_kind
from retrievers.ingest import ChunkingSettings
from retrievers.loaders import DEFAULT_INCLUDE, file_type
from tests.retrievers.conftest import CountingEmbeddings
from tests.retrievers.office_files import WRITERS, write_docx, write_pptx, write_xlsx

pytestmark = pytest.mark.timeout(120)


def only(path: Path, **kwargs: object) -> list[Document]:
    result = load_file(path, **kwargs)
    assert not result.skipped, result.skipped
    return result.documents


def skip_reason(path: Path, **kwargs: object) -> str:
    result = load_file(path, warn=False, **kwargs)
    assert not result.documents and len(result.skipped) == 1, result
    return result.skipped[0].reason


def test_a_word_document_keeps_headings_lists_and_table_rows_with_one_document_per_section(tmp_path: Path) -> None:
    docs = only(write_docx(tmp_path / "handbook.docx"))
    assert [d.metadata.get("section") for d in docs] == ["Departures", "Refunds"]
    assert all(d.metadata["title"] == "Ferry handbook" and d.metadata["file_type"] == "docx" for d in docs)
    departures = docs[0].page_content
    assert departures.startswith("# Departures\n")
    assert "* Bring a printed ticket\n* Bring an identity card" in departures
    assert "| Monday | 12:00 |" in departures and "| Tuesday | 13:30 |" in departures
    assert docs[1].page_content == "# Refunds\n\nRefunds are paid within 14 days."
    assert docs[1].metadata["location"] == "section Refunds" and docs[1].metadata["part"] == 2


def test_a_presentation_is_one_document_per_slide_with_its_notes(tmp_path: Path) -> None:
    docs = only(write_pptx(tmp_path / "deck.pptx"))
    assert [(d.metadata["slide"], d.metadata["location"]) for d in docs] == [
        (1, "slide 1 (Quarterly results)"),
        (2, "slide 2 (Outlook)"),
    ]
    assert docs[0].page_content == "# Quarterly results\nRevenue grew 12 percent"
    assert "We hire two engineers" in docs[1].page_content and "Mention the fuel budget" in docs[1].page_content


def test_a_workbook_is_one_document_per_sheet_and_its_rows_stay_rows(tmp_path: Path) -> None:
    docs = only(write_xlsx(tmp_path / "budget.xlsx"))
    assert [(d.metadata["sheet"], d.metadata["location"]) for d in docs] == [("Budget", "sheet Budget"), ("Staff", "sheet Staff")]
    lines = docs[0].page_content.split("\n")
    assert lines[0] == "## Budget" and "| Item | Cost |" in lines and "| Fuel | 1200 |" in lines and "| Crew | 3400 |" in lines


def test_csv_epub_odt_and_notebooks_are_read(tmp_path: Path) -> None:
    csv = only(WRITERS["csv"](tmp_path / "staff.csv"))
    assert csv[0].page_content.split("\n") == ["| name | role |", "| --- | --- |", "| Ada | Captain |", "| Bo | Engineer |"]
    book = only(WRITERS["epub"](tmp_path / "stories.epub"))
    assert {d.metadata["title"] for d in book} == {"Sea stories"}
    storm = next(d for d in book if d.metadata.get("section") == "The storm")
    assert "The waves rose at dawn." in storm.page_content and "* Reef the sails\n* Close the hatch" in storm.page_content
    assert any(d.metadata.get("section") == "The calm" and "sea was flat" in d.page_content for d in book)
    odt = only(WRITERS["odt"](tmp_path / "rules.odt"))
    assert odt[0].metadata["section"] == "Harbour rules" and odt[0].metadata["title"] == "Harbour rules"
    assert "No swimming near the pier." in odt[0].page_content and "Keep to the left channel" in odt[0].page_content
    assert "Berth" in odt[0].page_content and "Aurora" in odt[0].page_content
    notebook = only(WRITERS["ipynb"](tmp_path / "tides.ipynb"))
    assert len(notebook) == 1  # a "# comment" inside a code cell does not start a section
    assert notebook[0].metadata["section"] == "Tide analysis" and "x = 1" in notebook[0].page_content


def test_a_folder_walk_takes_every_new_type_by_default(tmp_path: Path) -> None:
    for kind, write in WRITERS.items():
        write(tmp_path / f"file.{kind}")
    result = load_documents(tmp_path)
    assert not result.skipped
    assert {d.metadata["file_type"] for d in result.documents} == set(WRITERS)
    assert all(file_type(f"x.{kind.upper()}") == kind for kind in WRITERS)
    assert {f"*.{kind}" for kind in WRITERS} <= set(DEFAULT_INCLUDE)


def test_citations_name_the_slide_or_sheet(tmp_path: Path) -> None:
    chunks = split_documents(only(write_pptx(tmp_path / "deck.pptx")), chunk_size=64, chunk_overlap=8)
    assert len({c.id for c in chunks}) == len(chunks)
    outlook = next(c for c in chunks if "engineers" in c.page_content)
    citation = Citation(1, outlook.metadata["source"], outlook.metadata["start_index"], None, None, "", outlook.id,
                        section=outlook.metadata["location"])
    assert citation.location == "slide 2 (Outlook)"
    assert Citation(1, "a.md", 40, None, None, "", None).location == "char 40"


def test_slides_with_the_same_text_get_different_chunk_ids(tmp_path: Path) -> None:
    import pptx

    deck = pptx.Presentation()
    for _ in range(2):
        deck.slides.add_slide(deck.slide_layouts[1]).shapes.title.text = "Questions?"
    deck.save(tmp_path / "twice.pptx")
    chunks = split_documents(only(tmp_path / "twice.pptx"), chunk_size=64, chunk_overlap=8)
    assert [c.metadata["slide"] for c in chunks] == [1, 2] and chunks[0].id != chunks[1].id


# --- hostile and broken files -------------------------------------------------------------------------


def test_a_decompression_bomb_is_refused_before_parsing(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.docx"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", b"\0" * 3_000_000)  # 3 MB of zeros deflate to ~3 KiB
    assert bomb.stat().st_size < 10_000
    reason = skip_reason(bomb, max_file_bytes=100_000)  # may expand to 20 x 100 kB
    assert "would expand to 2.9 MiB, over the limit of 1.9 MiB" in reason and "decompression bomb" in reason


def test_a_zip_that_declares_a_huge_member_is_refused_with_the_default_limits(tmp_path: Path) -> None:
    data = bytearray(write_docx(tmp_path / "a.docx").read_bytes())
    central = data.rindex(b"PK\x01\x02")  # the last member's central directory entry
    struct.pack_into("<I", data, central + 24, 2**31 + 2**30)  # its uncompressed size: 3 GiB
    (tmp_path / "huge.docx").write_bytes(bytes(data))
    assert re.search(r"would expand to 307\d\.\d MiB, over the limit of 2000\.0 MiB", skip_reason(tmp_path / "huge.docx"))


def test_a_member_that_lies_about_its_size_is_not_inflated_past_it(tmp_path: Path) -> None:
    source = tmp_path / "a.docx"
    write_docx(source)
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        names = archive.namelist()
    index = names.index("word/document.xml")
    offset = -1
    for _ in range(index + 1):
        offset = data.index(b"PK\x01\x02", offset + 1)
    struct.pack_into("<I", data, offset + 24, 10)  # it claims 10 bytes
    (tmp_path / "liar.docx").write_bytes(bytes(data))
    assert skip_reason(tmp_path / "liar.docx").startswith("not readable as a Word document (.docx): ")


def test_too_many_zip_members_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(MAX_ZIP_MEMBERS + 1):
            archive.writestr(f"m{i}", b"")
    with pytest.raises(ConversionError, match=f"declares {MAX_ZIP_MEMBERS + 1} members"):
        check_zip(buffer.getvalue(), 2**30)


def test_xml_entity_expansion_is_refused(tmp_path: Path) -> None:
    laughs = '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    for i in range(1, 10):
        laughs += f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
    laughs += ']><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>&lol9;</w:t></w:r></w:p></w:body></w:document>'
    source = write_docx(tmp_path / "a.docx")
    hostile = tmp_path / "laughs.docx"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(hostile, "w", zipfile.ZIP_DEFLATED) as new:
        for item in old.infolist():
            new.writestr(item, laughs if item.filename == "word/document.xml" else old.read(item))
    result = load_file(hostile, warn=False)
    text = " ".join(d.page_content for d in result.documents)
    assert len(text) < 10_000  # never a billion laughs
    assert result.skipped and result.skipped[0].reason.startswith("not readable as a Word document (.docx): ")


def test_broken_and_misnamed_files_are_skipped_with_their_reason_and_the_rest_still_load(tmp_path: Path) -> None:
    good = write_pptx(tmp_path / "good.pptx")
    docx = write_docx(tmp_path / "src.docx").read_bytes()
    (tmp_path / "src.docx").unlink()
    (tmp_path / "truncated.docx").write_bytes(docx[: len(docx) // 2])
    (tmp_path / "word.pdf").write_bytes(docx)
    (tmp_path / "word.pptx").write_bytes(docx)
    (tmp_path / "notes.xlsx").write_text("just some text, not a workbook\n", encoding="utf-8")
    (tmp_path / "empty.epub").write_bytes(b"")
    (tmp_path / "latin.csv").write_bytes("name\nZürich\n".encode("latin-1"))
    (tmp_path / "broken.ipynb").write_text("{ not json", encoding="utf-8")
    result = load_documents(tmp_path, include=["*"])
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert {d.metadata["source"] for d in result.documents} == {str(good)}
    assert reasons["truncated.docx"].startswith("not a valid zip container (BadZipFile")
    assert reasons["word.pdf"] == "it is a Word document (.docx) named .pdf; rename it to .docx"
    assert reasons["word.pptx"] == "it is a Word document (.docx) named .pptx; rename it to .docx"
    assert reasons["notes.xlsx"].startswith("not a valid zip container")
    assert reasons["empty.epub"] == "empty file"
    assert reasons["latin.csv"].startswith("not valid UTF-8 (byte 0xfc")
    assert reasons["broken.ipynb"].startswith("not readable as a Jupyter notebook: JSONDecodeError")
    assert len(reasons) == 7


def test_converted_text_over_the_per_file_limit_is_skipped(tmp_path: Path) -> None:
    import openpyxl

    workbook = openpyxl.Workbook()
    for i in range(2000):
        workbook.active.append((f"row {i}", "x" * 20))
    workbook.save(tmp_path / "wide.xlsx")
    size = (tmp_path / "wide.xlsx").stat().st_size
    reason = skip_reason(tmp_path / "wide.xlsx", max_file_bytes=size + 100)
    assert reason.startswith("its text is larger than the per-file limit")


def test_zip_kind_tells_the_formats_apart(tmp_path: Path) -> None:
    for kind in ("docx", "pptx", "xlsx", "epub", "odt"):
        assert zip_kind(WRITERS[kind](tmp_path / f"f.{kind}").read_bytes()) == kind
    assert zip_kind(b"PK\x03\x04 truncated") is None and zip_kind(b"%PDF-1.4") is None


# --- ingest: incremental, deduplicated -------------------------------------------------------------------


def test_ingest_of_new_types_is_incremental_and_deduplicated(tmp_path: Path, counting_embeddings: CountingEmbeddings) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    write_docx(folder / "handbook.docx")
    write_pptx(folder / "deck.pptx")
    write_xlsx(folder / "budget.xlsx")
    shutil.copy(folder / "budget.xlsx", folder / "budget copy.xlsx")
    chunking = ChunkingSettings(chunk_size=48, chunk_overlap=4, length_function=lambda t: len(t.split()))
    store, report = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert not report.skipped and len(report.new) == 4
    budget = [d for d in store.documents() if d.metadata.get("sheet") == "Budget"]
    assert len(budget) == 1  # both copies' chunks are stored once
    assert budget[0].metadata["sources"] == sorted([str(folder / "budget.xlsx"), str(folder / "budget copy.xlsx")])
    assert budget[0].metadata["location"] == "sheet Budget"
    assert any(d.metadata.get("location") == "slide 2 (Outlook)" for d in store.documents())
    counting_embeddings.texts.clear()
    _, report = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert len(report.unchanged) == 4 and counting_embeddings.texts == []
    write_docx(folder / "handbook.docx", refund_days=30)
    store, report = sync_index(folder, tmp_path / "idx", counting_embeddings, chunking=chunking)
    assert report.changed == [str(folder / "handbook.docx")]
    assert any("30 days" in t for t in counting_embeddings.texts) and not any("Fuel" in t for t in counting_embeddings.texts)
    assert not any("14 days" in d.page_content for d in store.documents())
