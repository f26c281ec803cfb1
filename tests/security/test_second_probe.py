"""The second probe's findings: inputs that escaped the loaders, leaks in error replies, names,
bodies and paths that were 500s, and the Python API's silent coercions."""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.web.documents import _safe_name
from apps.web.server import AppConfig, create_app
from retrievers.loaders import load_documents, load_file
from tests.apps.conftest import LiveServer, ScriptedIndexer
from tests.apps.fakes import GeneratorSource


def pdf(content: bytes, stream_dict: bytes = b"") -> bytes:
    """A one-page PDF whose content stream is ``content`` (with ``stream_dict`` entries, e.g. a filter)."""
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d %s >>\nstream\n" % (len(content), stream_dict) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


HOSTILE_PDFS = {
    "filter.pdf": (pdf(b"xyz", b"/Filter /FooDecode"), "NotImplementedError"),
    "brotli.pdf": (pdf(b"xyz", b"/Filter /BrotliDecode"), "brotli"),
    "deep.pdf": (pdf(b"BT /F1 12 Tf 10 10 Td " + b"[" * 50_000 + b"(x)" + b"]" * 50_000 + b" TJ ET"), "RecursionError"),
}


# -- 2. nothing a PDF contains escapes load_file or stops the other files -----------------------


@pytest.mark.timeout(120)
def test_pdfs_that_break_the_parser_are_skipped_with_their_reason_and_the_rest_loads(tmp_path: Path) -> None:
    for name, (data, _) in HOSTILE_PDFS.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "good.pdf").write_bytes(pdf(b"BT /F1 12 Tf 10 10 Td (The trial lasts six months) Tj ET"))
    (tmp_path / "notes.md").write_text("# Notes\n\nShifts start at 3:30.\n")
    for name, (_, cause) in HOSTILE_PDFS.items():
        result = load_file(tmp_path / name, warn=False)
        assert not result.documents and len(result.skipped) == 1
        assert "PDF" in result.skipped[0].reason and cause in result.skipped[0].reason
    loaded = load_documents([tmp_path])
    assert sorted(Path(d.metadata["source"]).name for d in loaded.documents) == ["good.pdf", "notes.md"]
    assert sorted(Path(s.path).name for s in loaded.skipped) == sorted(HOSTILE_PDFS)


@dataclass
class FailingOn(ScriptedIndexer):
    """Indexing fails unexpectedly when a file called ``poison`` is among the uploads."""

    poison: str = "poison.md"

    def index(self, paths: Any, workdir: Path, progress: Any = None) -> Any:
        if any((Path(p) / self.poison).exists() for p in paths):
            raise RuntimeError("the index broke")
        return super().index(paths, workdir, progress)


@pytest.mark.timeout(120)
def test_an_upload_whose_indexing_fails_leaves_no_file_behind(tmp_path: Path) -> None:
    with LiveServer(create_app(AppConfig(), indexer=FailingOn(), sessions_root=tmp_path)) as server:
        with httpx.Client(base_url=server.url, timeout=20) as c:
            files = lambda name: [("files", (name, b"# Notes\n\nSix months.\n", "text/markdown"))]  # noqa: E731
            assert c.post("/api/documents", files=files("notes.md")).status_code == 200
            failed = c.post("/api/documents", files=files("poison.md"))
            assert failed.status_code == 500 and "the index broke" not in failed.text
            later = c.post("/api/documents", files=files("more.md"))
            assert later.status_code == 200, later.text  # the session is not stuck on the bad file
            assert sorted(later.json()["documents"]) == ["more.md", "notes.md"]


# -- 3, 5. errors in /v1 replies -----------------------------------------------------------------


@pytest.mark.timeout(180)
def test_v1_bodies_and_schemas_that_were_500s_are_400s_naming_the_parameter(tmp_path: Path, lc_tiny_generator: Any) -> None:
    app = create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path, generation=GeneratorSource(lc_tiny_generator))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        digits = b'{"model": "tiny", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
        r = c.post("/v1/completions", content=digits, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        deep = '{"type": "array", "items": ' * 900 + '{"type": "string"}' + "}" * 900
        body = ('{"model": "tiny", "prompt": "hi", "max_tokens": 2, "response_format": '
                '{"type": "json_schema", "json_schema": {"name": "x", "schema": ' + deep + "}}}")
        r = c.post("/v1/completions", content=body.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        assert "Traceback" not in r.text and "panic" not in r.text and ".rs" not in r.text
        assert c.get("/api/health").json()["ok"]


def test_a_500_from_generation_carries_no_exception_text() -> None:
    from apps.web.openai_api import generation_error

    error = generation_error(RuntimeError("secret /home/me/.cache/ragspec path"))
    assert error.status == 500 and "secret" not in error.message and "RuntimeError" not in error.message


def test_an_engine_message_is_cut_to_its_first_line() -> None:
    from apps.web.openai_api import generation_error
    from ragspec.engine.constraints import ConstraintError

    panic = ConstraintError("panic: assertion failed: grammar.symbols.len() < u16::MAX\nstack backtrace:\n  0: /rustc/abc/src/x.rs")
    error = generation_error(panic)
    assert error.status == 400 and error.param == "response_format"
    assert "backtrace" not in error.message and "x.rs" not in error.message


@pytest.mark.timeout(120)
def test_a_schema_that_compiles_too_long_is_a_400_and_keeps_the_slot_until_it_ends() -> None:
    import asyncio
    import time

    from apps.web.openai_api import jobs
    from apps.web.openai_api import OpenAIError, compile_constraint, parse_request
    from apps.web.queue import ModelQueue

    body = {"model": "m", "prompt": "hi", "response_format": {"type": "json_object"}}
    request = parse_request(body, chat=False)
    assert "constraint" not in request.options  # nothing compiled on the event loop while parsing

    def slow(value: object) -> object:
        time.sleep(0.6)
        return None

    async def scenario() -> tuple[int, int]:
        from ragspec.chat_request import ChatRequest
        from ragspec.engine.config import GenerationConfig

        queue = ModelQueue(slots=1)
        ticket = queue.ticket()
        await ticket.wait(1)
        job = jobs.Job(request, ChatRequest([1, 2], GenerationConfig()))
        with pytest.raises(OpenAIError) as e:
            await compile_constraint(job, ticket, timeout_s=0.1)
        assert e.value.param == "response_format" and "did not compile" in e.value.message
        ticket.release()
        held = queue.running  # the compile still runs: the slot is still taken
        await asyncio.sleep(1.0)
        return held, queue.running

    original = jobs.response_constraint
    jobs.response_constraint = slow
    try:
        assert asyncio.run(scenario()) == (1, 0)
    finally:
        jobs.response_constraint = original


# -- 4, 9. upload names ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["\U0001d400" * 130 + ".md", "文" * 100 + ".txt", "a" * 300 + ".md", "x." + "y" * 300])
def test_long_non_ascii_upload_names_fit_the_file_system(name: str) -> None:
    safe = _safe_name(name)
    assert len(f"{Path(safe).stem} (99){Path(safe).suffix}".encode()) <= 255
    assert safe.split(".")[0]  # something of the name is kept


@pytest.mark.timeout(120)
def test_long_names_upload_and_a_suffix_in_capitals_is_named_as_such(tmp_path: Path) -> None:
    with LiveServer(create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path)) as server:
        with httpx.Client(base_url=server.url, timeout=20) as c:
            names = ["\U0001d400" * 130 + ".md", "文" * 100 + ".txt", "name.TXT"]
            r = c.post("/api/documents", files=[("files", (n, b"text", "text/plain")) for n in names])
            assert r.status_code == 200, r.text
            notices = r.json()["notices"]
            assert any("'name.TXT' was saved as 'name.txt': its suffix is kept in lower case" == n for n in notices), notices
            assert sum("too long" in n for n in notices) == 2, notices


# -- 6. folder paths --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("path", "status"), [("~nosuchuser_ragspec/docs", 404), ("/" + "d" * 3000, 422), ("x" * 5000, 422)])
def test_unusable_folder_paths_are_clear_4xx_not_500(tmp_path: Path, path: str, status: int) -> None:
    with LiveServer(create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path)) as server:
        with httpx.Client(base_url=server.url, timeout=20) as c:
            r = c.post("/api/folder", json={"path": path})
    assert r.status_code == status, r.text


# -- 7. a client that leaves mid-body ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_client_that_drops_mid_body_is_not_an_error_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import time

    with LiveServer(create_app(AppConfig(), indexer=ScriptedIndexer(), sessions_root=tmp_path)) as server:
        caplog.set_level(logging.DEBUG)
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", server.port)) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"model\": ")
                time.sleep(0.2)
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, timeout=20) as c:
            assert c.get("/api/health").json()["ok"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


# -- 8. the Python API refuses what it used to coerce ----------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda g: g.generate(b"hello", max_new_tokens=2), TypeError, "decode it first"),
        (lambda g: g.generate("hi", references="abc", max_new_tokens=2), TypeError, "wrap it in a list"),
        (lambda g: g.generate("hi", references=[[1.5]], max_new_tokens=2), TypeError, "reference 0"),
        (lambda g: g.generate("hi", references=[None], max_new_tokens=2), TypeError, "reference 0"),
        (lambda g: g.generate([1, True], max_new_tokens=2), TypeError, "integers"),
    ],
)
def test_the_generator_refuses_input_it_used_to_coerce(lc_tiny_generator: Any, call: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        call(lc_tiny_generator)
    assert lc_tiny_generator.generate([1, 2, 3], max_new_tokens=2).token_ids  # still usable


def test_a_schema_nested_500_deep_is_a_constraint_error() -> None:
    from ragspec.engine.constraints import Constraint, ConstraintError

    deep: dict[str, Any] = {"type": "string"}
    for _ in range(500):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ConstraintError):
        Constraint.json_schema(deep)
    with pytest.raises(ConstraintError):
        Constraint.json_schema("[" * 100_000)
