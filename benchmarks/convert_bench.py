"""Conversion speed of the Office, e-book and table formats: ragspec's loader (its streaming converters) against the bare per-format libraries.

Builds one larger file per format with the library that writes it (a 300-paragraph Word file with
lists and a table, a 60-slide deck, a 5,000-row workbook, a 30-chapter EPUB), then times
``load_file`` (conversion, parts and metadata) and the plain text the writing library
reads back (python-docx paragraphs and cells, python-pptx text frames, openpyxl cell values,
ebooklib + BeautifulSoup), median of ``--rounds`` warm runs each, interleaved.

    python benchmarks/convert_bench.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def build(folder: Path) -> dict[str, Path]:
    import docx
    import openpyxl
    import pptx
    from ebooklib import epub

    files: dict[str, Path] = {}
    document = docx.Document()
    for section in range(30):
        document.add_heading(f"Section {section}", 1)
        for i in range(8):
            document.add_paragraph(f"Paragraph {i} of section {section}: the ferry leaves pier {i} at {section}:00 on weekdays.")
        document.add_paragraph("Bring a printed ticket", style="List Bullet")
        document.add_paragraph("Bring an identity card", style="List Bullet")
    table = document.add_table(rows=40, cols=4)
    for r, row in enumerate(table.rows):
        for c, cell in enumerate(row.cells):
            cell.text = f"r{r}c{c}"
    files["docx"] = folder / "big.docx"
    document.save(files["docx"])

    deck = pptx.Presentation()
    for i in range(60):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Slide {i}"
        slide.placeholders[1].text = f"Revenue in region {i} grew {i % 17} percent\nHiring {i % 5} engineers"
    files["pptx"] = folder / "big.pptx"
    deck.save(files["pptx"])

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.append(("Item", "Region", "Cost", "Note"))
    for i in range(5000):
        sheet.append((f"item {i}", f"region {i % 40}", i * 3, f"note {i % 97}"))
    files["xlsx"] = folder / "big.xlsx"
    workbook.save(files["xlsx"])

    book = epub.EpubBook()
    book.set_identifier("bench")
    book.set_title("Bench book")
    chapters = []
    for i in range(30):
        chapter = epub.EpubHtml(title=f"Chapter {i}", file_name=f"c{i}.xhtml")
        chapter.content = f"<h1>Chapter {i}</h1>" + "".join(f"<p>Line {j} of chapter {i}, the sea was calm.</p>" for j in range(40))
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = tuple(chapters)
    book.spine = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    files["epub"] = folder / "big.epub"
    epub.write_epub(str(files["epub"]), book)
    return files


def bare(kind: str, path: Path) -> str:
    """The text the per-format library gives with the least code: no headings, list markers or table rows kept."""
    if kind == "docx":
        import docx

        document = docx.Document(path)
        cells = [cell.text for table in document.tables for row in table.rows for cell in row.cells]
        return "\n".join([p.text for p in document.paragraphs] + cells)
    if kind == "pptx":
        import pptx

        deck = pptx.Presentation(path)
        return "\n".join(s.text_frame.text for slide in deck.slides for s in slide.shapes if s.has_text_frame)
    if kind == "xlsx":
        import openpyxl

        workbook = openpyxl.load_workbook(path, read_only=True, data_only=True)
        return "\n".join(" ".join(str(v) for v in row if v is not None) for ws in workbook for row in ws.iter_rows(values_only=True))
    import ebooklib
    from bs4 import BeautifulSoup
    from ebooklib import epub

    book = epub.read_epub(str(path))
    return "\n".join(BeautifulSoup(item.get_content(), "html.parser").get_text("\n") for item in book.get_items_of_type(ebooklib.ITEM_DOCUMENT))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from retrievers.loaders import load_file

    with tempfile.TemporaryDirectory() as tmp:
        files = build(Path(tmp))
        start = time.perf_counter()
        load_file(files["docx"])  # imports the converters once
        print(f"first conversion (imports): {time.perf_counter() - start:.2f} s")
        print("| file | size | ragspec | parts | bare library | text chars (ragspec / bare) |")
        print("|---|---|---|---|---|---|")
        for kind, path in files.items():
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(args.rounds):
                ours.append(timed(lambda: load_file(path)))
                theirs.append(timed(lambda: bare(kind, path)))
            loaded = load_file(path)
            chars = sum(len(d.page_content) for d in loaded.documents)
            print(
                f"| {kind} | {path.stat().st_size / 1024:.0f} KiB | {statistics.median(ours) * 1000:.0f} ms | {len(loaded.documents)} "
                f"| {statistics.median(theirs) * 1000:.0f} ms | {chars} / {len(bare(kind, path))} |"
            )


if __name__ == "__main__":
    main()
