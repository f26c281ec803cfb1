"""A real ``ragspec serve`` in a subprocess on a free loopback port, for the API tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """``python -m apps.cli serve ARGS`` on 127.0.0.1; its stderr goes to ``log``."""

    def __init__(self, *args: str, api_key: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = Path(tempfile.mkstemp(prefix="ragspec-serve-", suffix=".log")[1])
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        environment.pop("RAGSPEC_API_KEY", None)
        if api_key is not None:
            environment["RAGSPEC_API_KEY"] = api_key  # the environment, not argv: no key in the process list
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apps.cli", "serve", "--port", str(self.port), *args],
            cwd=ROOT,
            env=environment,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout_s: float = 300.0) -> ServeProcess:
        """Wait until ``GET /api/health`` answers (the model is loaded before the server listens)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ragspec serve exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/api/health", headers=self.headers, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"ragspec serve did not answer within {timeout_s:g} s:\n{self.output()[-3000:]}")

    def health(self) -> dict[str, object]:
        return httpx.get(f"{self.url}/api/health", headers=self.headers, timeout=10).json()

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log_file.close()
        self.log.unlink(missing_ok=True)
