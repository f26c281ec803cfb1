"""`VllmServer.stop` ends vLLM's whole process tree on every exit path (issue 30, item 4).

vLLM's API server starts an EngineCore process, which starts the workers; all three stay in the
process group the server leads. A stand-in ``vllm`` package (an HTTP server answering ``/health``
that starts a child, which starts a grandchild) reproduces that shape in a second, so each path
is tested here without vLLM: the server killed, the app stopped by SIGTERM or SIGINT, the app
crashing, a child that ignores SIGTERM. ``tests/apps/test_vllm_engine.py`` checks the same with
real vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragspec.backends.vllm.server import PYTHON_ENV, VllmServer, group_members
from tests.ragspec.backends.vllm.processes import children, gone

pytestmark = pytest.mark.timeout(120)

_API_SERVER = '''
import http.server, json, signal, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
grandchild = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN if STUBBORN else signal.SIG_DFL); time.sleep(600)"
engine = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " + repr(grandchild) + "]); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", engine])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def fake_vllm(folder: Path, *, stubborn: bool = False) -> Path:
    """A Python whose ``vllm`` is the stand-in; its grandchild ignores SIGTERM when `stubborn`."""
    package = folder / "fake" / "vllm"
    (package / "entrypoints" / "openai").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.32.0'\n")
    (package / "entrypoints" / "__init__.py").write_text("")
    (package / "entrypoints" / "openai" / "__init__.py").write_text("")
    (package / "entrypoints" / "openai" / "api_server.py").write_text(_API_SERVER.replace("STUBBORN", str(stubborn)))
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={folder / "fake"}:$PYTHONPATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def tree(group: int, expected: int = 3, wait_s: float = 20.0) -> list[int]:
    """The group's processes once the server, its child and its grandchild all run."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = group_members(group)
        if len(members) >= expected:
            return members
        time.sleep(0.1)
    raise AssertionError(f"the stand-in vLLM started {group_members(group)}, not {expected} processes")


def test_stop_ends_the_engine_and_workers_after_the_server_itself_was_killed(tmp_path: Path, model: Path) -> None:
    server = VllmServer(model, python=fake_vllm(tmp_path), log=tmp_path / "vllm.log").start()
    assert server.process is not None
    group = server.process.pid
    pids = tree(group)
    os.kill(group, signal.SIGKILL)
    server.process.wait()
    assert not gone(pids)  # the child and grandchild outlive the server, as vLLM's EngineCore and Worker did
    server.stop()
    assert gone(pids) and group_members(group) == []


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path, model: Path) -> None:
    server = VllmServer(model, python=fake_vllm(tmp_path, stubborn=True), log=tmp_path / "vllm.log").start()
    assert server.process is not None
    group = server.process.pid
    pids = tree(group)
    started = time.monotonic()
    server.stop(timeout_s=1.0)
    assert gone(pids) and group_members(group) == [] and time.monotonic() - started < 15


def _serve(tmp_path: Path, python: Path, model: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``ragspec serve --engine vllm`` on the stand-in; the app and the vLLM server's pid once it serves."""
    from ragspec.backends.vllm.server import free_port

    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "apps.cli", "serve", "--engine", "vllm", "--model", str(model), "--port", str(free_port())]
    env = {**os.environ, PYTHON_ENV: str(python)}
    with log.open("wb") as out:
        app = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[4])
    deadline = time.monotonic() + 90
    while "ragspec web app on" not in log.read_text() and time.monotonic() < deadline:
        assert app.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    servers = children(app.pid)
    assert len(servers) == 1, (servers, log.read_text()[-2000:])
    return app, servers[0]


@pytest.mark.parametrize("how", ["SIGTERM to the app", "SIGINT to the app", "SIGKILL to vLLM"])
def test_serve_engine_vllm_leaves_no_vllm_process_on_any_exit(how: str, tmp_path: Path, model: Path) -> None:
    app, server = _serve(tmp_path, fake_vllm(tmp_path), model)
    try:
        pids = tree(server)
        target, sig = {"SIGTERM to the app": (app.pid, signal.SIGTERM), "SIGINT to the app": (app.pid, signal.SIGINT),
                       "SIGKILL to vLLM": (server, signal.SIGKILL)}[how]
        os.kill(target, sig)
        status = app.wait(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert gone(pids) and group_members(server) == [], (tmp_path / "serve.log").read_text()[-2000:]
    if how == "SIGKILL to vLLM":
        assert status == 1 and "vLLM exited with status -9 while serving" in (tmp_path / "serve.log").read_text()


def test_serve_engine_vllm_leaves_no_vllm_process_when_the_app_crashes(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from apps.cli import main

    started: list[tuple[int, list[int]]] = []  # (the group, its processes)
    real_start = VllmServer.start

    def start(self: VllmServer) -> VllmServer:
        real_start(self)
        assert self.process is not None
        started.append((self.process.pid, tree(self.process.pid)))
        return self

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the app crashed")

    monkeypatch.setenv(PYTHON_ENV, str(fake_vllm(tmp_path)))
    monkeypatch.setattr(VllmServer, "start", start)
    monkeypatch.setattr("apps.web.server.serve", crash)
    monkeypatch.setattr("ragspec.remote.RemoteModel", lambda *a, **k: object())
    assert main(["serve", "--engine", "vllm", "--model", str(model)]) == 1
    assert "ragspec: error: RuntimeError: the app crashed" in capsys.readouterr().err
    group, pids = started[0]
    assert gone(pids) and group_members(group) == []
