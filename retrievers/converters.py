"""Office files, e-books, spreadsheets, CSV and notebooks as Markdown parts, read within limits.

Word (``.docx``), PowerPoint (``.pptx``), Excel (``.xlsx``), OpenDocument text (``.odt``) and
EPUB files are parsed as streams by `retrievers.office` and `retrievers.epub`; CSV tables are
read row by row and notebooks as JSON. The Markdown keeps the layout MarkItDown gave these files
(headings, list items, table rows, ``<!-- Slide number: N -->``), and `convert` then cuts it where
a citation should point: one part per slide (``slide``), per sheet (``sheet``) or per heading
(``section``), each with a ``location`` a person reads ("slide 3", "sheet Budget", "section Refunds").

Every file is converted within a `retrievers.bounds.Budget`: at most ``max_text_chars``
characters of Markdown (a longer result refuses the file: a truncated document would be cited as
if whole), at most ``max_unzipped_bytes`` bytes actually inflated from its zip members (read as
streams, so a member that under-declares its size is cut where it ends its declaration, and the
declared total is checked first), and at most ``time_limit_s`` seconds (`DEFAULT_TIME_LIMIT_S`).
Memory follows the text extracted, not the size of the XML or the CSV. A zip may declare at
most `MAX_ZIP_MEMBERS` members. Any failure is a `ConversionError` whose message is the file's
skip reason.
"""

from __future__ import annotations

import csv
import io
import json
import re
import zipfile
from dataclasses import dataclass, field

from retrievers.blocks import TextBuffer
from retrievers.bounds import Budget, ConversionError, ZipMembers, mib

__all__ = [
    "CONVERTED_TYPES",
    "DEFAULT_TIME_LIMIT_S",
    "MAX_JSON_VALUES",
    "MAX_ZIP_MEMBERS",
    "ConversionError",
    "Part",
    "check_zip",
    "convert",
    "describe",
    "mib",
    "zip_kind",
]

#: Suffix -> ``file_type`` of the formats this module converts.
CONVERTED_TYPES: dict[str, str] = {
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".csv": "csv",
    ".epub": "epub",
    ".odt": "odt",
    ".ipynb": "ipynb",
}

_DESCRIPTIONS = {
    "docx": "a Word document (.docx)",
    "pptx": "a PowerPoint presentation (.pptx)",
    "xlsx": "an Excel workbook (.xlsx)",
    "csv": "a CSV table",
    "epub": "an EPUB e-book",
    "odt": "an OpenDocument text (.odt)",
    "ipynb": "a Jupyter notebook",
}
_ZIPPED = ("docx", "pptx", "xlsx", "epub", "odt")

#: Most members a zip-based document may declare (a large workbook or e-book has a few thousand).
MAX_ZIP_MEMBERS = 10_000

#: Seconds a file's conversion may take (a 100 MiB workbook converts in well under a minute here).
DEFAULT_TIME_LIMIT_S = 120.0

#: Most values (objects, arrays, numbers, strings...) a notebook's JSON may hold: parsed whole, each
#: costs tens of bytes; a notebook of text and code has a few thousand.
MAX_JSON_VALUES = 2_000_000

_HEADING = re.compile(r"^(#{1,3})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_SLIDE = re.compile(r"^<!-- Slide number: (\d+) -->$", re.MULTILINE)
_SHEET = re.compile(r"^## (.+)$", re.MULTILINE)
_PIPE = re.compile(r"(?<!\\)(\\*)\|")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_TICK_ROWS = 1024


@dataclass(frozen=True)
class Part:
    """One citable piece of a converted file: its Markdown and the metadata that says where it is."""

    text: str
    metadata: dict[str, object] = field(default_factory=dict)


def zip_kind(data: bytes) -> str | None:
    """Which zip-based format `data` holds (``docx``, ``pptx``, ``xlsx``, ``epub``, ``odt``), by its members; None if none of them."""
    if not data.startswith(b"PK\x03\x04"):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            if "mimetype" in names:
                with archive.open("mimetype") as stream:
                    mimetype = stream.read(100)  # a stream: a lying member is not inflated past 100 bytes
                if mimetype == b"application/epub+zip":
                    return "epub"
                if mimetype == b"application/vnd.oasis.opendocument.text":
                    return "odt"
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError, NotImplementedError):
        return None
    for member, kind in (("word/document.xml", "docx"), ("ppt/presentation.xml", "pptx"), ("xl/workbook.xml", "xlsx")):
        if member in names:
            return kind
    return None


def describe(kind: str) -> str:
    """``kind`` in words, for messages: "a Word document (.docx)"."""
    return _DESCRIPTIONS[kind]


def check_zip(data: bytes, max_unzipped_bytes: int, max_members: int = MAX_ZIP_MEMBERS) -> None:
    """Refuse a zip that is not one, declares too many members, or expands past `max_unzipped_bytes`.

    Raises:
        ConversionError: with the reason.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ConversionError(f"not a valid zip container ({type(e).__name__}: {e}): the file is truncated or not of this type") from e
    if len(members) > max_members:
        raise ConversionError(f"its zip container declares {len(members)} members, over the limit of {max_members}; not read")
    total = sum(m.file_size for m in members)
    if total > max_unzipped_bytes:
        raise ConversionError(
            f"it would expand to {mib(total)}, over the limit of {mib(max_unzipped_bytes)} "
            "(a decompression bomb, or a document to split); not read"
        )


def convert(
    data: bytes, kind: str, *, max_text_chars: int, max_unzipped_bytes: int, time_limit_s: float = DEFAULT_TIME_LIMIT_S
) -> list[Part]:
    """Convert a file of type `kind` (a value of `CONVERTED_TYPES`) into its citable parts.

    `data` is the file's content; for ``csv`` and ``ipynb`` it must be valid UTF-8 (the caller
    checks the text). Parts without text are left out; an empty list means the file had none.

    Raises:
        ConversionError: the file is malformed, hostile, too large once converted, or took longer
            than `time_limit_s`; the message says which.
    """
    budget = Budget(max_text_chars=max_text_chars, max_unzipped_bytes=max_unzipped_bytes, time_limit_s=time_limit_s)
    if kind in _ZIPPED:
        check_zip(data, max_unzipped_bytes)
    try:
        markdown, title = _markdown(data, kind, budget)
    except ConversionError:
        raise
    except RecursionError as e:
        raise ConversionError(f"not readable as {describe(kind)}: nested too deeply") from e
    except MemoryError as e:
        raise ConversionError(f"not readable as {describe(kind)}: out of memory while converting") from e
    except Exception as e:  # noqa: BLE001 - a converter's failure on one file is that file's skip reason
        raise ConversionError(f"not readable as {describe(kind)}: {type(e).__name__}: {_short(e)}") from e
    if kind == "pptx":
        parts = _slides(markdown)
    elif kind == "xlsx":
        parts = _sheets(markdown)
    elif kind == "csv":
        parts = [Part(markdown.strip())]
    else:
        parts = _sections(markdown)
    if title:
        parts = [Part(p.text, {"title": title, **p.metadata}) for p in parts]
    return [p for p in parts if p.text.strip()]


def _markdown(data: bytes, kind: str, budget: Budget) -> tuple[str, str | None]:
    """The file as Markdown, and its stated title (OOXML core properties, the EPUB's metadata, or the first heading)."""
    from retrievers.epub import epub_markdown
    from retrievers.office import docx_markdown, odt_markdown, pptx_markdown, xlsx_markdown

    if kind == "csv":
        return _csv_markdown(data.decode("utf-8"), budget), None
    if kind == "ipynb":
        markdown = _ipynb_markdown(data.decode("utf-8"), budget)
        return markdown, _first_heading(markdown)
    members = ZipMembers(data, budget)
    if kind == "epub":
        return epub_markdown(members)
    if kind == "odt":
        markdown = odt_markdown(members)
        return markdown, _first_heading(markdown)
    office = {"docx": docx_markdown, "pptx": pptx_markdown, "xlsx": xlsx_markdown}[kind]
    return office(members), _core_title(members)


def _csv_markdown(text: str, budget: Budget) -> str:
    """MarkItDown's CSV table, read row by row in two passes (the first finds the width and the blank rows
    to trim: those before the header, right after it and at the end), holding only the Markdown written."""
    text = text.lstrip("\ufeff")
    header = start = end = -1
    width = 0
    for i, row in enumerate(csv.reader(io.StringIO(text, newline=""))):
        if i % _TICK_ROWS == 0:
            budget.tick()
        if not row:
            continue
        if header < 0:
            header = i
        elif start < 0:
            start = i
        end = i + 1
        width = max(width, len(row))
    if header < 0:
        return ""
    out = TextBuffer()
    for i, row in enumerate(csv.reader(io.StringIO(text, newline=""))):
        if i != header and not 0 <= start <= i < end:
            continue
        line = "| " + " | ".join([_csv_cell(c) for c in row] + [""] * (width - len(row))) + " |"
        if i == header:
            line += "\n| " + " | ".join(["---"] * width) + " |"
        budget.text(len(line) + 1)
        out.write(line if i == header else "\n" + line)
    return out.value()


def _csv_cell(value: str) -> str:
    """A CSV value in a Markdown cell: pipes escaped (a backslash before one doubled), line breaks as spaces."""
    if "|" in value:
        value = _PIPE.sub(lambda m: m.group(1) * 2 + "\\|", value)
    if "\n" in value or "\r" in value:
        value = value.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return value


def _ipynb_markdown(text: str, budget: Budget) -> str:
    """MarkItDown's notebook layout: Markdown cells as they are, code cells fenced as Python, raw cells fenced.

    The JSON is parsed whole, so first its values are counted (strings blanked out, then the
    commas and brackets that separate them): more than `MAX_JSON_VALUES` refuses the file.
    """
    structure = _JSON_STRING.sub("", text)
    values = structure.count(",") + structure.count("[") + structure.count("{")
    del structure
    if values > MAX_JSON_VALUES:
        raise ConversionError(
            f"its JSON holds about {values:,} values, over the limit of {MAX_JSON_VALUES:,} (large outputs?); "
            "clear its outputs (`jupyter nbconvert --clear-output`) to index it"
        )
    budget.tick()
    notebook = json.loads(text.lstrip("\ufeff"))
    out: list[str] = []
    for cell in notebook.get("cells", []):
        source = cell.get("source", [])
        source = "".join(source) if isinstance(source, list) else str(source)
        kind = cell.get("cell_type", "")
        piece = source if kind == "markdown" else f"```python\n{source}\n```" if kind == "code" else f"```\n{source}\n```" if kind == "raw" else None
        if piece is not None:
            budget.text(len(piece) + 2)
            out.append(piece)
    return "\n\n".join(out)


def _slides(markdown: str) -> list[Part]:
    """One part per ``<!-- Slide number: N -->`` block of MarkItDown's PowerPoint output."""
    marks = list(_SLIDE.finditer(markdown))
    parts: list[Part] = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(markdown)
        text = markdown[mark.end() : end].strip()
        number = int(mark.group(1))
        heading = _first_heading(text)
        location = f"slide {number}" + (f" ({heading})" if heading else "")
        parts.append(Part(text, {"slide": number, "location": location}))
    return parts


def _sheets(markdown: str) -> list[Part]:
    """One part per ``## name`` sheet of MarkItDown's Excel output (table rows start with ``|``)."""
    marks = list(_SHEET.finditer(markdown))
    parts: list[Part] = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(markdown)
        name = mark.group(1).strip()
        parts.append(Part(markdown[mark.start() : end].strip(), {"sheet": name, "location": f"sheet {name}"}))
    return parts


def _sections(markdown: str) -> list[Part]:
    """Cut Markdown before each heading of level 1-3 (not inside a fenced code block); text before the first is its own part."""
    parts: list[Part] = []
    lines: list[str] = []
    heading: str | None = None
    fenced = False

    def flush() -> None:
        text = "\n".join(lines).strip()
        if text:
            parts.append(Part(text, {"section": heading, "location": f"section {heading}"} if heading else {}))

    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is not None:
            flush()
            lines = []
            heading = _plain(match.group(2))
        lines.append(line)
    flush()
    return parts


def _first_heading(text: str) -> str | None:
    for line in text.split("\n"):
        match = _HEADING.match(line)
        if match:
            return _plain(match.group(2))
    return None


def _plain(heading: str) -> str:
    """A Markdown heading as words: emphasis and link targets dropped."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return " ".join(heading.replace("*", "").replace("_", " ").split())


def _core_title(members: ZipMembers) -> str | None:
    """``dc:title`` of ``docProps/core.xml`` (at most 1 MiB), read with defusedxml (no entities, no external references)."""
    from defusedxml import ElementTree

    try:
        root = ElementTree.fromstring(members.read("docProps/core.xml", 2**20))
    except Exception:  # noqa: BLE001 - no or broken properties: the document has no stated title
        return None
    element = root.find("{http://purl.org/dc/elements/1.1/}title")
    title = " ".join((element.text or "").split()) if element is not None else ""
    return title or None


def _short(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
