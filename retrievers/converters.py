"""Office files, e-books, spreadsheets, CSV and notebooks as Markdown parts, through MarkItDown.

MarkItDown (Microsoft's maintained converter, on mammoth and python-pptx) turns ``.docx``,
``.pptx``, ``.csv``, ``.epub`` and ``.ipynb`` files into Markdown that keeps headings, lists and
table rows; OpenDocument text (``.odt``, which MarkItDown does not read) goes through odfpy's
XHTML export and MarkItDown's HTML converter; Excel workbooks are read with openpyxl into
MarkItDown's layout (its own path through pandas and HTML is ten times slower). `convert` then cuts
the Markdown where a citation should point: one part per slide (``slide``), per sheet
(``sheet``) or per heading (``section``), each with a ``location`` a person reads ("slide 3",
"sheet Budget", "section Refunds").

Every file is bounded before a parser sees it: a zip-based format (all but CSV and notebooks)
may declare at most `MAX_ZIP_MEMBERS` members and expand to at most `max_unzipped_bytes`
(Python's zipfile never inflates past a member's declared size, so the central directory is a
true bound), and the converted text may not outgrow the per-file limit. Any failure is a
`ConversionError` whose message is the file's skip reason.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass, field

__all__ = [
    "CONVERTED_TYPES",
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

_HEADING = re.compile(r"^(#{1,3})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_SLIDE = re.compile(r"^<!-- Slide number: (\d+) -->$", re.MULTILINE)
_SHEET = re.compile(r"^## (.+)$", re.MULTILINE)
_EPUB_TITLE = re.compile(r"^\*\*Title:\*\* (.+)$", re.MULTILINE)


class ConversionError(Exception):
    """A file the converter cannot read; the message is its skip reason."""


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
                mimetype = archive.read("mimetype")[:100]
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


def convert(data: bytes, kind: str, *, max_text_chars: int, max_unzipped_bytes: int) -> list[Part]:
    """Convert a file of type `kind` (a value of `CONVERTED_TYPES`) into its citable parts.

    `data` is the file's content; for ``csv`` and ``ipynb`` it must be valid UTF-8 (the caller
    checks the text). Parts without text are left out; an empty list means the file had none.

    Raises:
        ConversionError: the file is malformed, hostile or too large once converted; the message says which.
    """
    if kind in _ZIPPED:
        check_zip(data, max_unzipped_bytes)
    try:
        markdown = _markdown(data, kind)
    except ConversionError:
        raise
    except RecursionError as e:
        raise ConversionError(f"not readable as {describe(kind)}: nested too deeply") from e
    except MemoryError as e:
        raise ConversionError(f"not readable as {describe(kind)}: out of memory while converting") from e
    except Exception as e:  # noqa: BLE001 - a converter's failure on one file is that file's skip reason
        raise ConversionError(f"not readable as {describe(kind)}: {type(e).__name__}: {_short(e)}") from e
    if len(markdown) > max_text_chars:
        raise ConversionError(
            f"its text is larger than the per-file limit of {mib(max_text_chars)} once converted; "
            "split the file or raise max_file_bytes"
        )
    if kind == "pptx":
        parts = _slides(markdown)
    elif kind == "xlsx":
        parts = _sheets(markdown)
    elif kind == "csv":
        parts = [Part(markdown.strip())]
    else:
        parts = _sections(markdown)
    title = _title(data, kind, markdown)
    if title:
        parts = [Part(p.text, {"title": title, **p.metadata}) for p in parts]
    return [p for p in parts if p.text.strip()]


def _markdown(data: bytes, kind: str) -> str:
    from markitdown import StreamInfo
    from markitdown.converters import (
        CsvConverter,
        DocxConverter,
        EpubConverter,
        HtmlConverter,
        IpynbConverter,
        PptxConverter,
    )

    stream = io.BytesIO(data)
    info = StreamInfo(extension=f".{kind}", charset="utf-8")
    if kind == "odt":
        return HtmlConverter().convert_string(_odt_html(data)).markdown
    if kind == "xlsx":
        return _xlsx_markdown(data)
    converter = {
        "docx": DocxConverter,
        "pptx": PptxConverter,
        "csv": CsvConverter,
        "epub": EpubConverter,
        "ipynb": IpynbConverter,
    }[kind]()
    return converter.convert(stream, info).markdown


def _xlsx_markdown(data: bytes) -> str:
    """MarkItDown's Excel layout (``## sheet`` and a Markdown table per sheet), read straight from openpyxl.

    MarkItDown goes through pandas, HTML and markdownify: 5,000 rows took 10 s (see
    docs/retrieval.md); openpyxl's read-only rows take a tenth of that. Empty rows and trailing
    empty cells are dropped; the first row left is the header.
    """
    import openpyxl

    workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        out: list[str] = []
        for sheet in workbook.worksheets:
            rows = [[_cell(v) for v in row] for row in sheet.iter_rows(values_only=True)]
            rows = [row[: max(i + 1 for i, v in enumerate(row) if v)] for row in rows if any(row)]
            if not rows:
                continue
            width = max(len(row) for row in rows)
            lines = [f"## {sheet.title}"]
            for i, row in enumerate(rows):
                lines.append("| " + " | ".join(row + [""] * (width - len(row))) + " |")
                if i == 0:
                    lines.append("|" + " --- |" * width)
            out.append("\n".join(lines))
        return "\n\n".join(out)
    finally:
        workbook.close()


def _cell(value: object) -> str:
    """A cell as table text: dates in ISO form, whole floats without ``.0``, pipes escaped, one line."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif hasattr(value, "isoformat"):
        value = value.isoformat()  # type: ignore[union-attr]
    return " ".join(str(value).split()).replace("|", "\\|")


def _odt_html(data: bytes) -> str:
    from odf.odf2xhtml import ODF2XHTML

    exporter = ODF2XHTML(generate_css=False, embedable=True)
    exporter.load(io.BytesIO(data))
    return exporter.xhtml()


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


def _title(data: bytes, kind: str, markdown: str) -> str | None:
    """The document's stated title: OOXML core properties, the EPUB's metadata, or the first heading of a notebook or ODT."""
    if kind in ("docx", "pptx", "xlsx"):
        return _core_title(data)
    if kind == "epub":
        match = _EPUB_TITLE.search(markdown)
        return " ".join(match.group(1).split()) if match else None
    if kind in ("ipynb", "odt"):
        return _first_heading(markdown)
    return None


def _core_title(data: bytes) -> str | None:
    """``dc:title`` of ``docProps/core.xml``, read with defusedxml (no entities, no external references)."""
    from defusedxml import ElementTree

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo("docProps/core.xml")
            if info.file_size > 2**20:
                return None
            root = ElementTree.fromstring(archive.read(info))
    except Exception:  # noqa: BLE001 - no or broken properties: the document has no stated title
        return None
    element = root.find("{http://purl.org/dc/elements/1.1/}title")
    title = " ".join((element.text or "").split()) if element is not None else ""
    return title or None


def _short(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def mib(n: int) -> str:
    """A size for messages: "3.2 MiB", or "512 bytes" below one MiB."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"
