"""Load text, Markdown, HTML, PDF, Office, e-book, spreadsheet and notebook files (or whole directories) into Documents.

A file that cannot be ingested (missing, unreadable, not a regular file, over the size
limit, binary, empty, not UTF-8, a corrupt or encrypted PDF) is skipped with a
`SkippedFileWarning` that names it and says why; every other file is still loaded, and the
caller gets the skipped files back in `LoadResult`.

Only regular files are read (after following symbolic links): a named pipe, a device such
as ``/dev/zero`` or a socket is skipped without being opened for reading, and a file larger
than ``max_file_bytes`` (default `DEFAULT_MAX_FILE_BYTES`, 100 MiB) is skipped without being
read. A directory walk follows symbolic links to folders, once per real folder, so a link
loop ends. Warnings and log records that a parsing library (pypdf, BeautifulSoup) emits
while one file loads are captured and attached to that file: to its skip reason, or to
`LoadResult.notes` (and the ``retrievers.loaders`` logger, with the file's name) when it loads.

For ingesting large folders without holding whole files in memory, `find_files` lists what
a walk would load, `file_digest` hashes a file in blocks, and `iter_text` yields a text or
Markdown file's decoded text block by block; each applies the same checks and raises
`FileSkippedError` with the reason `load_file` would give.

Metadata of each Document: ``source`` (the path as found, a string), ``file_type``
(``txt``, ``md``, ``html``, ``pdf`` or one of `retrievers.converters.CONVERTED_TYPES`),
``title`` where the file states one, and for PDFs ``page`` (1-based, one Document per page
with text), ``total_pages`` and ``ocr`` (True) on a page read by OCR: a page without a text
layer is OCR'd when the OCR extra (`retrievers.ocr`) is installed, else left out with a note. Word, PowerPoint, Excel, CSV, EPUB, OpenDocument text and
notebook files are converted to Markdown by `retrievers.converters` (streamed, bounded): one
Document per slide (``slide``), sheet (``sheet``) or heading (``section``), each with a
``location`` ("slide 3", "sheet Budget") that citations show. Their conversion is bounded in
text (the per-file limit), bytes inflated (`DEFAULT_MAX_UNZIPPED_BYTES`, counted as they are
inflated, `retrievers.converters.MAX_ZIP_MEMBERS`) and time (`retrievers.converters.DEFAULT_TIME_LIMIT_S`).
"""

from __future__ import annotations

import codecs
import hashlib
import io
import logging
import os
import re
import stat
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from langchain_core.documents import Document

from retrievers.converters import CONVERTED_TYPES, ConversionError, convert, describe, zip_kind
from retrievers.converters import mib as _mib
from retrievers import ocr
from retrievers.errors import FileSkippedError
from retrievers.extras import MissingExtraError, needs, require

__all__ = [
    "DEFAULT_INCLUDE",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_UNZIPPED_BYTES",
    "IMAGE_SUFFIXES",
    "FileNote",
    "LoadResult",
    "ScannedPageWarning",
    "SkippedFile",
    "SkippedFileWarning",
    "file_digest",
    "file_type",
    "find_files",
    "iter_text",
    "load_documents",
    "load_file",
    "markdown_title",
]

PathLike = str | os.PathLike[str]

_BAD_NAME = "its name is not valid UTF-8; rename the file"

#: Files a directory walk picks up when no `include` globs are given.
DEFAULT_INCLUDE: tuple[str, ...] = (
    "*.txt", "*.md", "*.markdown", "*.html", "*.htm", "*.pdf", *(f"*{suffix}" for suffix in CONVERTED_TYPES)
)

#: Largest file `load_documents` reads by default (100 MiB): room for 20 MB text files and
#: large PDFs, small enough that no single file can exhaust memory. Larger ones are skipped.
DEFAULT_MAX_FILE_BYTES = 100 * 2**20

#: Most a zip-based document (.docx, .pptx, .xlsx, .epub, .odt) may expand to: twenty times the
#: per-file limit. Office XML compresses about 5-20 times; a decompression bomb, a thousand times.
UNZIPPED_PER_FILE_BYTE = 20
DEFAULT_MAX_UNZIPPED_BYTES = UNZIPPED_PER_FILE_BYTE * DEFAULT_MAX_FILE_BYTES

#: Images of text, read by OCR when it is installed (`retrievers.ocr`); a walk takes them only when
#: `include` names them (a folder's photos and icons would each cost an OCR run).
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".tif", ".tiff")

_BINARY_SNIFF_BYTES = 8192
# Control bytes that do not occur in text (everything below 0x20 but \t \n \v \f \r and
# ESC, plus DEL). Random bytes have ~11% of them; text in any single-byte encoding ~0%.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_BINARY_CONTROL_RATIO = 0.03
_LIBRARY_LOGGERS = ("pypdf", "bs4")
_logger = logging.getLogger(__name__)


class SupportsUpdate(Protocol):
    """Takes the bytes a reader reads: a `hashlib` hash, or anything else with ``update(bytes)``."""

    def update(self, data: bytes, /) -> None: ...


class SkippedFileWarning(UserWarning):
    """Emitted once per file that `load_documents` skips."""


class ScannedPageWarning(UserWarning):
    """A PDF page without a text layer that OCR did not read (not installed, or it failed); a note on its file."""


@dataclass(frozen=True)
class SkippedFile:
    """A file that was not ingested, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class FileNote:
    """A warning a library gave while loading a file that was still loaded."""

    path: str
    message: str


@dataclass
class LoadResult:
    """Documents loaded from the good files, the files that were skipped, and notes on loaded ones."""

    documents: list[Document] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    notes: list[FileNote] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.documents.extend(other.documents)
        self.skipped.extend(other.skipped)
        self.notes.extend(other.notes)


class _Skip(Exception):
    """Internal: raised by a per-format loader to skip the current file."""


def load_documents(
    paths: PathLike | Sequence[PathLike],
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> LoadResult:
    """Load files and directories (recursively) into Documents.

    Args:
        paths: A file or directory, or a sequence of them. Files named explicitly are
            always loaded (a ``.pdf``/``.html``/``.md`` by its format, anything else as
            UTF-8 text); `include`/`exclude` only filter what a directory walk finds.
        include: Glob patterns a file found in a directory must match (default
            `DEFAULT_INCLUDE`). A pattern without ``/`` matches the file name; one with
            ``/`` matches the path relative to the directory, where ``**`` spans folders.
            Patterns ignore case (``*.md`` takes ``README.MD``). A walk leaves out hidden
            files and folders (names starting with ``.``: ``.git``, ``.venv``) and reports
            files whose names are not valid UTF-8 as skipped.
        exclude: Glob patterns (same syntax) of files or folders to leave out.
        max_file_bytes: Files larger than this are skipped unread, with a reason.

    Returns:
        `LoadResult` with the documents in path order, the skipped files (and folders a
        walk did not enter), and notes on files loaded despite a library warning.
    """
    _check_max_file_bytes(max_file_bytes)
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    include_patterns = tuple(include) if include is not None else DEFAULT_INCLUDE
    exclude_patterns = tuple(exclude or ())
    result = LoadResult()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files, unwalked = _walk(path, include_patterns, exclude_patterns)
            for file in files:
                result.extend(load_file(file, max_file_bytes=max_file_bytes))
            for skipped in unwalked:
                warnings.warn(f"skipped {skipped.path}: {skipped.reason}", SkippedFileWarning, stacklevel=2)
            result.skipped.extend(unwalked)
        else:
            result.extend(load_file(path, max_file_bytes=max_file_bytes))
    return result


def load_file(
    path: PathLike, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, warn: bool = True, digest: SupportsUpdate | None = None
) -> LoadResult:
    """Load one file; a problem with it becomes a `SkippedFile` (and a warning unless `warn` is False), never an exception.

    `digest`, if given, is updated with exactly the bytes that were parsed (the file is read once),
    so a caller that records a hash records the content it loaded, even if the file changed since
    it was last hashed.
    """
    _check_max_file_bytes(max_file_bytes)
    path = Path(path)
    skip: _Skip | None = None
    with _library_output() as messages:
        try:
            if _undecodable(str(path)):
                raise _Skip(_BAD_NAME)
            documents = _load(path, max_file_bytes, digest)
        except _Skip as e:
            skip = e
        except MissingExtraError as e:  # the file's type needs an extra: the reason says which to install
            skip = _Skip(str(e))
        except Exception as e:  # noqa: BLE001 - whatever a parser raises on a file's content is that file's skip
            _logger.debug("reading %s failed", path, exc_info=True)
            skip = _Skip(f"could not be read: {_failure(e)}")
    if skip is not None:
        reason = str(skip) + (f" [{'; '.join(messages)}]" if messages else "")
        if warn:
            warnings.warn(f"skipped {_shown(path)}: {reason}", SkippedFileWarning, stacklevel=3)
        return LoadResult(skipped=[SkippedFile(_shown(path), reason)])
    for message in messages:
        _logger.warning("%s: %s", path, message)
    return LoadResult(documents=documents, notes=[FileNote(str(path), m) for m in messages])


def find_files(
    paths: PathLike | Sequence[PathLike], include: Sequence[str] | None = None, exclude: Sequence[str] | None = None
) -> tuple[list[Path], list[SkippedFile]]:
    """The files `load_documents` would load, in its order, and the folders its walk would not enter.

    Nothing is opened: a path named explicitly is listed even when it does not exist (reading
    it then gives the reason). Same `include`/`exclude` rules as `load_documents`.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    include_patterns = tuple(include) if include is not None else DEFAULT_INCLUDE
    exclude_patterns = tuple(exclude or ())
    files: list[Path] = []
    skipped: list[SkippedFile] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found, unwalked = _walk(path, include_patterns, exclude_patterns)
            files.extend(found)
            skipped.extend(unwalked)
        else:
            files.append(path)
    return files, skipped


def file_type(path: PathLike) -> str:
    """``pdf``, ``html``, ``md``, a converted type (``docx``, ``pptx``...), ``image`` or ``txt``: how `load_file` reads `path` (by its suffix; anything else is text)."""
    suffix = Path(path).suffix.lower()
    if suffix in CONVERTED_TYPES:
        return CONVERTED_TYPES[suffix]
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix == ".pdf":
        return "pdf"
    if suffix in (".html", ".htm"):
        return "html"
    return "md" if suffix in (".md", ".markdown") else "txt"


def file_digest(path: PathLike, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, block_bytes: int = 2**20) -> tuple[str, int]:
    """SHA-256 (hex) and size in bytes of a regular file, read in blocks of `block_bytes`.

    Raises:
        FileSkippedError: the file cannot be read, is not a regular file or is larger than
            `max_file_bytes`, with the reason `load_file` would give.
    """
    _check_max_file_bytes(max_file_bytes)
    path = Path(path)
    digest = hashlib.sha256()
    size = 0
    try:
        with _checked_open(path, max_file_bytes) as f:
            while block := f.read(block_bytes):
                size += len(block)
                if size > max_file_bytes:
                    raise _Skip(_too_large(size, max_file_bytes, grew=True))
                digest.update(block)
    except _Skip as e:
        raise FileSkippedError(str(path), str(e)) from e
    return digest.hexdigest(), size


def iter_text(
    path: PathLike,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    block_bytes: int = 2**20,
    digest: SupportsUpdate | None = None,
) -> Iterator[str]:
    """The text of a text or Markdown file as `load_file` reads it, in blocks, without holding the file.

    The blocks joined are exactly the ``page_content`` `load_file` would give (UTF-8, a BOM
    dropped, CRLF and CR made LF). About `block_bytes` bytes are read at a time; `digest`, if
    given, is updated with every byte read (so the caller hashes what it chunked).

    Raises:
        FileSkippedError: with `load_file`'s reason (unreadable, too large, binary, not UTF-8,
            empty). Some problems (invalid UTF-8 further in, a file that is only whitespace)
            show only after earlier blocks were yielded: use the blocks only once the
            iterator is exhausted without an error.
    """
    _check_max_file_bytes(max_file_bytes)
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, got {block_bytes!r}")
    path = Path(path)
    try:
        yield from _iter_text(path, max_file_bytes, block_bytes, digest)
    except _Skip as e:
        raise FileSkippedError(str(path), str(e)) from e


def _iter_text(path: Path, max_file_bytes: int, block_bytes: int, digest: SupportsUpdate | None) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")
    head = b""  # the first _BINARY_SNIFF_BYTES bytes, for the binary checks
    size = 0
    has_text_bytes = has_text = False
    held_cr = False  # a block that ends in CR may be the first half of a CRLF
    with _checked_open(path, max_file_bytes) as f:
        while True:
            block = f.read(block_bytes)
            last = not block
            size += len(block)
            if size > max_file_bytes:
                raise _Skip(_too_large(size, max_file_bytes, grew=True))
            if digest is not None:
                digest.update(block)
            if len(head) < _BINARY_SNIFF_BYTES:
                head += block[: _BINARY_SNIFF_BYTES - len(head)]
            has_text_bytes = has_text_bytes or bool(block.strip())
            if last and not has_text_bytes:
                raise _Skip("empty file")
            if b"\x00" in head:
                raise _Skip("binary file, not text (contains NUL bytes); only text, Markdown, HTML, PDF, Office, EPUB, CSV and notebook files are read")
            buffered = len(decoder.getstate()[0])
            try:
                text = decoder.decode(block, final=last)
            except UnicodeDecodeError as e:
                if _looks_binary(head):
                    raise _Skip("binary file, not text (many control bytes); only text, Markdown, HTML, PDF, Office, EPUB, CSV and notebook files are read") from e
                bom = 3 if head.startswith(codecs.BOM_UTF8) else 0
                at = max(0, size - len(block) - buffered - bom) + e.start + bom
                raise _Skip(
                    f"not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {at}); "
                    "convert it, e.g. `iconv -f latin1 -t utf-8`"
                ) from e
            if held_cr:
                text = "\r" + text
            held_cr = text.endswith("\r") and not last
            if held_cr:
                text = text[:-1]
            text = text.replace("\r\n", "\n").replace("\r", "\n")
            has_text = has_text or bool(text.strip())
            if last:
                if not has_text:
                    raise _Skip("empty file (only whitespace)")
                if text:
                    yield text
                return
            if text:
                yield text


def markdown_title(blocks: Iterable[str]) -> str | None:
    """The title `load_file` gives a Markdown file (its first ``# `` heading), from its text in blocks.

    Reads only as far as the first heading; keeps at most the last 64 KiB of text between blocks.
    """
    buffer = ""
    for block in blocks:
        buffer += block
        match = _MD_HEADING.search(buffer)
        if match is not None and match.end() < len(buffer):  # more text follows: the match is final
            return match.group(1).strip()
        if match is None and len(buffer) > 2**16:
            cut = buffer.rfind("\n", 0, len(buffer) - 2**16)
            buffer = buffer[cut + 1 :] if cut >= 0 else buffer
    match = _MD_HEADING.search(buffer)
    return match.group(1).strip() if match else None


@contextmanager
def _checked_open(path: Path, max_file_bytes: int) -> Iterator[BinaryIO]:
    """Open a regular file of at most `max_file_bytes`; every OS-level failure, also while reading, becomes a skip reason.

    The type and size are checked by `stat` before opening (a FIFO is never opened, so it
    cannot block; a device is never read) and again on the open descriptor (the path may
    have been replaced in between).
    """
    if path.is_symlink() and not path.exists():
        raise _Skip("unreadable: broken symbolic link")
    try:
        info = os.stat(path)
        _check_regular(info.st_mode, max_file_bytes, info.st_size)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            _check_regular(info.st_mode, max_file_bytes, info.st_size)
            yield f
    except FileNotFoundError as e:
        raise _Skip("not found") from e
    except IsADirectoryError as e:
        raise _Skip("is a directory; pass it on its own to load it recursively") from e
    except PermissionError as e:
        raise _Skip("unreadable: permission denied; check the file's permissions") from e
    except OSError as e:
        raise _Skip(f"unreadable: {e.strerror or e}") from e


def _check_max_file_bytes(max_file_bytes: int) -> None:
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1:
        raise ValueError(f"max_file_bytes must be a positive number of bytes, got {max_file_bytes!r}")


# --- library warnings, per file ---------------------------------------------------------------

_CAPTURE_LOCK = threading.Lock()


class _ListHandler(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name.split('.')[0]}: {record.getMessage()}")


@contextmanager
def _library_output() -> Iterator[list[str]]:
    """Collect the warnings and WARNING+ log records of parsing libraries while one file loads.

    They would otherwise go to stderr without the file's name. `warnings.catch_warnings`
    and logger settings are process-wide, so loads that capture run one at a time (the
    parsing holds the GIL anyway).
    """
    messages: list[str] = []
    handler = _ListHandler(messages)
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
    with _CAPTURE_LOCK:
        saved = [logger.propagate for logger in loggers]
        for logger in loggers:
            logger.addHandler(handler)
            logger.propagate = False
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield messages
        finally:
            for logger, propagate in zip(loggers, saved):
                logger.removeHandler(handler)
                logger.propagate = propagate
        for w in caught:
            messages.append(f"{w.category.__name__}: {w.message}")


# --- directory walk ---------------------------------------------------------------------


def _walk(root: Path, include: Sequence[str], exclude: Sequence[str]) -> tuple[list[Path], list[SkippedFile]]:
    """Files under `root` to load, and folders not entered (with why).

    Symbolic links to folders are followed, each real folder once: a link to a folder
    already walked (a loop back to an ancestor, or a second way in) is reported instead.
    """
    include_re = [_glob_to_regex(p) for p in include]
    exclude_re = [_glob_to_regex(p) for p in exclude]
    found: list[Path] = []
    skipped: list[SkippedFile] = []
    seen = {os.path.realpath(root): str(root)}  # real folder -> the path it was loaded as

    def unreadable(error: OSError) -> None:
        skipped.append(SkippedFile(str(error.filename), f"folder not readable: {error.strerror or error}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=True):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        names = sorted(d for d in dirnames if not d.startswith(".") and not _matches(rel_dir + d, exclude_re))
        entered: set[str] = set()
        # Real folders claim their place before links to them do; then each link in name order.
        for name in sorted(names, key=lambda d: os.path.islink(os.path.join(dirpath, d))):
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            if real in seen:
                reason = f"folder already loaded as {seen[real]} (a symbolic link loop or a second link); not loaded again"
                skipped.append(SkippedFile(path, reason))
                continue
            seen[real] = path
            entered.add(name)
        dirnames[:] = [d for d in names if d in entered]
        for name in sorted(n for n in filenames if not n.startswith(".")):
            rel = rel_dir + name
            if _matches(rel, include_re) and not _matches(rel, exclude_re):
                if _undecodable(name):  # it could not be recorded, shown or chunked as text
                    skipped.append(SkippedFile(_shown(os.path.join(dirpath, name)), _BAD_NAME))
                    continue
                found.append(Path(dirpath) / name)
    return found, skipped


def _undecodable(name: str) -> bool:
    """Whether a file name held bytes the file system encoding could not decode (surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _shown(path: PathLike) -> str:
    """``path`` as text that can be printed and stored: undecodable bytes as U+FFFD."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _matches(rel_path: str, patterns: Sequence[tuple[re.Pattern[str], bool]]) -> bool:
    name = rel_path.rsplit("/", 1)[-1]
    return any(regex.fullmatch(rel_path if anchored else name) for regex, anchored in patterns)


def _glob_to_regex(pattern: str) -> tuple[re.Pattern[str], bool]:
    """Translate a glob into (regex, matches-the-relative-path?).

    ``**/`` is zero or more folders, ``**`` anything, ``*`` anything but ``/``, ``?`` one
    character but ``/``, ``[...]`` a character class. Without ``/`` it matches file names.
    """
    anchored = "/" in pattern.strip("/") or pattern.startswith("**")
    pattern = pattern.strip("/")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.IGNORECASE), anchored


# --- per-format loaders -------------------------------------------------------------------


def _load(path: Path, max_file_bytes: int, digest: SupportsUpdate | None) -> list[Document]:
    kind = file_type(path)
    if kind in CONVERTED_TYPES.values():
        return _load_converted(path, kind, max_file_bytes, digest)
    if kind == "image":
        return _load_image(path, max_file_bytes, digest)
    _refuse_misnamed(path, kind, max_file_bytes)
    if kind == "pdf":
        return _load_pdf(path, max_file_bytes, digest)
    text = _read_text(path, max_file_bytes, digest)
    if kind == "html":
        return _load_html(path, text)
    if kind == "md":
        return [_document(text, path, "md", _markdown_title(text))]
    return [_document(text, path, "txt", None)]


def _load_converted(path: Path, kind: str, max_file_bytes: int, digest: SupportsUpdate | None) -> list[Document]:
    """An Office, e-book, table or notebook file through `retrievers.converters`: one Document per part."""
    if kind in ("csv", "ipynb"):
        data = _read_text(path, max_file_bytes, digest).encode("utf-8")  # the text checks and their reasons
    else:
        require("formats", f"reading {describe(kind)}", ("defusedxml",))  # their XML is parsed by defusedxml
        data = _read_bytes(path, max_file_bytes, digest)
        if not data.strip():
            raise _Skip("empty file")
    actual = zip_kind(data)
    if kind not in ("csv", "ipynb") and actual is not None and actual != kind:
        raise _Skip(f"it is {describe(actual)} named {path.suffix}; rename it to .{actual}")
    try:
        parts = convert(
            data, kind, max_text_chars=max_file_bytes, max_unzipped_bytes=UNZIPPED_PER_FILE_BYTE * max_file_bytes
        )
    except ConversionError as e:
        raise _Skip(str(e)) from e
    if not parts:
        raise _Skip(f"no text in {describe(kind)}")
    documents = []
    for number, part in enumerate(parts, start=1):
        metadata = dict(part.metadata)
        title = metadata.pop("title", None)
        documents.append(_document(part.text, path, kind, str(title) if title else None, **metadata, part=number))
    return documents


def _load_image(path: Path, max_file_bytes: int, digest: SupportsUpdate | None) -> list[Document]:
    """An image of text through OCR: one Document per frame (page of a TIFF) with text."""
    data = _read_bytes(path, max_file_bytes, digest)
    if not ocr.available():
        raise _Skip(f"an image; {ocr.INSTALL_HINT}")
    from PIL import Image, ImageSequence, UnidentifiedImageError  # Pillow comes with pytesseract
    texts: list[str] = []
    try:
        with Image.open(io.BytesIO(data)) as image:
            for frame in ImageSequence.Iterator(image):
                texts.append(ocr.ocr_image(frame))
    except ocr.OcrError as e:
        raise _Skip(f"OCR failed: {e}") from e
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as e:
        raise _Skip(f"not a readable image ({type(e).__name__}: {e})") from e
    documents = [
        _document(text, path, "image", None, page=number, total_pages=len(texts), ocr=True)
        for number, text in enumerate(texts, start=1)
        if text
    ]
    if not documents:
        raise _Skip("OCR found no text in the image")
    return documents


def _refuse_misnamed(path: Path, kind: str, max_file_bytes: int) -> None:
    """Skip a converted format (a zip) saved under a text, HTML or PDF name, saying what it is."""
    try:
        with _checked_open(path, max_file_bytes) as f:
            head = f.read(4)
            if head != b"PK\x03\x04":
                return
            f.seek(0)
            data = f.read(max_file_bytes + 1)
    except _Skip:
        return  # reading it again gives the reason
    actual = zip_kind(data)
    if actual is not None:
        raise _Skip(f"it is {describe(actual)} named {path.suffix or 'without a suffix'}; rename it to .{actual}")


def _read_bytes(path: Path, max_file_bytes: int, digest: SupportsUpdate | None = None) -> bytes:
    """Read a regular file of at most `max_file_bytes` (see `_checked_open`); the read stops one byte past the limit.

    `digest` gets the bytes read (the caller parses exactly these)."""
    with _checked_open(path, max_file_bytes) as f:
        size = os.fstat(f.fileno()).st_size  # read() sizes its buffer by what it is asked for
        data = f.read(min(size, max_file_bytes) + 1)
        if len(data) > size:  # it grew after the size check: read on to one byte past the limit
            data += f.read(max_file_bytes + 1 - len(data))
    if len(data) > max_file_bytes:
        raise _Skip(_too_large(len(data), max_file_bytes, grew=True))
    if digest is not None:
        digest.update(data)
    return data


def _check_regular(mode: int, max_file_bytes: int, size: int) -> None:
    if stat.S_ISDIR(mode):
        raise _Skip("is a directory; pass it on its own to load it recursively")
    if not stat.S_ISREG(mode):
        kind = (
            "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode)
            else "a special file"
        )
        raise _Skip(f"not a regular file: {kind}; only regular files are read")
    if size > max_file_bytes:
        raise _Skip(_too_large(size, max_file_bytes))


def _too_large(size: int, limit: int, grew: bool = False) -> str:
    how = "grew past" if grew else f"{_mib(size)} is over"
    return f"too large: {how} the per-file limit of {_mib(limit)}; raise max_file_bytes or split the file"


def _looks_binary(data: bytes) -> bool:
    """More control bytes than text in a single-byte encoding has (NUL bytes are checked first)."""
    sample = data[:_BINARY_SNIFF_BYTES]
    controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return controls > _BINARY_CONTROL_RATIO * len(sample)


def _read_text(path: Path, max_file_bytes: int, digest: SupportsUpdate | None = None) -> str:
    data = _read_bytes(path, max_file_bytes, digest)
    if not data.strip():
        raise _Skip("empty file")
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        raise _Skip("binary file, not text (contains NUL bytes); only text, Markdown, HTML, PDF, Office, EPUB, CSV and notebook files are read")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        if _looks_binary(data):
            raise _Skip("binary file, not text (many control bytes); only text, Markdown, HTML, PDF, Office, EPUB, CSV and notebook files are read") from e
        raise _Skip(
            f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from e
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise _Skip("empty file (only whitespace)")
    return text


def _document(text: str, path: Path, file_type: str, title: str | None, **extra: object) -> Document:
    metadata: dict[str, object] = {"source": str(path), "file_name": path.name, "file_type": file_type}
    if title:
        metadata["title"] = title
    metadata.update(extra)
    return Document(page_content=text, metadata=metadata)


_MD_HEADING = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _markdown_title(text: str) -> str | None:
    match = _MD_HEADING.search(text)
    return match.group(1).strip() if match else None


def _load_html(path: Path, markup: str) -> list[Document]:
    with needs("formats", "reading an HTML file"):
        from bs4 import BeautifulSoup

    soup = BeautifulSoup(markup, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    if not title:
        h1 = soup.find("h1")
        title = h1.get_text(" ", strip=True) if h1 else None
    for tag in soup(["script", "style", "noscript", "template", "head"]):
        tag.decompose()
    text = _tidy(soup.get_text("\n"))
    if not text:
        raise _Skip("no text in the HTML body")
    return [_document(text, path, "html", " ".join(title.split()) if title else None)]


def _tidy(text: str) -> str:
    """Collapse the whitespace runs HTML extraction leaves: spaces per line, blank-line runs."""
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _load_pdf(path: Path, max_file_bytes: int, digest: SupportsUpdate | None) -> list[Document]:
    with needs("formats", "reading a PDF"):
        from pypdf import PdfReader

    data = _read_bytes(path, max_file_bytes, digest)
    if not data.strip():
        raise _Skip("empty file")
    if not data.lstrip().startswith(b"%PDF-"):
        raise _Skip("corrupt PDF: no %PDF- header; re-export the file as PDF")
    try:
        import io

        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise _Skip("encrypted PDF; decrypt it first (e.g. `qpdf --decrypt in.pdf out.pdf`)")
        title = _pdf_title(reader)
        pages: list[str] = []
        ocr_pages: set[int] = set()
        total = 0
        for page in reader.pages:
            pages.append(_utf16_text(page.extract_text() or "") or _scanned_page_text(page, len(pages) + 1, ocr_pages))
            total += len(pages[-1])
            if total > max_file_bytes:  # pages can share one compressed stream: a small file, unbounded text
                raise _Skip(
                    f"its text is larger than the per-file limit of {_mib(max_file_bytes)} after {len(pages)} page(s) "
                    "(a text file could not hold it either); split the PDF or raise max_file_bytes"
                )
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001 - pypdf raises all kinds (NotImplementedError for an unknown
        # filter, RecursionError for deep nesting, DependencyError for a codec it lacks): all the file's fault
        raise _Skip(f"corrupt PDF, or one pypdf cannot read: {_failure(e)}; re-export or repair it (e.g. `qpdf in.pdf out.pdf`)") from e
    documents = [
        _document(
            _tidy(text), path, "pdf", title, page=number, total_pages=len(pages), **({"ocr": True} if number in ocr_pages else {})
        )
        for number, text in enumerate(pages, start=1)
        if text.strip()
    ]
    if not documents:
        hint = "OCR found no text either" if ocr.available() else ocr.INSTALL_HINT
        raise _Skip(f"no extractable text in {len(pages)} page(s) (scanned images?); {hint}")
    return documents


def _scanned_page_text(page: object, number: int, ocr_pages: set[int]) -> str:
    """The OCR'd text of a PDF page without a text layer (its number joins `ocr_pages`); "" without OCR, with a note saying so."""
    if not ocr.available():
        warnings.warn(f"page {number} has no text layer and was left out; {ocr.INSTALL_HINT}", ScannedPageWarning, stacklevel=2)
        return ""
    try:
        text = ocr.ocr_pdf_page(page)
    except ocr.OcrError as e:
        warnings.warn(f"page {number} has no text layer and OCR failed: {e}", ScannedPageWarning, stacklevel=2)
        return ""
    if text:
        ocr_pages.add(number)
    return text


def _failure(e: BaseException, limit: int = 200) -> str:
    """A parser's exception as a one-line skip reason of at most ``limit`` characters."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _utf16_text(text: str) -> str:
    """PDF text with the UTF-16 surrogate pairs pypdf can leave joined into characters, and lone
    surrogates (a broken font map) as U+FFFD: text a tokenizer takes."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _pdf_title(reader: object) -> str | None:
    try:
        info = reader.metadata  # type: ignore[attr-defined]
        title = info.title if info else None
    except Exception:  # noqa: BLE001 - a broken info dict must not lose the text
        return None
    return _utf16_text(str(title)).strip() or None if title else None
