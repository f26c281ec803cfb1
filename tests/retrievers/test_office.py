"""The streaming converters (retrievers.office, retrievers.epub, retrievers.blocks, retrievers.bounds) on
the details a document carries: numbered lists, cells of every type, slide tables, HTML entities, limits."""

from __future__ import annotations

import datetime
import io
import time
import zipfile
from pathlib import Path

import pytest

from retrievers import load_file
from retrievers.blocks import Blocks, TextBuffer
from retrievers.bounds import Budget, ConversionError, ZipMembers
from retrievers.converters import convert

pytestmark = pytest.mark.timeout(120)


def budget(chars: int = 10**6, inflate: int = 10**8, seconds: float = 60.0) -> Budget:
    return Budget(max_text_chars=chars, max_unzipped_bytes=inflate, time_limit_s=seconds)


def text_of(path: Path) -> str:
    result = load_file(path)
    assert not result.skipped, result.skipped
    return "\n\n".join(d.page_content for d in result.documents)


def test_blocks_lay_out_headings_lists_and_padded_tables() -> None:
    blocks = Blocks(budget())
    blocks.heading(9, "  Deep   heading ")
    blocks.paragraph("one  line\ntwo")
    blocks.item("first")
    blocks.item("second")
    blocks.item("counted", "1.")
    blocks.table([["a", "b|c"], [], ["only"]])
    blocks.table([["x"]], heading="Sheet  1")
    assert blocks.markdown() == (
        "###### Deep heading\n\none line\ntwo\n\n* first\n* second\n\n1. counted\n\n"
        "| a | b\\|c |\n| --- | --- |\n| only |  |\n\n## Sheet 1\n| x |\n| --- |"
    )


def test_the_budget_counts_text_and_inflated_bytes_and_time() -> None:
    small = budget(chars=10)
    small.text(10)
    with pytest.raises(ConversionError, match="its text is larger than the per-file limit of 10 bytes"):
        small.text(1)
    tight = budget(inflate=5)
    with pytest.raises(ConversionError, match="inflated past the limit of 5 bytes"):
        tight.inflate(6)
    late = budget(seconds=0.01)
    time.sleep(0.02)
    with pytest.raises(ConversionError, match="longer than the per-file limit of 0.01 s"):
        late.tick()
    with pytest.raises(ValueError, match="time_limit_s must be positive"):
        budget(seconds=0)


def test_text_buffer_joins_every_piece_in_order() -> None:
    buffer = TextBuffer()
    pieces = [f"{i}," for i in range(3 * TextBuffer.JOIN + 5)]
    for piece in pieces:
        buffer.write(piece)
    assert buffer.value() == "".join(pieces)


def test_zip_members_are_read_within_a_limit_and_counted() -> None:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.xml", "<a>" + "x" * 200_000 + "</a>")
    counted = budget()
    members = ZipMembers(data.getvalue(), counted)
    assert len(members.read("a.xml", 10**6)) == 200_007 and counted.inflated == 200_007
    with pytest.raises(ConversionError, match="'a.xml' is larger than 1000 bytes"):
        members.read("a.xml", 1000)
    with pytest.raises(ConversionError, match="has no 'b.xml'"):
        members.read("b.xml", 1000)


def test_word_numbered_and_bulleted_lists_and_nested_tables(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Boarding", 2)
    for step in ("Show the ticket", "Board", "Sit"):
        document.add_paragraph(step, style="List Number")
    document.add_paragraph("Mind the gap", style="List Bullet")
    outer = document.add_table(rows=2, cols=2)
    outer.cell(0, 0).text, outer.cell(0, 1).text = "Pier", "Boats"
    outer.cell(1, 0).text = "4"
    inner = outer.cell(1, 1).add_table(rows=1, cols=2)
    inner.cell(0, 0).text, inner.cell(0, 1).text = "Aurora", "Borealis"
    document.save(tmp_path / "steps.docx")
    text = text_of(tmp_path / "steps.docx")
    assert "## Boarding\n\n1. Show the ticket\n2. Board\n3. Sit\n\n* Mind the gap" in text
    assert "| Pier | Boats |\n| --- | --- |\n| 4 | Aurora Borealis |" in text


def test_workbook_cells_of_every_type(tmp_path: Path) -> None:
    import openpyxl

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Log"
    sheet.append(("when", "at", "ok", "ratio", "count", "note"))
    sheet.append((datetime.datetime(2026, 3, 1, 9, 30), datetime.time(12, 15), True, 0.25, 3.0, "a|b"))
    sheet["H5"] = "far"
    workbook.save(tmp_path / "log.xlsx")
    rows = text_of(tmp_path / "log.xlsx").split("\n")
    assert rows[0] == "## Log"
    assert "| 2026-03-01T09:30:00 | 12:15:00 | True | 0.25 | 3 | a\\|b |  |  |" in rows
    assert "|  |  |  |  |  |  |  | far |" in rows


def test_slides_keep_tables_and_order_shapes_top_to_bottom(tmp_path: Path) -> None:
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
    slide.shapes.title.text = "Timetable"
    low = slide.shapes.add_textbox(Inches(1), Inches(6), Inches(4), Inches(1))
    low.text_frame.text = "Below the table"
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(2)).table
    for (r, c), value in {(0, 0): "Day", (0, 1): "Time", (1, 0): "Monday", (1, 1): "12:00"}.items():
        table.cell(r, c).text = value
    deck.save(tmp_path / "table.pptx")
    docs = load_file(tmp_path / "table.pptx").documents
    assert docs[0].page_content == "# Timetable\n| Day | Time |\n| --- | --- |\n| Monday | 12:00 |\nBelow the table"


def test_epub_chapters_with_html_entities_tables_and_scripts(tmp_path: Path) -> None:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("x")
    book.set_title("Ferries")
    chapter = epub.EpubHtml(title="Fares", file_name="fares.xhtml")
    chapter.content = (
        "<h2>Fares&nbsp;&amp; passes</h2><script>var hidden = 1;</script><p>Children ride free.<br/>Dogs too.</p>"
        "<table><tr><th>Ticket</th><th>Price</th></tr><tr><td>Day</td><td>5 &euro;</td></tr></table><ol><li>Buy</li><li>Ride</li></ol>"
    )
    book.add_item(chapter)
    book.spine = [chapter]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    epub.write_epub(str(tmp_path / "f.epub"), book)
    docs = load_file(tmp_path / "f.epub").documents
    fares = next(d for d in docs if d.metadata.get("section") == "Fares & passes")
    assert fares.page_content == (
        "## Fares & passes\n\nChildren ride free.\nDogs too.\n\n| Ticket | Price |\n| --- | --- |\n| Day | 5 € |\n\n* Buy\n* Ride"
    )
    assert all("hidden" not in d.page_content for d in docs)


def test_odt_text_is_bounded_like_the_rest(tmp_path: Path) -> None:
    from tests.retrievers.office_files import write_odt

    data = write_odt(tmp_path / "rules.odt").read_bytes()
    with pytest.raises(ConversionError, match="its text is larger than the per-file limit of 20 bytes"):
        convert(data, "odt", max_text_chars=20, max_unzipped_bytes=10**8)
    parts = convert(data, "odt", max_text_chars=10**6, max_unzipped_bytes=10**8)
    assert parts[0].text.endswith("| Berth | Boat |\n| --- | --- |\n| 1 | Aurora |")


def test_csv_trims_outer_blank_rows_and_pads_to_the_widest_row() -> None:
    data = "\n\nname,role\n\nAda,Captain,extra\n\nBo\n\n\n".encode()
    parts = convert(data, "csv", max_text_chars=10**6, max_unzipped_bytes=0)
    assert parts[0].text.split("\n") == [
        "| name | role |  |", "| --- | --- | --- |", "| Ada | Captain | extra |", "|  |  |  |", "| Bo |  |  |"
    ]


def test_tables_nested_thousands_deep_are_bounded_by_the_text_limit(tmp_path: Path) -> None:
    from benchmarks.parse_limits import base_docx, copy_except

    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    nested = "<w:tbl><w:tr><w:tc>" * 20_000 + "<w:p><w:r><w:t>deep</w:t></w:r></w:p>" + "</w:tc></w:tr></w:tbl>" * 20_000
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        copy_except(base_docx(), archive, "word/document.xml")
        archive.writestr("word/document.xml", f'<w:document xmlns:w="{w}"><w:body>{nested}</w:body></w:document>')
    with pytest.raises(ConversionError, match="its text is larger than the per-file limit"):
        convert(buffer.getvalue(), "docx", max_text_chars=100_000, max_unzipped_bytes=10**8)
    assert "deep" in convert(buffer.getvalue(), "docx", max_text_chars=10**7, max_unzipped_bytes=10**8)[0].text
