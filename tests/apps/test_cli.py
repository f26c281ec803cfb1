"""The ``ragspec`` command as a user runs it: help, exit codes, one-line errors, ingest/ask/chat."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from apps import cli
from apps.collection import Event, Token
from tests.apps.fakes import counting_embeddings, fake_answer
from tests.helpers import write_notes

DOC = """# Harbour notes

The ferry to Marrow Island leaves at seven in the morning and returns at six in the evening.
Tickets cost four pounds for adults and are sold on board.
"""


def run_cli(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "apps.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_console_script_is_declared() -> None:
    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "ragspec"]
    assert entry.value == "apps.cli:main"


@pytest.mark.parametrize("command", [[], ["ingest"], ["ask"], ["chat"], ["serve"]])
def test_help_on_every_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ragspec") and "--help" in out


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["ask"], ["ingest"], ["ingest", "x", "--chunk-size", "0"], ["serve", "--port", "70000"], ["ask", "q", "-k", "x"]],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["ask", "--temperatur", "0.5", "When?"], ["ask", "When?", "--bogus"],
                                     ["chat", "--bogus"], ["ingest", "docs", "--bogus"], ["serve", "--bogus"]])
def test_an_unknown_option_prints_its_commands_usage(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: ragspec {command[0]} ")  # the command's usage, not the top-level one
    flag = next(a for a in command if a.startswith("--"))
    assert err.rstrip().endswith(f"ragspec {command[0]}: error: unrecognized arguments: {flag} (see 'ragspec {command[0]} --help')")


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ragspec: error: ")
    return err


def test_runtime_errors_are_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ask", "what?", "--index", str(tmp_path / "none")]) == 1
    assert "no index at" in one_line_error(capsys)
    assert cli.main(["ingest", str(tmp_path / "missing.md"), "--index", str(tmp_path / "i")]) == 1
    assert "no such file or folder" in one_line_error(capsys)
    (tmp_path / "empty").mkdir()
    assert cli.main(["ingest", str(tmp_path / "empty"), "--index", str(tmp_path / "i"), "--no-progress"]) == 1
    assert "found no text" in one_line_error(capsys)
    assert cli.main(["ask", "  ", "--index", str(tmp_path)]) == 1
    assert "empty" in one_line_error(capsys)
    assert not (tmp_path / "i").exists()


class FakeCollection:
    """Echoes the question; records the history it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        self.calls.append((question, list(history)))
        yield Token("About ", 0.1, 1, 1)
        yield Token(question, 0.2, 2, 2)
        yield fake_answer(f"About {question}", [("notes.md", "Notes", "text")])


def test_chat_keeps_the_conversation_and_resets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeCollection()
    monkeypatch.setattr(cli, "_collection", lambda args: fake)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("ferries?\n\nprices?\n/reset\nagain?\n/exit\nnever asked\n"))
    assert cli.main(["chat"]) == 0
    assert fake.calls == [
        ("ferries?", []),
        ("prices?", [("ferries?", "About ferries?")]),
        ("again?", []),
    ]
    out = capsys.readouterr().out
    assert out.count("ragspec> About") == 3 and "[1] notes.md (Notes · char 0)" in out
    assert "3 tokens in 0.3 s · 10.0 tokens/s · acceptance 50% · 1.50 tokens/forward" in out


class FailingCollection(FakeCollection):
    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        if question == "broken?":
            raise RuntimeError("the model is gone")
        yield from super().stream(question, history)


def test_chat_exits_1_when_a_question_failed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_collection", lambda args: FailingCollection())
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("ferries?\nbroken?\nprices?\n"))
    assert cli.main(["chat"]) == 1  # the other questions are still answered
    captured = capsys.readouterr()
    assert captured.out.count("ragspec> About") == 2 and "the model is gone" in captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--generator-prompt", "text"], "--generator-prompt needs --generator-url"),
        (["serve", "--generator-context", "4096"], "--generator-context needs --generator-url"),
        (["serve", "--generator-url", "http://127.0.0.1:9/v1", "--backend", "llamacpp"], "--backend picks"),
        (["ingest", "docs", "--chunk-size", "64", "--chunk-overlap", "64"], "--chunk-overlap must be"),
    ],
)
def test_options_that_would_be_ignored_or_cannot_work_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("apps.web.server.serve", lambda *a, **k: pytest.fail("the server started"))
    assert cli.main(argv) == 1
    assert message in capsys.readouterr().err


def test_penalty_flags_reach_every_answer_and_bad_values_name_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "index").mkdir()
    built: list[dict[str, Any]] = []
    monkeypatch.setattr("apps.collection.Collection", lambda *a, **k: built.append(k) or FakeCollection())
    argv = ["ask", "ferries?", "--index", str(tmp_path / "index"), "--repeat-penalty", "1.3", "--repeat-last-n", "-1",
            "--frequency-penalty", "0.5"]  # fmt: skip
    assert cli.main(argv) == 0
    assert built[0]["options"] == {"repeat_penalty": 1.3, "repeat_last_n": -1, "frequency_penalty": 0.5}
    assert cli.main(["ask", "ferries?", "--index", str(tmp_path / "index"), "--presence-penalty", "3"]) == 1
    assert "--presence-penalty must be from -2 to 2" in capsys.readouterr().err


def test_small_chunks_get_a_smaller_default_overlap() -> None:
    assert [cli._chunk_overlap(size, None) for size in (256, 33, 32, 8, 1)] == [32, 32, 8, 2, 0]
    assert cli._chunk_overlap(64, 0) == 0


class UnsupportedCollection:
    """Answers with something no passage backs."""

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        yield Token("The capital of Peru is Lima.", 0.1, 7, 1)
        yield fake_answer("The capital of Peru is Lima.")


def test_an_unsupported_answer_is_said_to_be_unsupported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_collection", lambda args: UnsupportedCollection())
    assert cli.main(["ask", "What is the capital of Peru?"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The capital of Peru is Lima.\n")
    assert "Sources:" not in out and "I don't know: no passage backs this answer" in out
    monkeypatch.setattr(cli, "_collection", lambda args: FakeCollection())
    assert cli.main(["ask", "ferries?"]) == 0
    assert "I don't know" not in capsys.readouterr().out


class MercuryCollection:
    """Answers with a number no passage holds."""

    def stream(self, question: str, history: Sequence[tuple[str, str]] = ()) -> Iterator[Event]:
        yield Token("It boils at 4.1875 degrees.", 0.1, 7, 1)
        yield dataclasses.replace(fake_answer("It boils at 4.1875 degrees."), missing_facts=("4.1875",))


def test_ask_and_chat_say_which_facts_no_passage_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_collection", lambda args: MercuryCollection())
    assert cli.main(["ask", "What is the boiling point of mercury?"]) == 0
    assert "I don't know: no passage backs this answer (no passage holds 4.1875, which it states)" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the boiling point of mercury?\nAnd of water?\n"))
    assert cli.main(["chat"]) == 0
    assert capsys.readouterr().out.count("no passage holds 4.1875, which it states") == 2


@pytest.mark.integration
def test_ingest_then_ask_and_chat_with_the_default_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "harbour.md").write_text(DOC)
    (docs / "scan.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    index = tmp_path / "index"

    ingest = run_cli("ingest", str(docs), "--index", str(index))
    assert ingest.returncode == 0, ingest.stderr
    assert f"from 1 file(s) into {index}" in ingest.stdout
    assert "Skipped 1 file(s):" in ingest.stdout and "scan.pdf" in ingest.stdout
    assert "embedding" in ingest.stderr  # the progress bar
    # The index on disk opens and holds the passages ingest reported, from the one readable file.
    from retrievers import FaissVectorStore, default_embeddings

    passages = int(re.search(r"Indexed (\d+) passages", ingest.stdout).group(1))  # type: ignore[union-attr]
    store = FaissVectorStore.load(index, default_embeddings())
    found = store.similarity_search("When does the ferry to Marrow Island leave?", k=passages)
    assert passages >= 1 and len(store) == passages == len(found)
    assert {Path(d.metadata["source"]).name for d in found} == {"harbour.md"}
    assert "seven in the morning" in found[0].page_content

    ask = run_cli("ask", "When does the ferry to Marrow Island leave?", "--index", str(index), "--max-tokens", "16")
    assert ask.returncode == 0, ask.stderr
    answer, _, rest = ask.stdout.partition("\nSources:\n")
    assert answer.strip() and "[1] " in rest and "harbour.md" in rest
    assert "tokens/s" in rest and "acceptance" in rest and "tokens/forward" in rest

    # chat in this process (the subprocesses above already showed the console entry works)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("How much is a ticket?\nAnd for children?\n"))
    assert cli.main(["chat", "--index", str(index), "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    # Each turn says what backs it: its sources, or "I don't know" (8 tokens of "The ferry to Marrow Island
    # leaves at" do not answer "How much is a ticket?").
    assert out.count("ragspec> ") == 2 and out.count("Sources:") + out.count("I don't know:") == 2 and out.count("tokens/s") == 2


# -- incremental ingest ----------------------------------------------------------------------------


@pytest.fixture
def counted_ingest(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`ragspec ingest` with deterministic fake embeddings; the list collects every text embedded."""
    embedded = counting_embeddings(monkeypatch)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    return embedded


def ingest_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert cli.main(["ingest", *argv]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.timeout(120)
def test_ingest_twice_says_what_it_did(tmp_path: Path, counted_ingest: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    docs = write_notes(tmp_path / "docs", 4)
    (docs / "copy.md").write_text((docs / "note0.md").read_text())
    index = str(tmp_path / "idx")

    first = ingest_lines(capsys, str(docs), "--index", index, "--no-progress")
    assert first[0] == "Files: 5 new"
    assert first[1] == f"Passages: 4 embedded, 1 repeats stored once" and len(counted_ingest) == 4
    assert first[2].startswith(f"Indexed 4 passages from 5 file(s) into {index} in ")

    counted_ingest.clear()
    again = ingest_lines(capsys, str(docs), "--index", index, "--no-progress")
    assert again[:2] == ["Files: 5 unchanged", "Passages: none embedded"] and counted_ingest == []
    assert again[2].startswith(f"Nothing changed: {index} holds 4 passages from 5 file(s), left as it was")

    (docs / "note1.md").write_text("# Note 1\n\nThe ferry number 1 now leaves at noon.\n")
    (docs / "note2.md").unlink()
    (docs / "note9.md").write_text("# Note 9\n\nA new timetable for the winter.\n")
    changed = ingest_lines(capsys, str(docs), "--index", index, "--no-progress")
    assert changed[0] == "Files: 1 new, 1 changed, 3 unchanged, 1 removed"
    assert changed[1] == "Passages: 2 embedded, 2 removed" and len(counted_ingest) == 2
    assert changed[2].startswith(f"Indexed 4 passages from 5 file(s) into {index}")

    counted_ingest.clear()
    rebuilt = ingest_lines(capsys, str(docs), "--index", index, "--no-progress", "--chunk-size", "128")
    assert rebuilt[0] == "Rebuilt the whole index: the chunking settings changed (chunk_size 256 -> 128)."
    assert rebuilt[1] == "Files: 5 unchanged" and rebuilt[2].startswith("Passages: 4 embedded") and len(counted_ingest) == 4


@pytest.mark.timeout(120)
def test_ingest_shows_progress_and_skips_files_over_max_file_mb(
    tmp_path: Path, counted_ingest: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "small.md").write_text(DOC)
    (docs / "large.txt").write_text("Many words about harbours. " * 80_000)  # about 2 MiB
    index = str(tmp_path / "idx")
    assert cli.main(["ingest", str(docs), "--index", index, "--max-file-mb", "1"]) == 0
    captured = capsys.readouterr()
    assert "Skipped 1 file(s):" in captured.out
    assert f"{docs / 'large.txt'}: too large: 2.1 MiB is over the per-file limit of 1.0 MiB" in captured.out
    assert "checking" in captured.err and "reading" in captured.err and "embedding" in captured.err  # the bars
    assert "passage/s" in captured.err or "passages/s" in captured.err or "s/passage" in captured.err
    # unchanged: no reading, no embedding bar
    assert cli.main(["ingest", str(docs), "--index", index, "--max-file-mb", "1"]) == 0
    err = capsys.readouterr().err
    assert "checking" in err and "embedding" not in err and "reading" not in err


@pytest.mark.parametrize("value", ["0", "-1", "x", "inf"])
def test_max_file_mb_must_be_a_positive_size(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ingest", "x", "--max-file-mb", value]) == 2
    assert "--max-file-mb" in capsys.readouterr().err


def test_serve_runs_the_chosen_model_and_backend_for_the_page_and_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --model --backend`` reaches both the ``/v1`` routes and the web page's answers."""
    import apps.web.server as web
    from ragspec.registry import LocalModel

    seen: dict[str, object] = {}
    monkeypatch.setattr(web, "serve", lambda host, port, **kw: seen.update(kw))
    assert cli.main(["serve", "--model", "my.gguf", "--backend", "llamacpp"]) == 0
    generation = seen["generation"]
    assert isinstance(generation, LocalModel) and (generation.model, generation.backend) == ("my.gguf", "llamacpp")
    page = web.create_app(seen["config"], generation=generation).state.web.indexer  # type: ignore[arg-type]
    assert isinstance(page, web.FolderIndexer) and (page.model, page.model_backend) == ("my.gguf", "llamacpp")
    assert cli.main(["serve", "--backend", "onnx"]) == 2  # argparse names the choices


def test_serve_keeps_prompt_caches_per_client_unless_told_to_share(monkeypatch: pytest.MonkeyPatch) -> None:
    import apps.web.server as web

    seen: dict[str, object] = {}
    monkeypatch.setattr(web, "serve", lambda host, port, **kw: seen.update(kw))
    assert cli.main(["serve"]) == 0
    assert seen["config"].shared_prefix_cache is False  # type: ignore[attr-defined]
    assert cli.main(["serve", "--shared-prefix-cache"]) == 0
    assert seen["config"].shared_prefix_cache is True  # type: ignore[attr-defined]


def test_speed_line_shows_only_counted_figures() -> None:
    # vLLM behind RemoteGenerator counts no forwards; without per-request metrics nothing was reported drafted.
    from ragspec.engine.results import GenerationStats

    bare = cli._speed_line(GenerationStats(new_tokens=3, ttft_s=0.1, wall_s=0.3))
    assert bare == "3 tokens in 0.3 s · 10.0 tokens/s"
    drafted = cli._speed_line(GenerationStats(new_tokens=3, ttft_s=0.1, wall_s=0.3, drafted_tokens=2, accepted_tokens=1, acceptance_histogram=[1, 1]))
    assert drafted == "3 tokens in 0.3 s · 10.0 tokens/s · acceptance 50%"
