"""Probes: text that is not UTF-8 reaching ``ragspec ask`` and ``ragspec chat``, and a failing question in chat.

The commands run as subprocesses (``tests.security.fake_cli``: the real command line over a
collection that tokenizes questions like the real pipeline), so the bytes go through Python's
own argv and stdin decoding.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from apps import cli
from apps.collection import Event, Token
from tests.apps.fakes import fake_answer

ROOT = Path(__file__).resolve().parents[2]


def run_fake_cli(*args: str | bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "RAGSPEC_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "tests.security.fake_cli", *args], input=stdin, capture_output=True, timeout=50, env=env, cwd=ROOT
    )


@pytest.mark.timeout(180)
def test_ask_with_a_latin1_byte_in_argv_answers_with_a_replacement_character() -> None:
    r = run_fake_cli(b"ask", b"caf\xe9 ferry times?")  # "café" in latin-1: not UTF-8
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 0, err
    assert "Traceback" not in err and "TypeError" not in err
    assert "You asked: caf\N{REPLACEMENT CHARACTER} ferry times?" in r.stdout.decode("utf-8")


@pytest.mark.timeout(180)
def test_chat_survives_a_line_that_is_not_utf8_and_a_failing_question() -> None:
    r = run_fake_cli(b"chat", stdin=b"caf\xe9 ferry?\nboom\nwhen do ferries leave?\n")
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    assert r.returncode == 1, err  # the session went on, and the exit status says a question failed
    assert "You asked: caf\N{REPLACEMENT CHARACTER} ferry?" in out
    assert "You asked: when do ferries leave?" in out  # the session went on after both bad lines
    assert err == "ragspec: error: RuntimeError: the model failed on this question\n", err  # one line, no traceback


class FailingOnce:
    """Raises on its first question, answers the rest; records the history it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        self.calls.append((question, list(history)))
        if len(self.calls) == 1:
            yield Token("partial ", 0.1, 1, 1)
            raise ValueError("generation failed half-way")
        yield Token("fine", 0.1, 1, 1)
        yield fake_answer("fine")


@pytest.mark.timeout(180)
def test_chat_reports_a_failed_answer_in_one_line_and_keeps_no_half_turn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FailingOnce()
    monkeypatch.delenv("RAGSPEC_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_collection", lambda args: fake)
    monkeypatch.setattr("sys.stdin", io.StringIO("first?\nsecond?\n"))
    assert cli.main(["chat"]) == 1  # a question failed (the next one was still answered)
    captured = capsys.readouterr()
    assert captured.err == "ragspec: error: generation failed half-way\n"
    assert fake.calls == [("first?", []), ("second?", [])]  # the failed turn is not in the history
    assert "ragspec> fine" in captured.out
