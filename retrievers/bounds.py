"""The limits a converter works within, and the bounded readers it reads a file through.

Every converter of `retrievers.converters` reads its file through a `Budget`: the text it
extracts counts against ``max_text_chars`` (over it, the file is refused), the bytes it inflates
from a zip count against ``max_unzipped_bytes``, and ``time_limit_s`` is checked after every block
read and every row or element written. Zip members are read as streams (`ZipMembers`), a block of
`BLOCK_BYTES` at a time: Python's ``ZipFile.read`` inflates a member whole before it cuts it to
the size its header declares, so a member that under-declares its size would inflate far past
any check made on the declared sizes; a stream inflates at most one block per read, and the
budget counts the bytes actually inflated. XML members are parsed incrementally by defusedxml's
parser (no entity declarations, no external references) into a `XmlTarget`, which builds no
tree: memory grows with the text extracted, not with the size of the XML.
"""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator

__all__ = ["BLOCK_BYTES", "Budget", "ConversionError", "XmlTarget", "ZipMembers", "local_name", "mib"]

BLOCK_BYTES = 2**16
"""Bytes inflated from a zip member (or fed to a parser) at a time."""

_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # bzip2 and LZMA members inflate a whole read at once


class ConversionError(Exception):
    """A file the converter cannot read; the message is its skip reason."""


def mib(n: int) -> str:
    """A size for messages: "3.2 MiB", or "512 bytes" below one MiB."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


class Budget:
    """Characters of text, bytes inflated and seconds left for converting one file."""

    def __init__(self, *, max_text_chars: int, max_unzipped_bytes: int, time_limit_s: float) -> None:
        if time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be positive, got {time_limit_s!r}")
        self.max_text_chars = max_text_chars
        self.max_unzipped_bytes = max_unzipped_bytes
        self.time_limit_s = time_limit_s
        self.chars = 0
        self.inflated = 0
        self._deadline = time.monotonic() + time_limit_s

    def text(self, n: int) -> None:
        """Count `n` characters of extracted text (raises `ConversionError` past the limit, or past the time)."""
        self.chars += n
        self._check(self.chars, self.max_text_chars, "its text is larger than the per-file limit of {} once converted; "
                    "split the file or raise max_file_bytes")

    def inflate(self, n: int) -> None:
        """Count `n` bytes inflated from a zip member."""
        self.inflated += n
        self._check(self.inflated, self.max_unzipped_bytes, "it inflated past the limit of {} (a zip member larger than it "
                    "declares: a decompression bomb); not read")

    def _check(self, count: int, limit: int, message: str) -> None:
        """Raise `ConversionError` saying ``message`` (its ``{}`` the limit in MiB) once ``count`` is past ``limit``;
        then check the time."""
        if count > limit:
            raise ConversionError(message.format(mib(limit)))
        self.tick()

    def tick(self) -> None:
        """Raise `ConversionError` once the file's time is up."""
        if time.monotonic() > self._deadline:
            raise ConversionError(
                f"converting it took longer than the per-file limit of {self.time_limit_s:g} s; split the file"
            )


class ZipMembers:
    """The members of a zip-based file, read as capped streams."""

    def __init__(self, data: bytes, budget: Budget) -> None:
        self.archive = zipfile.ZipFile(io.BytesIO(data))
        self.names = set(self.archive.namelist())
        self.budget = budget

    def blocks(self, name: str) -> Iterator[bytes]:
        """The member's bytes, a block at a time, each counted by the budget; `ConversionError` if it is missing."""
        if name not in self.names:
            raise ConversionError(f"its zip container has no {name!r}")
        info = self.archive.getinfo(name)
        if info.compress_type not in _METHODS:
            raise ConversionError(f"{name!r} is compressed with method {info.compress_type}; only stored and deflated members are read")
        with self.archive.open(info) as stream:
            while block := stream.read(BLOCK_BYTES):
                self.budget.inflate(len(block))
                yield block

    def read(self, name: str, limit: int) -> bytes:
        """A small member whole (a relationship list, a manifest): `ConversionError` if it inflates past `limit`."""
        out = bytearray()
        for block in self.blocks(name):
            out += block
            if len(out) > limit:
                raise ConversionError(f"{name!r} is larger than {mib(limit)}; not read")
        return bytes(out)

    def parse(self, name: str, target: XmlTarget) -> None:
        """Feed the member, a block at a time, to defusedxml's incremental parser with `target` receiving the events."""
        from defusedxml.ElementTree import DefusedXMLParser

        parser = DefusedXMLParser(target=target)  # entity declarations and external references raise
        for block in self.blocks(name):
            parser.feed(block)
        parser.close()


class XmlTarget:
    """What `ZipMembers.parse` calls with a member's events (ElementTree's target protocol); each does nothing here."""

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        """An element opens: ``{namespace}name`` and its attributes."""

    def end(self, tag: str) -> None:
        """An element closes."""

    def data(self, text: str) -> None:
        """Character data inside the element open now."""

    def close(self) -> None:
        """The member is parsed to its end."""


def local_name(tag: str) -> str:
    """``{namespace}name`` as ``name``."""
    return tag.rpartition("}")[2]
