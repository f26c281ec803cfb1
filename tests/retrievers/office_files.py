"""Small real Office, e-book, spreadsheet, CSV and notebook files, written by the libraries that make them."""

from __future__ import annotations

import json
from pathlib import Path


def write_docx(path: Path, *, title: str = "Ferry handbook", refund_days: int = 14) -> Path:
    import docx

    document = docx.Document()
    document.core_properties.title = title
    document.add_heading("Departures", 1)
    document.add_paragraph("The ferry leaves at noon from pier 4.")
    document.add_paragraph("Bring a printed ticket", style="List Bullet")
    document.add_paragraph("Bring an identity card", style="List Bullet")
    table = document.add_table(rows=3, cols=2)
    for row, cells in zip(table.rows, (("Day", "Time"), ("Monday", "12:00"), ("Tuesday", "13:30"))):
        for cell, text in zip(row.cells, cells):
            cell.text = text
    document.add_heading("Refunds", 1)
    document.add_paragraph(f"Refunds are paid within {refund_days} days.")
    document.save(path)
    return path


def write_pptx(path: Path) -> Path:
    import pptx

    deck = pptx.Presentation()
    for heading, body in (("Quarterly results", "Revenue grew 12 percent"), ("Outlook", "We hire two engineers")):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = heading
        slide.placeholders[1].text = body
    slide.notes_slide.notes_text_frame.text = "Mention the fuel budget"
    deck.save(path)
    return path


def write_xlsx(path: Path) -> Path:
    import openpyxl

    workbook = openpyxl.Workbook()
    budget = workbook.active
    budget.title = "Budget"
    for row in (("Item", "Cost"), ("Fuel", 1200), ("Crew", 3400)):
        budget.append(row)
    staff = workbook.create_sheet("Staff")
    for row in (("Name", "Role"), ("Ada", "Captain")):
        staff.append(row)
    workbook.save(path)
    return path


def write_epub(path: Path) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("sea-stories-1")
    book.set_title("Sea stories")
    book.set_language("en")
    storm = epub.EpubHtml(title="The storm", file_name="storm.xhtml")
    storm.content = "<h1>The storm</h1><p>The waves rose at dawn.</p><ul><li>Reef the sails</li><li>Close the hatch</li></ul>"
    calm = epub.EpubHtml(title="The calm", file_name="calm.xhtml")
    calm.content = "<h1>The calm</h1><p>By noon the sea was flat.</p>"
    for chapter in (storm, calm):
        book.add_item(chapter)
    book.toc = (storm, calm)
    book.spine = [storm, calm]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    epub.write_epub(str(path), book)
    return path


def write_odt(path: Path) -> Path:
    from odf.opendocument import OpenDocumentText
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, List, ListItem, P

    document = OpenDocumentText()
    document.text.addElement(H(outlinelevel=1, text="Harbour rules"))
    document.text.addElement(P(text="No swimming near the pier."))
    items = List()
    item = ListItem()
    item.addElement(P(text="Keep to the left channel"))
    items.addElement(item)
    document.text.addElement(items)
    table = Table(name="Berths")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    for cells in (("Berth", "Boat"), ("1", "Aurora")):
        row = TableRow()
        for text in cells:
            cell = TableCell()
            cell.addElement(P(text=text))
            row.addElement(cell)
        table.addElement(row)
    document.text.addElement(table)
    document.save(str(path))
    return path


def write_csv(path: Path) -> Path:
    path.write_text("name,role\nAda,Captain\nBo,Engineer\n", encoding="utf-8")
    return path


def write_ipynb(path: Path) -> Path:
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Tide analysis\n", "Load the tide table."]},
            {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [], "source": ["# not a heading\n", "x = 1\n"]},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook), encoding="utf-8")
    return path


WRITERS = {
    "docx": write_docx,
    "pptx": write_pptx,
    "xlsx": write_xlsx,
    "epub": write_epub,
    "odt": write_odt,
    "csv": write_csv,
    "ipynb": write_ipynb,
}
