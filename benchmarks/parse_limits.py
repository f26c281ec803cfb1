"""Hostile file shapes (issue 30's third probe) and what loading each costs: seconds and peak RSS.

Builds each shape, then loads it with ``retrievers.loaders.load_file`` in a fresh Python per file
(``--code`` names the checkout whose ``retrievers`` runs, to compare before and after), capped at
``--memory-gib`` of address space and ``--timeout`` seconds, and prints one table row per file:
its size, wall seconds (CPU seconds), peak RSS less the interpreter's after imports, and the
outcome (parts loaded, or the skip reason). ``--scale`` shrinks every shape (0.01: a hundredth), for a quick run.

    python benchmarks/parse_limits.py --scale 0.01
    python benchmarks/parse_limits.py --code /path/to/old/checkout --only docx-5 csv-2m

Shapes: Word files with 5, 20 and 190 MiB of XML in few kilobytes (paragraphs of empty runs);
a workbook whose shared-string table is 170 MB; a CSV of two million rows; a Word file and an
EPUB whose member declares a few bytes and holds 1.9 GiB.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_EMPTY_PARAGRAPHS = b"<w:p><w:pPr/><w:r><w:rPr/><w:t></w:t></w:r></w:p>" * 64
_BLOCK = 2**20


def copy_except(source: bytes, target: zipfile.ZipFile, skip: str) -> None:
    with zipfile.ZipFile(io.BytesIO(source)) as old:
        for item in old.infolist():
            if item.filename != skip:
                target.writestr(item, old.read(item))


def base_docx() -> bytes:
    import docx

    buffer = io.BytesIO()
    document = docx.Document()
    document.add_paragraph("A short handbook.")
    document.save(buffer)
    return buffer.getvalue()


def docx_with_xml(path: Path, xml_bytes: int) -> Path:
    """A valid .docx whose document.xml is `xml_bytes` of paragraphs of empty runs (one with text every 64)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        copy_except(base_docx(), archive, "word/document.xml")
        with archive.open("word/document.xml", "w") as member:
            member.write(f'<w:document xmlns:w="{_W}"><w:body>'.encode())
            chunk = _EMPTY_PARAGRAPHS + b"<w:p><w:r><w:t>Ferry notes.</w:t></w:r></w:p>"
            for _ in range(max(1, xml_bytes // len(chunk))):
                member.write(chunk)
            member.write(b"</w:body></w:document>")
    return path


_SHEET_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_REL_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_XLSX_PARTS = {
    "[Content_Types].xml": (
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
        '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
        '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
        "</Types>"
    ),
    "_rels/.rels": (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f'<Relationship Id="rId1" Type="{_REL_NS}/officeDocument" Target="xl/workbook.xml"/></Relationships>'
    ),
    "xl/workbook.xml": (
        f'<workbook xmlns="{_SHEET_NS}" xmlns:r="{_REL_NS}"><sheets><sheet name="Budget" sheetId="1" r:id="rId1"/></sheets></workbook>'
    ),
    "xl/_rels/workbook.xml.rels": (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f'<Relationship Id="rId1" Type="{_REL_NS}/worksheet" Target="worksheets/sheet1.xml"/>'
        f'<Relationship Id="rId2" Type="{_REL_NS}/sharedStrings" Target="sharedStrings.xml"/></Relationships>'
    ),
    "xl/worksheets/sheet1.xml": (
        f'<worksheet xmlns="{_SHEET_NS}"><sheetData>'
        '<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c></row>'
        '<row r="2"><c r="A2" t="s"><v>2</v></c><c r="B2"><v>1200</v></c></row></sheetData></worksheet>'
    ),
}


def xlsx_with_shared_strings(path: Path, table_bytes: int) -> Path:
    """A valid .xlsx (one sheet: "Item, Cost / Fuel, 1200") whose shared-string table is `table_bytes` of distinct strings."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in _XLSX_PARTS.items():
            archive.writestr(name, text)
        with archive.open("xl/sharedStrings.xml", "w") as member:
            member.write(f'<sst xmlns="{_SHEET_NS}"><si><t>Item</t></si><si><t>Cost</t></si><si><t>Fuel</t></si>'.encode())
            written, i = 0, 0
            while written < table_bytes:
                block = b"".join(b"<si><t>entry %d</t></si>" % n for n in range(i, i + 10_000))
                member.write(block)
                written += len(block)
                i += 10_000
            member.write(b"</sst>")
    return path


def csv_rows(path: Path, rows: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        f.write("id,name,berth\n")
        for start in range(0, rows, 100_000):
            f.write("".join(f"{i},boat {i},{i % 40}\n" for i in range(start, min(rows, start + 100_000))))
    return path


def _under_declared(data: bytes, member: str, declared: int) -> bytes:
    """`data` (a zip) with `member`'s uncompressed size in the central directory set to `declared`."""
    out = bytearray(data)
    at = -1
    while True:
        at = out.index(b"PK\x01\x02", at + 1)
        name_length = struct.unpack_from("<H", out, at + 28)[0]
        if out[at + 46 : at + 46 + name_length] == member.encode():
            struct.pack_into("<I", out, at + 24, declared)
            return bytes(out)


def _stream_zeros(member: io.BufferedIOBase, head: bytes, total: int) -> None:
    member.write(head)
    zeros = bytes(_BLOCK)
    for _ in range(max(0, total - len(head)) // _BLOCK):
        member.write(zeros)


def docx_lying_member(path: Path, real_bytes: int) -> Path:
    """A .docx whose document.xml declares 2 KiB and holds `real_bytes` (a paragraph, then zeros)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        copy_except(base_docx(), archive, "word/document.xml")
        with archive.open("word/document.xml", "w") as member:
            head = f'<w:document xmlns:w="{_W}"><w:body><w:p><w:r><w:t>Lies.</w:t></w:r></w:p>'.encode()
            _stream_zeros(member, head, real_bytes)
    path.write_bytes(_under_declared(buffer.getvalue(), "word/document.xml", 2048))
    return path


def epub_lying_mimetype(path: Path, real_bytes: int) -> Path:
    """An .epub whose ``mimetype`` declares 20 bytes and holds `real_bytes`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("mimetype", "w") as member:
            _stream_zeros(member, b"application/epub+zip", real_bytes)
        archive.writestr("META-INF/container.xml", "<container/>")
    path.write_bytes(_under_declared(buffer.getvalue(), "mimetype", 20))
    return path


MIB = 2**20
SHAPES: dict[str, tuple[str, Callable[[Path, float], Path]]] = {
    "docx-5": ("docx", lambda p, s: docx_with_xml(p, int(5 * MIB * s))),
    "docx-20": ("docx", lambda p, s: docx_with_xml(p, int(20 * MIB * s))),
    "docx-190": ("docx", lambda p, s: docx_with_xml(p, int(190 * MIB * s))),
    "xlsx-170": ("xlsx", lambda p, s: xlsx_with_shared_strings(p, int(170e6 * s))),
    "csv-2m": ("csv", lambda p, s: csv_rows(p, int(2_000_000 * s))),
    "docx-lying": ("docx", lambda p, s: docx_lying_member(p, int(1900 * MIB * s))),
    "epub-lying": ("epub", lambda p, s: epub_lying_mimetype(p, int(1900 * MIB * s))),
}

_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
limit = int(float(sys.argv[3]) * 2**30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from retrievers.loaders import load_file
import retrievers.converters
before = resource.getrusage(resource.RUSAGE_SELF)
start = time.perf_counter()
try:
    result = load_file(sys.argv[2], warn=False)
    outcome = f"{len(result.documents)} parts" if result.documents else "skipped: " + result.skipped[0].reason[:90]
except MemoryError:
    outcome = "MemoryError (address-space cap)"
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mib": (after.ru_maxrss - before.ru_maxrss) / 1024, "outcome": outcome}))
"""


def measure(path: Path, code: Path, memory_gib: float, timeout_s: float) -> dict[str, object]:
    """Load `path` with the `retrievers` of `code` in a fresh Python: wall and CPU seconds, peak RSS growth (MiB), outcome.

    A load still running after `timeout_s` is killed; its row then gives the process's peak RSS so
    far (``VmHWM``, imports included) as a lower bound."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(code), str(path), str(memory_gib)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        peak = _peak_rss_mib(child.pid)
        child.kill()
        child.communicate()
        return {"seconds": timeout_s, "cpu_s": None, "peak_mib": None,
                "outcome": f"still running after {timeout_s:.0f} s (killed), peak RSS so far {peak}"}
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        return {"seconds": None, "cpu_s": None, "peak_mib": None, "outcome": f"exit {child.returncode}: {err.strip()[-120:]}"}
    return json.loads(lines[-1])


def _peak_rss_mib(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"{int(line.split()[1]) / 1024:.0f} MiB"
    except OSError:
        pass
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="shrink every shape by this factor (default 1)")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose retrievers loads the files")
    parser.add_argument("--only", nargs="*", choices=sorted(SHAPES), help="shapes to run (default: all)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap of each load")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a load is killed")
    args = parser.parse_args(argv)
    print(f"code: {args.code}  scale: {args.scale}")
    print("| shape | file | seconds (CPU) | peak RSS growth | outcome |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(SHAPES):
            kind, build = SHAPES[name]
            path = build(Path(tmp) / f"{name}.{kind}", args.scale)
            row = measure(path, args.code, args.memory_gib, args.timeout)
            seconds = "-" if row["seconds"] is None else f"{row['seconds']:.1f} s" + (
                f" ({row['cpu_s']:.1f})" if row.get("cpu_s") is not None else "")
            peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f} MiB"
            print(f"| {name} | {path.stat().st_size / 1024:.0f} KiB | {seconds} | {peak} | {row['outcome']} |", flush=True)
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
