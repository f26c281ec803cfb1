"""Loaders: formats, metadata, directory walks with globs, and every kind of bad file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrievers import SkippedFile, SkippedFileWarning, load_documents, load_file
from retrievers.loaders import _glob_to_regex, _matches


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def test_text_markdown_and_html_metadata(tmp_path: Path) -> None:
    txt = write(tmp_path / "a.txt", "plain words\r\nsecond line\n")
    md = write(tmp_path / "b.md", "intro\n\n# The Title #\n\nbody text\n")
    html = write(
        tmp_path / "c.html",
        "<html><head><title>Page Title</title><style>p{color:red}</style></head>"
        "<body><script>var hidden = 1;</script><h1>Heading</h1><p>Visible   text\n here.</p></body></html>",
    )
    result = load_documents([txt, md, html])
    assert result.skipped == []
    by_type = {d.metadata["file_type"]: d for d in result.documents}
    assert by_type["txt"].page_content == "plain words\nsecond line\n"  # CRLF normalized, text otherwise verbatim
    assert by_type["txt"].metadata == {"source": str(txt), "file_name": "a.txt", "file_type": "txt"}
    assert by_type["md"].metadata["title"] == "The Title"
    assert by_type["html"].metadata["title"] == "Page Title"
    assert "Visible text" in by_type["html"].page_content
    assert "hidden" not in by_type["html"].page_content and "color" not in by_type["html"].page_content


def test_html_title_falls_back_to_h1_and_bom_is_stripped(tmp_path: Path) -> None:
    html = write(tmp_path / "x.htm", b"\xef\xbb\xbf<body><h1>Only  Heading</h1><p>para</p></body>")
    (doc,) = load_file(html).documents
    assert doc.metadata["title"] == "Only Heading"
    assert not doc.page_content.startswith("\ufeff")


def test_pdf_one_document_per_page_with_text(tmp_path: Path, make_pdf) -> None:
    pdf = write(tmp_path / "r.pdf", make_pdf(["First page (one)", "", "Third page"], title="Report"))
    result = load_file(pdf)
    assert result.skipped == []
    assert [d.metadata["page"] for d in result.documents] == [1, 3]
    assert result.documents[0].page_content == "First page (one)"
    assert all(d.metadata["title"] == "Report" and d.metadata["total_pages"] == 3 for d in result.documents)


def test_bad_files_are_skipped_with_reasons_and_good_files_still_load(tmp_path: Path, make_pdf) -> None:
    good = [
        write(tmp_path / "good.txt", "good text"),
        write(tmp_path / "sub" / "good.md", "# Good\nmarkdown"),
        write(tmp_path / "good.pdf", make_pdf(["pdf text"])),
    ]
    bad = {
        "corrupt.pdf": (make_pdf(["x"])[:60], "corrupt PDF"),
        "notapdf.pdf": (b"hello, I am not a PDF", "no %PDF- header"),
        "blank.pdf": (make_pdf(["", ""]), "no extractable text"),
        "binary.txt": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        "empty.md": (b"", "empty"),
        "spaces.txt": (b"  \n\t\n", "empty"),
        "latin1.txt": ("caf\u00e9 cr\u00e8me".encode("latin-1"), "not valid UTF-8"),
        "empty.html": ("<html><body><script>x()</script></body></html>", "no text"),
    }
    for name, (data, _) in bad.items():
        write(tmp_path / name, data)
    os.symlink(tmp_path / "does-not-exist.txt", tmp_path / "dangling.txt")

    with pytest.warns(SkippedFileWarning) as caught:
        result = load_documents(tmp_path)

    assert sorted(d.metadata["source"] for d in result.documents) == sorted(str(p) for p in good)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert set(reasons) == set(bad) | {"dangling.txt"}
    for name, (_, expected) in bad.items():
        assert expected in reasons[name], (name, reasons[name])
    assert "broken symbolic link" in reasons["dangling.txt"]
    assert "iconv" in reasons["latin1.txt"]  # says how to fix it
    messages = [str(w.message) for w in caught]
    for name in reasons:  # one warning per skipped file, naming it
        assert sum(name in m for m in messages) == 1


def test_unreadable_file_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, where chmod 000 does not stop reads; simulate the OS refusing instead.
    locked = write(tmp_path / "locked.txt", "secret")
    fine = write(tmp_path / "fine.txt", "fine")
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if Path(path).name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.warns(SkippedFileWarning, match="locked.txt"):
        result = load_documents([locked, fine])
    assert [d.page_content for d in result.documents] == ["fine"]
    assert result.skipped == [SkippedFile(str(locked), "unreadable: permission denied; check the file's permissions")]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can read chmod-000 files")
def test_unreadable_file_by_permissions(tmp_path: Path) -> None:
    locked = write(tmp_path / "locked.txt", "secret")
    locked.chmod(0)
    with pytest.warns(SkippedFileWarning):
        result = load_file(locked)
    assert "permission denied" in result.skipped[0].reason


def test_missing_path_and_explicit_files_of_other_types(tmp_path: Path) -> None:
    rst = write(tmp_path / "notes.rst", "Title\n=====\n\ntext")
    blob = write(tmp_path / "data.bin", b"\x89PNG\x00\x00")
    with pytest.warns(SkippedFileWarning):
        result = load_documents([tmp_path / "missing.txt", rst, blob])
    assert [d.metadata["source"] for d in result.documents] == [str(rst)]  # explicit files load as text
    assert [(Path(s.path).name, s.reason.split(" ")[0]) for s in result.skipped] == [
        ("missing.txt", "not"),
        ("data.bin", "binary"),
    ]


def test_directory_walk_include_exclude(tmp_path: Path) -> None:
    for rel in ["a.md", "b.txt", "c.rst", "docs/d.md", "docs/drafts/e.md", "docs/old/f.txt", "node_modules/g.md"]:
        write(tmp_path / rel, f"content of {rel}")

    def names(**kwargs) -> list[str]:
        docs = load_documents(tmp_path, **kwargs).documents
        return sorted(Path(d.metadata["source"]).relative_to(tmp_path).as_posix() for d in docs)

    assert names() == ["a.md", "b.txt", "docs/d.md", "docs/drafts/e.md", "docs/old/f.txt", "node_modules/g.md"]
    assert names(include=["*.rst"]) == ["c.rst"]
    assert names(include=["docs/**/*.md"]) == ["docs/d.md", "docs/drafts/e.md"]
    assert names(include=["*.md"], exclude=["drafts", "node_modules"]) == ["a.md", "docs/d.md"]
    assert names(exclude=["docs/old/*", "**/*.md"]) == ["b.txt"]


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.md", "a.md", True),
        ("*.md", "x/y/a.md", True),  # no slash: matches the file name anywhere
        ("*.md", "a.mdx", False),
        ("docs/*.md", "docs/a.md", True),
        ("docs/*.md", "docs/x/a.md", False),  # * does not cross folders
        ("docs/**/*.md", "docs/a.md", True),  # **/ may be zero folders
        ("docs/**/*.md", "docs/x/y/a.md", True),
        ("**/tmp", "a/b/tmp", True),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[ab].txt", "b.txt", True),
        ("[!ab].txt", "b.txt", False),
        ("a+b.txt", "a+b.txt", True),  # regex characters are literal
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert _matches(path, [_glob_to_regex(pattern)]) is expected


def _pages_sharing_one_stream(n_pages: int, text_chars: int) -> bytes:
    """A PDF whose pages all draw one compressed content stream: small file, n_pages x text_chars of text."""
    import zlib

    stream = zlib.compress(b"BT /F1 12 Tf 10 10 Td (" + b"word " * (text_chars // 5) + b") Tj ET", 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (5 + i) for i in range(n_pages)), n_pages),
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        *[b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources << /Font << /F1 4 0 R >> >> >>"]
        * n_pages,
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_a_pdf_whose_text_outgrows_the_file_limit_is_skipped(tmp_path: Path) -> None:
    """Pages can share one compressed stream: the file is small, its text is not."""
    path = tmp_path / "bomb.pdf"
    path.write_bytes(_pages_sharing_one_stream(60, 20_000))  # ~1.2 M characters from a few KiB
    limit = 2**20
    assert path.stat().st_size < limit // 100
    result = load_file(path, max_file_bytes=limit, warn=False)
    assert not result.documents and "its text is larger than the per-file limit of 1.0 MiB" in result.skipped[0].reason
    fits = load_file(path, max_file_bytes=2 * limit, warn=False)
    assert len(fits.documents) == 60 and not fits.skipped


def test_a_walk_ignores_case_leaves_out_hidden_entries_and_reports_undecodable_names(tmp_path: Path) -> None:
    (tmp_path / "A.TXT").write_text("upper case suffix")
    (tmp_path / "SCAN0001.PDF").write_bytes(b"not a pdf")  # found (then skipped for its content)
    (tmp_path / ".hidden.md").write_text("hidden file")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "notes.md").write_text("inside .git")
    os.close(os.open(os.fsencode(tmp_path) + b"/caf\xe9.txt", os.O_CREAT | os.O_WRONLY))  # a Latin-1 name
    result = load_documents(tmp_path)
    assert [Path(d.metadata["source"]).name for d in result.documents] == ["A.TXT"]
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert reasons["caf\ufffd.txt"] == "its name is not valid UTF-8; rename the file"
    assert "no %PDF- header" in reasons["SCAN0001.PDF"] and len(reasons) == 2


def test_pdf_text_joins_surrogate_pairs_and_replaces_lone_ones() -> None:
    from retrievers.loaders import _utf16_text

    assert _utf16_text("a\ud83d\ude00b\ud83dc") == "a\U0001f600b\ufffdc"
    assert _utf16_text("plain") == "plain"
