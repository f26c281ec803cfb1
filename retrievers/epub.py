"""EPUB e-books as Markdown, their chapters parsed as streams.

The container names the package document (OPF); its metadata opens the Markdown as MarkItDown
wrote it (``**Title:** ...``), and its spine orders the chapters. Each chapter (XHTML, read
leniently as HTML: real books use HTML entities XML does not know) is fed block by block to
Python's incremental ``html.parser`` with a handler that keeps only the paragraph or table row
being read: headings, paragraphs, list items and table rows go to `retrievers.blocks.Blocks`.
"""

from __future__ import annotations

import codecs
import posixpath
from html.parser import HTMLParser
from urllib.parse import unquote

from retrievers.blocks import Blocks
from retrievers.bounds import Budget, ConversionError, XmlTarget, ZipMembers, local_name

__all__ = ["epub_markdown"]

_MAX_PENDING = 4 * 2**20
"""Longest construct (a tag, a comment, a script) the HTML parser may hold unfinished."""
_BLOCK = {"p", "div", "section", "article", "blockquote", "pre", "dd", "dt", "figcaption", "caption", "address", "hr"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_SKIP = {"script", "style", "head", "title", "template", "noscript", "svg", "math"}
_METADATA = ("title", "creator", "language", "publisher", "date", "description", "identifier")
_LABELS = {"creator": "Authors"}


class _Package(XmlTarget):
    """The OPF: metadata texts, manifest (id -> href) and spine (idrefs)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.metadata: dict[str, list[str]] = {}
        self.manifest: dict[str, str] = {}
        self.spine: list[str] = []
        self._field: str | None = None
        self._text: list[str] = []

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        name = local_name(tag)
        if tag.startswith("{http://purl.org/dc/elements/1.1/}") and name in _METADATA:
            self._field, self._text = name, []
        elif name == "item":
            self.budget.text(len(attrib.get("href", "")))
            self.manifest[attrib.get("id", "")] = attrib.get("href", "")
        elif name == "itemref":
            self.budget.text(len(attrib.get("idref", "")))
            self.spine.append(attrib.get("idref", ""))

    def end(self, tag: str) -> None:
        if self._field is not None and local_name(tag) == self._field:
            text = " ".join("".join(self._text).split())
            if text:
                self.metadata.setdefault(self._field, []).append(text)
            self._field = None

    def data(self, text: str) -> None:
        if self._field is not None:
            self.budget.text(len(text))
            self._text.append(text)


class _Container(XmlTarget):
    def __init__(self) -> None:
        self.rootfile: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        if local_name(tag) == "rootfile" and self.rootfile is None:
            self.rootfile = attrib.get("full-path")


class _Chapter(HTMLParser):
    """An HTML chapter into `Blocks`: headings, paragraphs, list items, tables (cells joined per row)."""

    def __init__(self, blocks: Blocks) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks = blocks
        self.text: list[str] = []
        self.heading = 0
        self.lists = 0
        self.skipping = 0
        self.rows: list[list[str]] | None = None
        self.cell: list[str] | None = None
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skipping += 1
        elif self.skipping:
            return
        elif tag in _HEADINGS or tag in _BLOCK or tag == "li":
            self._flush()
            self.heading = _HEADINGS.get(tag, 0)
            if tag == "li":
                self.lists += 1
        elif tag == "table":
            self._flush()
            self.tables += 1
            if self.tables == 1:
                self.rows = []
        elif tag == "tr" and self.rows is not None and self.tables == 1:
            self.rows.append([])
        elif tag in ("td", "th") and self.tables == 1:
            self.cell = []
        elif tag == "br" and self.cell is None:
            self.text.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif self.skipping:
            return
        elif tag in ("td", "th") and self.cell is not None:
            if self.rows:
                cell = " ".join("".join(self.cell).split())
                self.blocks.budget.text(len(cell) + 3)
                self.rows[-1].append(cell)
            self.cell = None
        elif tag == "table" and self.tables:
            self.tables -= 1
            if self.tables == 0 and self.rows is not None:
                self.blocks.table(self.rows)
                self.rows = None
        elif tag in _HEADINGS or tag in _BLOCK or tag == "li":
            self._flush()
            if tag == "li":
                self.lists = max(0, self.lists - 1)

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        self.blocks.budget.text(len(data))
        data = data.replace("\n", " ")  # a line break in HTML source is a space; <br> makes one
        (self.cell if self.cell is not None else self.text).append(data)

    def finish(self) -> None:
        self.close()
        self._flush()

    def _flush(self) -> None:
        text = "".join(self.text)
        self.text = []
        if not text.strip():
            return
        if self.heading:
            self.blocks.heading(self.heading, text)
        elif self.lists:
            self.blocks.item(text)
        else:
            self.blocks.paragraph(text)
        self.heading = 0


def epub_markdown(members: ZipMembers) -> tuple[str, str | None]:
    """The book's metadata and its chapters in spine order as Markdown, and its title."""
    container = _Container()
    members.parse("META-INF/container.xml", container)
    if not container.rootfile:
        raise ConversionError("its META-INF/container.xml names no package document")
    package = _Package(members.budget)
    members.parse(container.rootfile, package)
    blocks = Blocks(members.budget)
    lines = [f"**{_LABELS.get(k, k.capitalize())}:** {', '.join(package.metadata[k])}" for k in _METADATA if k in package.metadata]
    if lines:
        blocks.paragraph("\n".join(lines))
    base = posixpath.dirname(container.rootfile)
    for idref in package.spine:
        href = package.manifest.get(idref)
        if href is None:
            continue
        path = _member(href, base, members.names)
        if path is None:
            continue
        chapter = _Chapter(blocks)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for block in members.blocks(path):
            chapter.feed(decoder.decode(block))
            if len(chapter.rawdata) > _MAX_PENDING:
                raise ConversionError(f"{path!r} holds an HTML construct longer than {_MAX_PENDING // 2**20} MiB; not read")
        chapter.feed(decoder.decode(b"", final=True))
        chapter.finish()
    titles = package.metadata.get("title")
    return blocks.markdown(), titles[0] if titles else None


def _member(href: str, base: str, names: set[str]) -> str | None:
    """The zip member a manifest href names (percent-decoded first, as written second), inside the book."""
    for candidate in (unquote(href.split("#")[0]), href.split("#")[0]):
        path = posixpath.normpath(posixpath.join(base, candidate)) if base else posixpath.normpath(candidate)
        if path in names:
            return path
    return None
