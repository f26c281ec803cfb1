"""Word, PowerPoint, Excel and OpenDocument text files as Markdown, parsed as streams.

Each reads its XML members through `retrievers.bounds.ZipMembers.parse`: a parser target keeps
only the paragraph, table or row being read, and hands finished ones to `retrievers.blocks.Blocks`
(or a slide's or sheet's text list), so memory follows the text extracted and every block is
counted by the file's `Budget`. What is kept of a document: headings (Word's "Heading N" and
"Title" styles, OpenDocument's outline levels, slide titles), paragraphs, list items, tables as
Markdown rows, speaker notes, sheet cells (dates as ISO dates, as openpyxl reads them).
Formatting, images and charts are left out.
"""

from __future__ import annotations

import datetime
import posixpath
import re

from retrievers.blocks import Blocks
from retrievers.bounds import Budget, ConversionError, XmlTarget, ZipMembers, local_name

__all__ = ["docx_markdown", "odt_markdown", "pptx_markdown", "xlsx_markdown", "relationships"]

_SMALL = 16 * 2**20
"""Largest relationship list, workbook or style part read whole."""
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_OPEN_COST = 64
"""Characters a table, cell or paragraph opened inside another costs the text budget: about what
holding it costs, so that thousands of nested empty tables are bounded like text."""


class _Collect(XmlTarget):
    """A parser target that records (tag, attrib) of chosen elements (for small parts: rels, workbook, styles)."""

    def __init__(self, names: set[str], budget: Budget) -> None:
        self.names = names
        self.budget = budget
        self.found: list[tuple[str, dict[str, str]]] = []

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name in self.names:
            self.budget.text(len(name) + sum(len(v) for v in attrib.values()))
            self.found.append((name, attrib))


def _elements(members: ZipMembers, name: str, names: set[str]) -> list[tuple[str, dict[str, str]]]:
    target = _Collect(names, members.budget)
    members.parse(name, target)
    return target.found


def relationships(members: ZipMembers, part: str) -> dict[str, tuple[str, str]]:
    """The relationships of `part` (``word/document.xml``): id -> (type's last word, target member path)."""
    folder, base = posixpath.split(part)
    rels = posixpath.join(folder, "_rels", base + ".rels")
    if rels not in members.names:
        return {}
    found = {}
    for _, attrib in _elements(members, rels, {"Relationship"}):
        if attrib.get("TargetMode") == "External":
            continue
        target = attrib.get("Target", "")
        path = target.lstrip("/") if target.startswith("/") else posixpath.normpath(posixpath.join(folder, target))
        found[attrib.get("Id", "")] = (attrib.get("Type", "").rpartition("/")[2], path)
    return found


# --- Word ------------------------------------------------------------------------------------------


class _WordStyles(XmlTarget):
    """styles.xml: which paragraph styles are headings (and of what level) and which are lists (and their numbering)."""

    _HEADING = re.compile(r"^heading\s*([1-9])$")

    def __init__(self) -> None:
        self.levels: dict[str, int] = {}
        self.lists: set[str] = set()
        self.numbering: dict[str, str] = {}  # style id -> numId
        self._id: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "style":
            self._id = _w(attrib, "styleId")
        elif name == "name" and self._id is not None:
            value = (_w(attrib, "val") or "").strip().lower()
            match = self._HEADING.match(value)
            if match:
                self.levels[self._id] = int(match.group(1))
            elif value == "title":
                self.levels[self._id] = 1
            elif value.startswith("list"):
                self.lists.add(self._id)
        elif name == "numPr" and self._id is not None:
            self.lists.add(self._id)
        elif name == "numId" and self._id is not None:
            self.numbering[self._id] = _w(attrib, "val") or ""

    def end(self, tag: str) -> None:
        if local_name(tag) == "style":
            self._id = None


class _WordNumbering(XmlTarget):
    """numbering.xml: which list levels are numbered ("1.") rather than bulleted."""

    def __init__(self) -> None:
        self.formats: dict[str, dict[str, str]] = {}  # abstractNumId -> ilvl -> numFmt
        self.abstract: dict[str, str] = {}  # numId -> abstractNumId
        self._abstract: str | None = None
        self._level = "0"
        self._num: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "abstractNum":
            self._abstract = _w(attrib, "abstractNumId")
            self.formats.setdefault(self._abstract or "", {})
        elif name == "lvl":
            self._level = _w(attrib, "ilvl") or "0"
        elif name == "numFmt" and self._abstract is not None:
            self.formats[self._abstract][self._level] = _w(attrib, "val") or ""
        elif name == "num":
            self._num = _w(attrib, "numId")
        elif name == "abstractNumId" and self._num is not None:
            self.abstract[self._num] = _w(attrib, "val") or ""

    def end(self, tag: str) -> None:
        name = local_name(tag)
        if name == "abstractNum":
            self._abstract = None
        elif name == "num":
            self._num = None


    def ordered(self, num_id: str, level: str) -> bool:
        fmt = self.formats.get(self.abstract.get(num_id, ""), {}).get(level, "bullet")
        return fmt not in ("bullet", "none", "")


def _w(attrib: dict[str, str], name: str) -> str | None:
    """A WordprocessingML attribute (``w:val``) whatever its namespace prefix."""
    for key, value in attrib.items():
        if local_name(key) == name:
            return value
    return None


class _Tables:
    """The tables open in a body (nested ones inside cells), their rows, and the paragraphs of each open
    cell: Word's and OpenDocument's bodies both keep them here. A finished outermost table goes to ``blocks``."""

    def __init__(self, blocks: Blocks, elements: tuple[str, str, str]) -> None:
        self.blocks = blocks
        self.open: list[list[list[str]]] = []  # open tables, their rows
        self.cells: list[list[str]] = []  # the paragraphs of each open cell
        self._openers = dict(zip(elements, (self.open_table, self.open_row, self.open_cell)))

    def start(self, name: str) -> None:
        """Open a table, row or cell where ``name`` is the format's element for one (``elements``)."""
        opener = self._openers.get(name)
        if opener is not None:
            opener()

    def open_table(self) -> None:
        self.blocks.budget.text(_OPEN_COST if self.open else 0)
        self.open.append([])

    def open_row(self) -> None:
        if self.open:
            self.open[-1].append([])

    def open_cell(self) -> None:
        self.blocks.budget.text(_OPEN_COST if self.cells else 0)
        self.cells.append([])

    def paragraph(self, text: str) -> None:
        """A paragraph of the innermost open cell (blank ones are left out)."""
        if text.strip():
            self.cells[-1].append(" ".join(text.split()))

    def close_cell(self) -> str | None:
        """Close the innermost cell into its table's last row; its text when no row holds it."""
        if not self.cells:
            return None
        cell = " ".join(self.cells.pop())
        if self.open and self.open[-1]:
            self.blocks.budget.text(len(cell) + 3)
            self.open[-1][-1].append(cell)
            return None
        return cell

    def close_table(self) -> None:
        if not self.open:
            return
        rows = self.open.pop()
        if self.cells:  # a table inside a cell: its text joins the cell
            self.cells[-1].append(" ".join(" ".join(row) for row in rows))
        else:
            self.blocks.table(rows)


class _WordBody(XmlTarget):
    """document.xml: paragraphs (headings, list items), and tables whose cells hold paragraphs."""

    def __init__(self, blocks: Blocks, styles: _WordStyles, numbering: _WordNumbering) -> None:
        self.blocks = blocks
        self.styles = styles
        self.numbering = numbering
        self.counts: dict[tuple[str, int], int] = {}  # items so far per (numId, level)
        self.text: list[str] = []
        self.style: str | None = None
        self.listed = False
        self.num_id: str | None = None
        self.level = 0
        self.in_text = False
        self.tables = _Tables(blocks, ("tbl", "tr", "tc"))

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "p":
            self.text, self.style, self.listed, self.num_id, self.level = [], None, False, None, 0
        elif name == "t":
            self.in_text = True
        elif name in ("tab", "br", "cr") and not self.in_text:
            self.text.append(" " if name == "tab" else "\n")
        elif name == "pStyle":
            self.style = _w(attrib, "val")
        elif name == "numPr":
            self.listed = True
        elif name == "numId":
            self.num_id = _w(attrib, "val")
        elif name == "ilvl":
            value = _w(attrib, "val") or "0"
            self.level = int(value) if value.isdigit() else 0
        else:
            self.tables.start(name)

    def end(self, tag: str) -> None:
        name = local_name(tag)
        if name == "t":
            self.in_text = False
        elif name == "p":
            self._paragraph("".join(self.text))
            self.text = []
        elif name == "tc":
            loose = self.tables.close_cell()
            if loose is not None and self.tables.cells:  # a cell outside any row: its text joins the enclosing cell
                self.tables.cells[-1].append(loose)
        elif name == "tbl":
            self.tables.close_table()

    def data(self, text: str) -> None:
        if self.in_text:
            self.blocks.budget.text(len(text))
            self.text.append(text)


    def _paragraph(self, text: str) -> None:
        if self.tables.cells:
            self.tables.paragraph(text)
            return
        level = self.styles.levels.get(self.style or "")
        if level is not None:
            self.blocks.heading(level, text)
        elif self.num_id != "0" and (self.listed or (self.style or "") in self.styles.lists):
            self.blocks.item(text, self._marker())
        else:
            self.blocks.paragraph(text)

    def _marker(self) -> str:
        """``*`` for a bulleted item; ``N.`` for the Nth item of a numbered list at its level."""
        num_id = self.num_id or self.styles.numbering.get(self.style or "", "")
        if not self.numbering.ordered(num_id, str(self.level)):
            return "*"
        for key in [k for k in self.counts if k[0] == num_id and k[1] > self.level]:
            del self.counts[key]  # a deeper list starts again after this item
        count = self.counts[num_id, self.level] = self.counts.get((num_id, self.level), 0) + 1
        return f"{count}."


def docx_markdown(members: ZipMembers) -> str:
    """A Word document's body as Markdown."""
    document = _main_part(members, "word/document.xml")
    styles = _WordStyles()
    numbering = _WordNumbering()
    for kind, path in relationships(members, document).values():
        if kind == "styles" and path in members.names:
            members.parse(path, styles)
        elif kind == "numbering" and path in members.names:
            members.parse(path, numbering)
    blocks = Blocks(members.budget)
    members.parse(document, _WordBody(blocks, styles, numbering))
    return blocks.markdown()


def _typed(members: ZipMembers, content_type: str) -> list[str]:
    """Part names (``/xl/sharedStrings.xml``) that ``[Content_Types].xml`` gives a content type ending in `content_type`."""
    if "[Content_Types].xml" not in members.names:
        return []
    overrides = _elements(members, "[Content_Types].xml", {"Override"})
    return [a.get("PartName", "") for _, a in overrides if a.get("ContentType", "").endswith(content_type)]


def _main_part(members: ZipMembers, default: str) -> str:
    """The package's main part (``_rels/.rels``'s officeDocument), or the usual name."""
    for kind, path in relationships(members, "").values():
        if kind == "officeDocument" and path in members.names:
            return path
    return default


# --- PowerPoint ------------------------------------------------------------------------------------


class _Slide(XmlTarget):
    """A slide (or notes) part: each shape's position, whether it is the title, and its text; tables as rows."""

    def __init__(self, budget: Budget, placeholder: str | None = None) -> None:
        self.budget = budget
        self.placeholder = placeholder  # notes: only the body placeholder's text
        self.shapes: list[tuple[float, float, str]] = []
        self.depth = 0  # nesting of sp / graphicFrame
        self.kind = ""
        self.offset: tuple[float, float] | None = None
        self.paragraphs: list[str] = []
        self.text: list[str] = []
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None
        self.in_text = False

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name in ("sp", "graphicFrame"):
            self.depth += 1
            if self.depth == 1:
                self.kind, self.offset, self.paragraphs, self.rows = "", None, [], []
        elif self.depth == 0:
            return
        elif name == "ph":
            self.kind = attrib.get("type", "body")
        elif name == "off" and self.offset is None:
            self.offset = (_number(attrib.get("y")), _number(attrib.get("x")))
        elif name == "p":
            self.text = []
        elif name == "t":
            self.in_text = True
        elif name == "br":
            self.text.append("\n")
        elif name == "tr":
            self.rows.append([])
        elif name == "tc":
            self.cell = []

    def end(self, tag: str) -> None:
        name = local_name(tag)
        if self.depth == 0:
            return
        if name == "t":
            self.in_text = False
        elif name == "p":
            paragraph = "".join(self.text)
            (self.cell if self.cell is not None else self.paragraphs).append(paragraph)
        elif name == "tc" and self.cell is not None:
            if self.rows:
                self.rows[-1].append(" ".join(self.cell))
                self.budget.text(3)
            self.cell = None
        elif name in ("sp", "graphicFrame"):
            self.depth -= 1
            if self.depth == 0:
                self._shape()

    def data(self, text: str) -> None:
        if self.in_text and self.depth:
            self.budget.text(len(text))
            self.text.append(text)


    def _shape(self) -> None:
        top, left = self.offset if self.offset is not None else (float("-inf"), float("-inf"))
        if self.rows:
            markdown = Blocks(self.budget)
            markdown.table(self.rows)
            self.shapes.append((top, left, markdown.markdown() + "\n"))
            return
        if self.placeholder is not None and self.kind != self.placeholder:
            return
        text = "\n".join(self.paragraphs)
        if self.kind in ("title", "ctrTitle"):
            if text.strip():
                self.shapes.append((top, left, "# " + text.lstrip() + "\n"))
        elif self.paragraphs:
            self.shapes.append((top, left, text + "\n"))

    def markdown(self) -> str:
        """The shapes' text top to bottom, then left to right (MarkItDown's order)."""
        ordered = sorted(range(len(self.shapes)), key=lambda i: self.shapes[i][:2])
        return "".join(self.shapes[i][2] for i in ordered).strip()


def _number(value: str | None) -> float:
    try:
        return float(value) if value is not None else float("-inf")
    except ValueError:
        return float("-inf")


def pptx_markdown(members: ZipMembers) -> str:
    """A presentation as MarkItDown wrote it: ``<!-- Slide number: N -->`` and each slide's text, then its notes."""
    presentation = _main_part(members, "ppt/presentation.xml")
    rels = relationships(members, presentation)
    order = [_r_id(attrib) for _, attrib in _elements(members, presentation, {"sldId"})]
    out: list[str] = []
    for number, rid in enumerate((r for r in order if r in rels), start=1):
        path = rels[rid][1]
        slide = _Slide(members.budget)
        members.parse(path, slide)
        text = slide.markdown()
        for kind, notes_path in relationships(members, path).values():
            if kind == "notesSlide" and notes_path in members.names:
                notes = _Slide(members.budget, placeholder="body")
                members.parse(notes_path, notes)
                if notes.markdown():
                    text = (text + "\n\n### Notes:\n" + notes.markdown()).strip()
        out.append(f"\n\n<!-- Slide number: {number} -->\n{text}")
    return "".join(out).strip()


def _r_id(attrib: dict[str, str]) -> str:
    return attrib.get(_R + "id", "")


# --- Excel -----------------------------------------------------------------------------------------

_DATE_FORMATS = {14, 15, 16, 17, 18, 19, 20, 21, 22, 45, 46, 47}
_TIMEDELTA = re.compile(r"\[(h+|m+|s+)\]", re.IGNORECASE)
_NOT_DATE = re.compile(r'"[^"]*"|\\.|\[[^\]]*\]')
_SHARED_STRING_COST = 64
"""Characters a shared string costs the text budget beyond its own: the table is held in memory, and a
Python string and its place in a list take about 64 bytes besides the text."""


class _SharedStrings(XmlTarget):
    """sharedStrings.xml: the text of each ``si`` (its runs joined, phonetic runs left out)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.strings: list[str] = []
        self.text: list[str] = []
        self.in_text = False
        self.phonetic = 0

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "si":
            self.text = []
        elif name == "t":
            self.in_text = True
        elif name == "rPh":
            self.phonetic += 1

    def end(self, tag: str) -> None:
        name = local_name(tag)
        if name == "si":
            value = "".join(self.text)
            self.budget.text(len(value) + _SHARED_STRING_COST)
            self.strings.append(value)
        elif name == "t":
            self.in_text = False
        elif name == "rPh":
            self.phonetic -= 1

    def data(self, text: str) -> None:
        if self.in_text and not self.phonetic:
            self.text.append(text)


class _Sheet(XmlTarget):
    """A worksheet's rows of cell texts (empty rows left out, trailing empty cells cut)."""

    def __init__(self, budget: Budget, shared: list[str], dates: set[int], timedeltas: set[int], epoch: datetime.datetime) -> None:
        self.budget = budget
        self.shared = shared
        self.dates = dates
        self.timedeltas = timedeltas
        self.epoch = epoch
        self.rows: list[list[str]] = []
        self.row: dict[int, str] = {}
        self.column = 0
        self.type = "n"
        self.style = 0
        self.value: list[str] = []
        self.in_value = False

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "row":
            self.row, self.column = {}, 0
        elif name == "c":
            self.column = _column(attrib.get("r"), self.column + 1)
            self.type = attrib.get("t", "n")
            self.style = int(attrib.get("s", "0") or 0) if attrib.get("s", "0").isdigit() else 0
            self.value = []
        elif name in ("v", "t"):
            self.in_value = True

    def end(self, tag: str) -> None:
        name = local_name(tag)
        if name in ("v", "t"):
            self.in_value = False
        elif name == "c":
            text = " ".join(self._cell("".join(self.value)).split())
            if text:
                self.budget.text(len(text) + 3)
                self.row[self.column] = text
        elif name == "row" and self.row:
            width = max(self.row)
            self.budget.text(3 * width)
            self.rows.append([self.row.get(i, "") for i in range(1, width + 1)])
            self.row = {}

    def data(self, text: str) -> None:
        if self.in_value:
            self.value.append(text)


    def _cell(self, raw: str) -> str:
        kind = self.type
        if kind == "s":
            try:
                return self.shared[int(raw)]
            except (ValueError, IndexError):
                return ""
        if kind == "b":
            return "True" if raw.strip() == "1" else "False" if raw.strip() else ""
        if kind in ("str", "inlineStr", "e", "d"):
            return raw
        return self._number(raw.strip())

    def _number(self, raw: str) -> str:
        try:
            value = float(raw)
        except ValueError:
            return raw
        if self.style in self.timedeltas:
            return str(datetime.timedelta(days=value))
        if self.style in self.dates:
            try:
                return _excel_date(value, self.epoch).isoformat()
            except (OverflowError, ValueError):
                return raw
        return str(int(value)) if value.is_integer() else str(value)


def _excel_date(value: float, epoch: datetime.datetime) -> datetime.date | datetime.time | datetime.datetime:
    """An Excel serial date as openpyxl reads it (the 1900 system's phantom 29 February included)."""
    day, fraction = divmod(value, 1)
    diff = datetime.timedelta(milliseconds=round(fraction * 86400 * 1000))
    if 0 <= value < 1 and diff.days == 0:
        return (datetime.datetime.min + diff).time()
    if 0 < value < 60 and epoch.year == 1899:
        day += 1
    return epoch + datetime.timedelta(days=day) + diff


def _column(reference: str | None, default: int) -> int:
    """``"BC12"`` -> 55; `default` without a reference."""
    if not reference:
        return default
    number = 0
    for char in reference:
        if not char.isalpha():
            break
        number = number * 26 + (ord(char.upper()) - 64)
        if number > 16_384:  # past Excel's last column XFD
            raise ConversionError(f"a cell reference {reference[:20]!r} is past Excel's last column")
    return number or default


class _Styles(XmlTarget):
    """styles.xml of a workbook: which cell formats (``s`` of a cell) show dates, and which durations."""

    def __init__(self) -> None:
        self.codes: dict[int, str] = {}
        self.formats: list[int] = []
        self.in_xfs = False

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "numFmt" and attrib.get("numFmtId", "").isdigit():
            self.codes[int(attrib["numFmtId"])] = attrib.get("formatCode", "")
        elif name == "cellXfs":
            self.in_xfs = True
        elif name == "xf" and self.in_xfs:
            number = attrib.get("numFmtId", "0")
            self.formats.append(int(number) if number.isdigit() else 0)

    def end(self, tag: str) -> None:
        if local_name(tag) == "cellXfs":
            self.in_xfs = False


    def kinds(self) -> tuple[set[int], set[int]]:
        dates, timedeltas = set(), set()
        for index, number in enumerate(self.formats):
            code = self.codes.get(number)
            if code is not None and _TIMEDELTA.search(code):
                timedeltas.add(index)
            elif number in _DATE_FORMATS or (code is not None and re.search(r"[dmyhs]", _NOT_DATE.sub("", code), re.IGNORECASE)):
                dates.add(index)
        return dates, timedeltas


def xlsx_markdown(members: ZipMembers) -> str:
    """MarkItDown's Excel layout: ``## sheet`` and a Markdown table per sheet, the first non-empty row its header."""
    workbook = _main_part(members, "xl/workbook.xml")
    rels = relationships(members, workbook)
    sheets = _elements(members, workbook, {"sheet", "workbookPr"})
    mac = any(n == "workbookPr" and a.get("date1904", "").lower() in ("1", "true") for n, a in sheets)
    epoch = datetime.datetime(1904, 1, 1) if mac else datetime.datetime(1899, 12, 30)
    shared = _SharedStrings(members.budget)
    styles = _Styles()
    parts = {kind: path for kind, path in rels.values() if path in members.names}
    if "sharedStrings" not in parts:  # openpyxl's reader finds the table by its content type
        parts.update(("sharedStrings", "/".join(p.split("/")[1:])) for p in _typed(members, "spreadsheetml.sharedStrings+xml"))
    if parts.get("sharedStrings") in members.names:
        members.parse(parts["sharedStrings"], shared)
    if "styles" in parts:
        members.parse(parts["styles"], styles)
    dates, timedeltas = styles.kinds()
    blocks = Blocks(members.budget)
    for name, attrib in sheets:
        target = rels.get(_r_id(attrib))
        if name != "sheet" or target is None or target[0] != "worksheet":
            continue
        sheet = _Sheet(members.budget, shared.strings, dates, timedeltas, epoch)
        members.parse(target[1], sheet)
        blocks.table(sheet.rows, heading=attrib.get("name", ""))
    return blocks.markdown()


# --- OpenDocument text -----------------------------------------------------------------------------


class _OdtBody(XmlTarget):
    """content.xml of an .odt: headings by outline level, paragraphs, list items, tables; notes and annotations left out."""

    _SKIP = {"note", "annotation", "tracked-changes", "sequence-decls"}

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks
        self.in_body = False
        self.skipping = 0
        self.paragraphs: list[tuple[str, int, list[str]]] = []  # open paragraphs: (kind, level, text)
        self.lists = 0
        self.tables = _Tables(blocks, ("table", "table-row", "table-cell"))

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if name == "text" and tag.startswith("{urn:oasis:names:tc:opendocument:xmlns:office"):
            self.in_body = True
        if not self.in_body:
            return
        if self.skipping or name in self._SKIP:
            self.skipping += 1
            return
        if name in ("h", "p"):
            level = _w(attrib, "outline-level") or "1"
            self.blocks.budget.text(_OPEN_COST if self.paragraphs else 0)
            self.paragraphs.append((name, int(level) if level.isdigit() else 1, []))
        elif name == "s" and self.paragraphs:
            count = _w(attrib, "c") or "1"
            self.paragraphs[-1][2].append(" " * min(int(count) if count.isdigit() else 1, 100))
        elif name in ("tab", "line-break") and self.paragraphs:
            self.paragraphs[-1][2].append(" " if name == "tab" else "\n")
        elif name == "list-item":
            self.lists += 1
        else:
            self.tables.start(name)

    def end(self, tag: str) -> None:
        if not self.in_body:
            return
        if self.skipping:
            self.skipping -= 1
            return
        name = local_name(tag)
        if name in ("h", "p") and self.paragraphs:
            kind, level, parts = self.paragraphs.pop()
            text = "".join(parts)
            if self.paragraphs:  # a paragraph inside another (a frame's text box): its text joins the outer one
                self.paragraphs[-1][2].append(" " + text)
            elif self.tables.cells:
                self.tables.paragraph(text)
            elif kind == "h":
                self.blocks.heading(level, text)
            elif self.lists:
                self.blocks.item(text)
            else:
                self.blocks.paragraph(text)
        elif name == "list-item":
            self.lists -= 1
        elif name == "table-cell":
            self.tables.close_cell()  # a cell outside any row is left out
        elif name == "table":
            self.tables.close_table()
        elif name == "text" and tag.startswith("{urn:oasis:names:tc:opendocument:xmlns:office"):
            self.in_body = False

    def data(self, text: str) -> None:
        if self.in_body and not self.skipping and self.paragraphs:
            self.blocks.budget.text(len(text))
            self.paragraphs[-1][2].append(text)


def odt_markdown(members: ZipMembers) -> str:
    """An OpenDocument text's body as Markdown."""
    blocks = Blocks(members.budget)
    members.parse("content.xml", _OdtBody(blocks))
    return blocks.markdown()
