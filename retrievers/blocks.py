"""Markdown written a block at a time, every character counted by a `Budget`.

The layout is the one MarkItDown gave these files (and that `retrievers.converters` cuts into
parts): ``#`` headings, paragraphs separated by a blank line, ``* `` list items one per line,
and tables as Markdown rows with a ``| --- |`` line after the first. A converter's parser feeds
it paragraphs and table rows as it reads them; nothing else of the document is kept.
"""

from __future__ import annotations

from retrievers.bounds import Budget

__all__ = ["Blocks", "TextBuffer"]


class TextBuffer:
    """Text appended in many small pieces, held at about one byte per ASCII character.

    A list of small strings costs some 60 bytes a piece, and ``io.StringIO`` four bytes a
    character; pieces are joined every `JOIN` appends instead, so the final text costs its own
    size once more, when `value` joins the chunks.
    """

    JOIN = 1024

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._pending: list[str] = []

    def write(self, text: str) -> None:
        self._pending.append(text)
        if len(self._pending) >= self.JOIN:
            self._chunks.append("".join(self._pending))
            self._pending = []

    def value(self) -> str:
        return "".join(self._chunks) + "".join(self._pending)


def _table_cell(text: str) -> str:
    """A cell's text on one line with its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


class Blocks:
    """Headings, paragraphs, list items and tables, joined into Markdown by `markdown`."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._out = TextBuffer()
        self._kind = ""  # of the last piece written: list items and table rows join their kind with one newline

    def heading(self, level: int, text: str) -> None:
        text = " ".join(text.split())
        if text:
            self._add("#" * max(1, min(level, 6)) + " " + text, "block")

    def paragraph(self, text: str) -> None:
        text = "\n".join(" ".join(line.split()) for line in text.split("\n")).strip()
        if text:
            self._add(text, "block")

    def item(self, text: str, marker: str = "*") -> None:
        """A list item: ``* text``, or with a number as `marker` (``1.``)."""
        text = " ".join(text.split())
        if text:
            self._add(f"{marker} {text}", "list" if marker == "*" else "numbered")

    def table(self, rows: list[list[str]], heading: str | None = None) -> None:
        """A table: rows of cell texts (padded to the widest), the first as its header; empty rows left out.

        A `heading` (a sheet's name) goes right above it as ``## heading``, without a blank line.
        """
        rows = [row for row in rows if any(cell.strip() for cell in row)]
        if not rows:
            return
        width = max(len(row) for row in rows)
        self._kind = "block"
        if heading is not None:
            self._add("## " + " ".join(heading.split()), "block")
            self._kind = "row"
        for i, row in enumerate(rows):
            cells = [_table_cell(cell) for cell in row] + [""] * (width - len(row))
            self._add("| " + " | ".join(cells) + " |", "row")
            if i == 0:
                self._add("| " + " | ".join(["---"] * width) + " |", "row")

    def markdown(self) -> str:
        return self._out.value().strip()

    def _add(self, text: str, kind: str) -> None:
        sep = "\n" if kind == self._kind and kind in ("list", "numbered", "row") else "\n\n"
        self.budget.text(len(text) + len(sep))
        self._out.write(sep)
        self._out.write(text)
        self._kind = kind
