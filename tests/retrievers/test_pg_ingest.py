"""`sync_collection` on a real PostgreSQL: the same records and report as `sync_index` (FAISS) on the same files,
the manifest and BM25 statistics always consistent, ingests at once, an ingest that dies mid-way, hostile names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from retrievers.ingest import ChunkingSettings, sync_index

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")

from retrievers.pg_ingest import sync_collection  # noqa: E402
from retrievers.pg_store import PgVectorStore  # noqa: E402
from tests.helpers import run_in_threads, write_notes  # noqa: E402

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
CHUNKING = ChunkingSettings(chunk_size=60, chunk_overlap=8, length_function=len)


class Counting(DeterministicFakeEmbedding):
    """Fake vectors; counts texts embedded, can sleep per call and fail at a given call."""

    calls: int = 0
    texts: int = 0
    delay_s: float = 0.0
    fail_at: int = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail_at and self.calls == self.fail_at:
            raise RuntimeError("embedding service went away")
        time.sleep(self.delay_s)
        self.texts += len(texts)
        return super().embed_documents(texts)


def write_corpus(root: Path) -> Path:
    docs = root / "docs"
    docs.mkdir()
    shared = "The harbour ferry leaves at noon.\n\nTickets are sold on board."
    (docs / "a.md").write_text(f"# Ferries\n\n{shared}\n\nWinter timetable: two boats a day.\n")
    (docs / "b.txt").write_text(f"{shared}\n\nRefunds within 14 days of purchase.\n")
    (docs / "c.md").write_text("# Keys\n\nRotate the signing key every 90 days.\n\nRestore snapshots from the journal.\n")
    (docs / "it's \"odd\"; DROP TABLE--.md").write_text("# Odd name\n\nA file whose name is SQL.\n")
    return docs


def records(store: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    return {str(d.id): (d.page_content, d.metadata) for d in store.documents()}


def check_consistent(store: PgVectorStore) -> None:
    """The manifest, the chunks and the BM25 statistics agree, as a fresh computation says."""
    t = f"_{store.collection_id}"
    with psycopg.connect(store.url) as conn:
        q = lambda s, *a: conn.execute(s.replace("_ID", t), a).fetchall()  # noqa: E731
        held = {key: sorted(p for (p,) in q("SELECT path FROM ragspec_refs_ID WHERE key = %s", key)) for (key,) in q("SELECT DISTINCT key FROM ragspec_refs_ID")}
        chunks = {row[0]: row[1] for row in q("SELECT id, metadata FROM ragspec_chunks_ID")}
        assert set(chunks) == set(held), "a chunk no file holds, or a held key without a chunk"
        for key, metadata in chunks.items():
            assert metadata["sources"] == held[key] and metadata["source"] == held[key][0]
        assert dict(q("SELECT lexeme, df FROM ragspec_terms_ID")) == dict(
            q("SELECT u.lexeme, count(*) FROM ragspec_chunks_ID c, unnest(c.tsv) u GROUP BY u.lexeme")
        )
        stats = q("SELECT chunk_count, total_length FROM ragspec_collections WHERE id = %s", store.collection_id)[0]
        assert tuple(stats) == tuple(q("SELECT count(*), coalesce(sum(length), 0) FROM ragspec_chunks_ID")[0])
        assert set(p for (p,) in q("SELECT path FROM ragspec_files_ID")) >= set(p for ps in held.values() for p in ps)


def test_same_records_and_report_as_the_faiss_sync(tmp_path: Path, pg_url: str) -> None:
    docs = write_corpus(tmp_path)
    faiss_emb, pg_emb = Counting(size=8), Counting(size=8)
    steps = [
        lambda: None,
        lambda: (docs / "a.md").write_text("# Ferries\n\nThe harbour ferry leaves at noon.\n\nNo winter boats.\n"),
        lambda: (docs / "b.txt").unlink(),  # the shared chunk's primary source moves to a.md
        lambda: (docs / "d.md").write_text("# Keys\n\nRotate the signing key every 90 days.\n"),
    ]
    store = None
    for step in steps:
        step()
        index, faiss_report = sync_index([docs], tmp_path / "idx", faiss_emb, chunking=CHUNKING)
        store, report = sync_collection([docs], pg_url, pg_emb, chunking=CHUNKING, store=store)
        assert records(store) == records(index)
        for field in ("new", "changed", "unchanged", "removed", "embedded", "reembedded", "reused", "duplicates",
                      "removed_chunks", "passages", "files"):  # fmt: skip
            assert getattr(report, field) == getattr(faiss_report, field), field
        assert pg_emb.texts == faiss_emb.texts
        check_consistent(store)
    assert store is not None
    name = str(docs / "it's \"odd\"; DROP TABLE--.md")
    assert [d.metadata["source"] for d in store.documents({"file_name": "it's \"odd\"; DROP TABLE--.md"})] == [name]
    again, report = sync_collection([docs], pg_url, pg_emb, chunking=CHUNKING, store=store)
    assert not report.saved and report.embedded == 0 and len(report.unchanged) == 4
    rebuilt = sync_collection([docs], pg_url, pg_emb, chunking=ChunkingSettings(chunk_size=40, chunk_overlap=4, length_function=len), store=store)[1]
    assert rebuilt.rebuilt is not None and "chunk_size 60 -> 40" in rebuilt.rebuilt and rebuilt.embedded > 0
    check_consistent(store)
    store.close()


def test_two_ingests_at_once_take_turns_and_agree(tmp_path: Path, pg_url: str) -> None:
    docs = write_notes(write_corpus(tmp_path), 6, "The ferry number {i} leaves at {hour}.\n\nShared closing line.", "n{i}.md")
    emb = Counting(size=8, delay_s=0.05)
    results: list[Any] = []

    def ingest() -> None:
        store, report = sync_collection([docs], pg_url, emb, chunking=CHUNKING)
        store.close()
        results.append(report)

    errors = run_in_threads(ingest, ingest)
    assert not errors, errors
    first, second = sorted(results, key=lambda r: len(r.new), reverse=True)
    assert len(first.new) == 10 and second.unchanged and not second.new and second.embedded == 0
    store = PgVectorStore(pg_url, emb)
    check_consistent(store)
    reference, _ = sync_index([docs], tmp_path / "idx", Counting(size=8), chunking=CHUNKING)
    assert records(store) == records(reference)
    store.close()


def test_an_ingest_that_fails_mid_way_leaves_the_store_as_before_that_file(tmp_path: Path, pg_url: str) -> None:
    docs = write_corpus(tmp_path)
    store, _ = sync_collection([docs], pg_url, Counting(size=8), chunking=CHUNKING)
    before = records(store)
    (docs / "a.md").write_text("# Ferries\n\nAll ferries are cancelled.\n")
    (docs / "c.md").write_text("# Keys\n\nKeys are never rotated.\n")
    failing = Counting(size=8, fail_at=2)  # the first changed file lands, the second one's embedding fails
    with pytest.raises(RuntimeError, match="went away"):
        sync_collection([docs], pg_url, failing, chunking=CHUNKING, store=store)
    check_consistent(store)
    after = records(store)
    changed = [k for k in set(before) | set(after) if before.get(k) != after.get(k)]
    assert changed and all(str(docs / "a.md") in (before.get(k) or after.get(k))[1]["sources"] for k in changed)
    assert "Keys are never rotated." not in " ".join(text for text, _ in after.values())
    finished = sync_collection([docs], pg_url, Counting(size=8), chunking=CHUNKING, store=store)[1]
    assert finished.changed == [str(docs / "c.md")]
    reference, _ = sync_index([docs], tmp_path / "idx", Counting(size=8), chunking=CHUNKING)
    assert records(store) == records(reference)
    check_consistent(store)
    store.close()


def test_a_killed_ingest_leaves_a_consistent_store_that_the_next_one_completes(tmp_path: Path, pg_url: str) -> None:
    docs = write_notes(write_corpus(tmp_path), 12, "The ferry number {i} leaves at {hour}.", "n{i:02d}.md")
    script = textwrap.dedent(f"""
        import sys, time
        from langchain_core.embeddings import DeterministicFakeEmbedding
        from retrievers.ingest import ChunkingSettings
        from retrievers.pg_ingest import sync_collection

        class Slow(DeterministicFakeEmbedding):
            def embed_documents(self, texts):
                print("embedding", flush=True)
                time.sleep(0.3)
                return super().embed_documents(texts)

        sync_collection([{str(docs)!r}], {pg_url!r}, Slow(size=8),
                        chunking=ChunkingSettings(chunk_size=60, chunk_overlap=8, length_function=len))
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert process.stdout is not None
    seen = 0
    for line in process.stdout:
        seen += line.startswith("embedding")
        if seen == 4:  # some files committed, one in flight
            break
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    store = PgVectorStore(pg_url, Counting(size=8), check_embeddings=False)  # the same vectors, another class name
    check_consistent(store)
    done = len(store.documents())
    assert 0 < done < 16
    report = sync_collection([docs], pg_url, Counting(size=8), chunking=CHUNKING, store=store)[1]
    assert report.unchanged and report.new  # what landed is kept, the rest is added
    reference, _ = sync_index([docs], tmp_path / "idx", Counting(size=8), chunking=CHUNKING)
    assert records(store) == records(reference)
    check_consistent(store)
    store.close()


def test_a_file_postgresql_cannot_hold_is_skipped_with_its_reason(tmp_path: Path, pg_url: str) -> None:
    import json

    docs = write_corpus(tmp_path)
    cell = {"cell_type": "markdown", "metadata": {}, "source": ["# Notes\n", "A NUL \u0000 inside a notebook cell."]}
    (docs / "nul.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (docs / "nul.txt").write_bytes(b"Text with a NUL \x00 byte inside it.\n")  # the loader refuses it as binary
    store, report = sync_collection([docs], pg_url, Counting(size=8), chunking=CHUNKING)
    reasons = {Path(s.path).name: s.reason for s in report.skipped}
    assert "NUL character, which PostgreSQL text cannot store" in reasons["nul.ipynb"] and "binary" in reasons["nul.txt"]
    assert {Path(d.metadata["source"]).name for d in store.documents()} == {"a.md", "b.txt", "c.md", "it's \"odd\"; DROP TABLE--.md"}
    assert len(report.new) == 4 and report.files == 4
    check_consistent(store)
    store.close()
