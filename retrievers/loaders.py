"""Load .txt, .md, .html and .pdf files (or whole directories) into LangChain Documents.

A file that cannot be ingested (missing, unreadable, binary, empty, not UTF-8, a corrupt
or encrypted PDF) is skipped with a `SkippedFileWarning` that names it and says why; every
other file is still loaded, and the caller gets the skipped files back in `LoadResult`.

Metadata of each Document: ``source`` (the path as found, a string), ``file_type``
(``txt``, ``md``, ``html`` or ``pdf``), ``title`` where the file states one, and for PDFs
``page`` (1-based, one Document per page with text) and ``total_pages``.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from langchain_core.documents import Document

__all__ = [
    "DEFAULT_INCLUDE",
    "LoadResult",
    "SkippedFile",
    "SkippedFileWarning",
    "load_documents",
    "load_file",
]

PathLike = str | os.PathLike[str]

#: Files a directory walk picks up when no `include` globs are given.
DEFAULT_INCLUDE: tuple[str, ...] = ("*.txt", "*.md", "*.markdown", "*.html", "*.htm", "*.pdf")

_BINARY_SNIFF_BYTES = 8192


class SkippedFileWarning(UserWarning):
    """Emitted once per file that `load_documents` skips."""


@dataclass(frozen=True)
class SkippedFile:
    """A file that was not ingested, and why."""

    path: str
    reason: str


@dataclass
class LoadResult:
    """Documents loaded from the good files, and the files that were skipped."""

    documents: list[Document] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.documents.extend(other.documents)
        self.skipped.extend(other.skipped)


class _Skip(Exception):
    """Internal: raised by a per-format loader to skip the current file."""


def load_documents(
    paths: PathLike | Sequence[PathLike],
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> LoadResult:
    """Load files and directories (recursively) into Documents.

    Args:
        paths: A file or directory, or a sequence of them. Files named explicitly are
            always loaded (a ``.pdf``/``.html``/``.md`` by its format, anything else as
            UTF-8 text); `include`/`exclude` only filter what a directory walk finds.
        include: Glob patterns a file found in a directory must match (default
            `DEFAULT_INCLUDE`). A pattern without ``/`` matches the file name; one with
            ``/`` matches the path relative to the directory, where ``**`` spans folders.
        exclude: Glob patterns (same syntax) of files or folders to leave out.

    Returns:
        `LoadResult` with the documents in path order and the skipped files.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    include_patterns = tuple(include) if include is not None else DEFAULT_INCLUDE
    exclude_patterns = tuple(exclude or ())
    result = LoadResult()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for file in _walk(path, include_patterns, exclude_patterns):
                result.extend(load_file(file))
        else:
            result.extend(load_file(path))
    return result


def load_file(path: PathLike) -> LoadResult:
    """Load one file; a problem with it becomes a `SkippedFile` (and a warning), never an exception."""
    path = Path(path)
    try:
        documents = _load(path)
    except _Skip as skip:
        reason = str(skip)
        warnings.warn(f"skipped {path}: {reason}", SkippedFileWarning, stacklevel=3)
        return LoadResult(skipped=[SkippedFile(str(path), reason)])
    return LoadResult(documents=documents)


# --- directory walk ---------------------------------------------------------------------


def _walk(root: Path, include: Sequence[str], exclude: Sequence[str]) -> list[Path]:
    include_re = [_glob_to_regex(p) for p in include]
    exclude_re = [_glob_to_regex(p) for p in exclude]
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not _matches(rel_dir + d, exclude_re))
        for name in sorted(filenames):
            rel = rel_dir + name
            if _matches(rel, include_re) and not _matches(rel, exclude_re):
                found.append(Path(dirpath) / name)
    return found


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
    return re.compile("".join(out)), anchored


# --- per-format loaders -------------------------------------------------------------------


def _load(path: Path) -> list[Document]:
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return _load_pdf(path)
    text = _read_text(path)
    if suffix in (".html", ".htm"):
        return _load_html(path, text)
    if suffix in (".md", ".markdown"):
        return [_document(text, path, "md", _markdown_title(text))]
    return [_document(text, path, "txt", None)]


def _read_bytes(path: Path) -> bytes:
    """Read a file, turning every OS-level failure into a skip reason."""
    if path.is_symlink() and not path.exists():
        raise _Skip("unreadable: broken symbolic link")
    try:
        return path.read_bytes()
    except FileNotFoundError as e:
        raise _Skip("not found") from e
    except IsADirectoryError as e:
        raise _Skip("is a directory; pass it on its own to load it recursively") from e
    except PermissionError as e:
        raise _Skip("unreadable: permission denied; check the file's permissions") from e
    except OSError as e:
        raise _Skip(f"unreadable: {e.strerror or e}") from e


def _read_text(path: Path) -> str:
    data = _read_bytes(path)
    if not data.strip():
        raise _Skip("empty file")
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        raise _Skip("binary file (contains NUL bytes); only text, Markdown, HTML and PDF are supported")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _Skip(
            f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from e
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise _Skip("empty file (only whitespace)")
    return text


def _document(text: str, path: Path, file_type: str, title: str | None, **extra: object) -> Document:
    metadata: dict[str, object] = {"source": str(path), "file_type": file_type}
    if title:
        metadata["title"] = title
    metadata.update(extra)
    return Document(page_content=text, metadata=metadata)


_MD_HEADING = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _markdown_title(text: str) -> str | None:
    match = _MD_HEADING.search(text)
    return match.group(1).strip() if match else None


def _load_html(path: Path, markup: str) -> list[Document]:
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


def _load_pdf(path: Path) -> list[Document]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    data = _read_bytes(path)
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
        pages = [page.extract_text() or "" for page in reader.pages]
    except _Skip:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, IndexError, AttributeError, OSError) as e:
        raise _Skip(f"corrupt PDF: {type(e).__name__}: {e}; re-export or repair it (e.g. `qpdf in.pdf out.pdf`)") from e
    documents = [
        _document(_tidy(text), path, "pdf", title, page=number, total_pages=len(pages))
        for number, text in enumerate(pages, start=1)
        if text.strip()
    ]
    if not documents:
        raise _Skip(f"no extractable text in {len(pages)} page(s) (scanned images?); OCR it first")
    return documents


def _pdf_title(reader: object) -> str | None:
    try:
        info = reader.metadata  # type: ignore[attr-defined]
        title = info.title if info else None
    except Exception:  # noqa: BLE001 - a broken info dict must not lose the text
        return None
    return str(title).strip() or None if title else None
