"""``--store postgresql://... --collection NAME`` on ``ragspec ingest``, ``ask``/``chat`` and ``serve``, on a real
PostgreSQL (the session's `pg_server`), with deterministic fake embeddings."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps import cli
from apps.collection import AppError, Collection
from tests.apps.fakes import counting_embeddings
from tests.helpers import write_notes

pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = write_notes(tmp_path / "docs", 4)
    (folder / "copy.md").write_text((folder / "note0.md").read_text())
    return folder


def ingest_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert cli.main(["ingest", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_ingest_into_a_collection_twice_says_what_it_did(
    docs: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    embedded = counting_embeddings(monkeypatch)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    where = f"collection 'notes' at {pg_url}"
    first = ingest_lines(capsys, str(docs), "--store", pg_url, "--collection", "notes", "--no-progress")
    assert first[:2] == ["Files: 5 new", "Passages: 4 embedded, 1 repeats stored once"] and len(embedded) == 4
    assert first[2].startswith(f"Indexed 4 passages from 5 file(s) into {where} in ")
    embedded.clear()
    again = ingest_lines(capsys, str(docs), "--store", pg_url, "--collection", "notes", "--no-progress")
    assert again[:2] == ["Files: 5 unchanged", "Passages: none embedded"] and embedded == []
    assert again[2].startswith(f"Nothing changed: {where} holds 4 passages from 5 file(s)")
    (docs / "note2.md").unlink()
    changed = ingest_lines(capsys, str(docs), "--store", pg_url, "--collection", "notes", "--no-progress")
    assert changed[:2] == ["Files: 4 unchanged, 1 removed", "Passages: 1 removed"]
    other = ingest_lines(capsys, str(docs / "note1.md"), "--store", pg_url, "--collection", "other", "--no-progress")
    assert other[2].startswith(f"Indexed 1 passages from 1 file(s) into collection 'other' at {pg_url}")


def test_ask_and_serve_open_the_collection_named(
    docs: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    counting_embeddings(monkeypatch)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    ingest_lines(capsys, str(docs), "--store", pg_url, "--collection", "notes", "--no-progress")
    args = cli.build_parser().parse_args(["ask", "When does ferry 3 leave?", "--store", pg_url, "--collection", "notes", "-k", "2"])
    collection = cli._collection(args)
    qa = collection.load()
    from retrievers.pg_retriever import PgHybridRetriever

    assert isinstance(qa.retriever, PgHybridRetriever) and qa.retriever.store.collection == "notes"
    found = qa.retriever.invoke("ferry number 3")
    assert len(found) == 2 and Path(found[0].metadata["source"]).name == "note3.md"
    assert found[0].metadata["start_index"] == 0 and found[0].metadata["sources"] == [str(docs / "note3.md")]

    import apps.web.server as web

    seen: dict[str, object] = {}
    monkeypatch.setattr(web, "serve", lambda host, port, **kw: seen.update(kw))
    assert cli.main(["serve", "--store", pg_url, "--collection", "notes"]) == 0
    preload = seen["preload"]
    assert isinstance(preload, Collection) and (preload.index_dir, preload.collection) == (pg_url, "notes")
    assert seen["state_url"] == pg_url  # sessions, conversations and uploads in the database too
    assert preload.documents() == sorted(str(p) for p in docs.iterdir())  # what the page lists: the manifest table
    assert "sessions, conversations and uploads are kept in the database" in capsys.readouterr().err

    missing = cli.build_parser().parse_args(["ask", "q", "--store", pg_url, "--collection", "nope"])
    with pytest.raises(AppError, match="nothing at collection 'nope'"):
        cli._collection(missing)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ingest", "docs", "--collection", "x"], "--collection names a set of documents in a database"),
        (["ask", "q", "--index", "elsewhere", "--store", "postgresql://u@h/db"], "--store and --index both name"),
        (["ask", "q", "--store", "postgresql://u:secret@127.0.0.1:1/db"], "cannot connect to the database"),
    ],
)
def test_store_usage_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ragspec: error: ") and message in err and len(err.splitlines()) == 1 and "secret" not in err


def test_a_follow_up_on_another_replica_is_laid_out_with_the_passages_first_shown(
    docs: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``Collection`` remembers of an answer (the passages it was first shown with) is in the database,
    so a second replica (a second ``Collection`` over the same collection) builds the follow-up's turn alike."""
    from tests.apps.fakes import fake_answer

    counting_embeddings(monkeypatch)
    monkeypatch.setattr(cli, "_quiet_model_loading", lambda: None)
    ingest_lines(capsys, str(docs), "--store", pg_url, "--collection", "notes", "--no-progress")
    first = Collection(pg_url, collection="notes", k=2)
    second = Collection(pg_url, collection="notes", k=2)
    answer = fake_answer("It leaves at 9 [1].", [("note3.md", "Note 3", "The ferry number 3 leaves at 9 in the morning.")],
                         question="When does ferry 3 leave?")  # fmt: skip
    assert second.shown("When does ferry 3 leave?", answer.text) == ()
    first.remember(answer)
    shown = second.shown(" When does ferry 3 leave? ", answer.text)
    assert [(d.page_content, d.metadata["source"]) for d in shown] == [
        ("The ferry number 3 leaves at 9 in the morning.", "note3.md")
    ]
    assert shown == first.shown("When does ferry 3 leave?", answer.text)
    assert second.shown("When does ferry 3 leave?", "another answer") == ()
