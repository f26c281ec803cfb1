"""sync_index: incremental, deduplicated, streamed and atomic ingestion, against full rebuilds as the reference."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

import retrievers
from retrievers import (
    FaissVectorStore,
    HybridRetriever,
    IndexCorruptError,
    IndexVersionError,
    NothingToIndexError,
    SentenceTransformerEmbeddings,
    contextual_text,
    load_file,
    persistence,
    split_documents,
    sync_index,
)
from retrievers.catalog import CATALOG_VERSION, content_key
from retrievers.ingest import CHUNKER_REVISION, ChunkingSettings, SyncProgress, split_stream
from retrievers.loaders import file_digest, iter_text, markdown_title
from tests.retrievers.conftest import CORPUS_DIR, CountingEmbeddings

pytestmark = pytest.mark.timeout(120)


def words(text: str) -> int:
    """A fast token count for tests: whitespace-separated words."""
    return len(text.split())


CHUNKING = ChunkingSettings(chunk_size=40, chunk_overlap=6, length_function=words)
ARTICLES = sorted(CORPUS_DIR.iterdir())


def article(i: int) -> str:
    return ARTICLES[i % len(ARTICLES)].read_text(encoding="utf-8")


def make_folder(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def sync(folder: Path, index: Path, emb: CountingEmbeddings, chunking: ChunkingSettings = CHUNKING, **kwargs):  # type: ignore[no-untyped-def]
    emb.texts.clear()
    return sync_index(folder, index, emb, chunking=chunking, **kwargs)


def contents(store: FaissVectorStore) -> dict[str, tuple[str, str]]:
    """id -> (text, metadata as JSON): what must match between an incremental and a full build."""
    return {d.id: (d.page_content, json.dumps(d.metadata, sort_keys=True)) for d in store.documents() if d.id}


def embedded_chunks(emb: CountingEmbeddings, store: FaissVectorStore) -> list[str]:
    """The chunk texts behind what `emb` embedded, sorted: each record is embedded as its `contextual_text`
    (header and text). A text embedded that no record of `store` stands for raises KeyError."""
    behind = {contextual_text(d): d.page_content for d in store.documents()}
    return sorted(behind[t] for t in emb.texts)


def snapshot(index: Path) -> dict[str, bytes]:
    """Every file of an index folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(index.iterdir())}


def committed(index: Path) -> dict[str, bytes]:
    """The manifest and the data files it names (leftover temporary files do not count)."""
    manifest = json.loads((index / "manifest.json").read_bytes())
    names = ["manifest.json", *(entry["name"] for entry in manifest["files"].values())]
    return {name: (index / name).read_bytes() for name in names}


def distinct_chunks(path: Path, chunking: ChunkingSettings = CHUNKING) -> dict[str, str]:
    """Brute force: key -> text of the chunks of one file, from split_documents over the whole text."""
    (doc,) = load_file(path, warn=False).documents
    chunks = split_documents([doc], chunking.chunk_size, chunking.chunk_overlap, chunking.length_function)
    return {content_key(c.page_content): c.page_content for c in chunks}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "docs", {f"note{i}.md" if i % 2 else f"note{i}.txt": article(i) for i in range(4)})


# -- incremental -----------------------------------------------------------------------------------


def test_first_sync_embeds_each_distinct_chunk_once_and_records_the_files(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    expected: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        expected.update(distinct_chunks(path))
    assert embedded_chunks(counting_embeddings, store) == sorted(expected.values())
    assert set(contents(store)) == set(expected) and report.embedded == len(expected) == report.passages
    assert report.new == [str(p) for p in sorted(folder.iterdir())] and report.saved and report.rebuilt is None
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    section = manifest["ingest"]
    assert section["version"] == CATALOG_VERSION and section["settings"] == CHUNKING.fingerprint()
    for path in folder.iterdir():
        entry = section["files"][str(path)]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and entry["bytes"] == path.stat().st_size
    loaded = FaissVectorStore.load(tmp_path / "idx", counting_embeddings)
    assert loaded.catalog == store.catalog and contents(loaded) == contents(store)


def test_chunks_carry_their_file_name_and_an_older_index_gets_it_without_embedding(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    store, _ = sync(folder, tmp_path / "idx", counting_embeddings)
    for doc in store.documents():
        assert doc.metadata["file_name"] == Path(doc.metadata["source"]).name
    hits = store.similarity_search("the", k=100, filter={"file_name": {"$in": ["note0.txt", "note1.md"]}})
    assert hits and {d.metadata["file_name"] for d in hits} == {"note0.txt", "note1.md"}
    # an index written before file_name was recorded: the next sync adds it, embedding nothing
    old = [Document(d.page_content, id=d.id, metadata={k: v for k, v in d.metadata.items() if k != "file_name"})
           for d in store.documents()]  # fmt: skip
    store.update_documents(old)
    store.save(tmp_path / "idx")
    counting_embeddings.texts.clear()
    synced, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert counting_embeddings.texts == [] and report.saved and report.embedded == 0
    assert all(d.metadata["file_name"] == Path(d.metadata["source"]).name for d in synced.documents())
    assert not sync(folder, tmp_path / "idx", counting_embeddings)[1].saved  # and then nothing is left to do


def test_an_unchanged_folder_embeds_nothing_and_leaves_the_index_as_it_was(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    before = snapshot(tmp_path / "idx")
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "idx").iterdir()}
    _, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert counting_embeddings.texts == []
    assert report.unchanged == [str(p) for p in sorted(folder.iterdir())] and report.files_line() == "4 unchanged"
    assert not report.saved and report.embedded == report.chunks_read == 0
    assert snapshot(tmp_path / "idx") == before
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "idx").iterdir()} == mtimes


def test_an_unchanged_folder_never_loads_the_embedding_model(tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class DefaultModelLookalike(DeterministicFakeEmbedding):
        """Fake vectors recorded under the default model's name, as if built with it."""

        @property
        def model_id(self) -> str:
            return SentenceTransformerEmbeddings("default").model_id

    sync_index(folder, tmp_path / "idx", DefaultModelLookalike(size=8), chunking=CHUNKING)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the embedding model was used")

    for name in ("embed_documents", "embed_query", "client", "dimension"):
        monkeypatch.setattr(SentenceTransformerEmbeddings, name, property(no_model) if name in ("client", "dimension") else no_model)
    _, report = sync_index(folder, tmp_path / "idx", SentenceTransformerEmbeddings("default"), chunking=CHUNKING)
    assert report.rebuilt is None and not report.saved and len(report.unchanged) == 4


def test_a_changed_file_embeds_only_its_new_chunks(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    store, _ = sync(folder, tmp_path / "idx", counting_embeddings)
    old_keys = set(contents(store))
    changed = folder / "note1.md"
    changed.write_text(article(1) + "\n\nA new closing paragraph about the night shift and its ovens.\n", encoding="utf-8")
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    new_chunks = {k: t for k, t in distinct_chunks(changed).items() if k not in old_keys}
    assert new_chunks and embedded_chunks(counting_embeddings, store) == sorted(new_chunks.values())
    assert report.changed == [str(changed)] and len(report.unchanged) == 3 and report.files_line() == "1 changed, 3 unchanged"
    assert report.embedded == len(new_chunks) and report.reused == len(distinct_chunks(changed)) - len(new_chunks)
    assert all(store.get_by_ids([k])[0].metadata["source"] == str(changed) for k in new_chunks)


def test_a_deleted_file_loses_its_chunks(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    gone = folder / "note2.txt"
    its_keys = set(distinct_chunks(gone))
    gone.unlink()
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert counting_embeddings.texts == [] and report.removed == [str(gone)] and report.removed_chunks == len(its_keys)
    assert not its_keys & set(contents(store))
    assert all(str(gone) not in d.metadata["sources"] for d in store.documents())
    reloaded = FaissVectorStore.load(tmp_path / "idx", counting_embeddings)
    assert contents(reloaded) == contents(store) and str(gone) not in (reloaded.catalog.files if reloaded.catalog else {})
    hits = reloaded.similarity_search(article(2)[:200], k=len(reloaded))
    assert all(h.metadata["source"] != str(gone) for h in hits)


# -- deduplication ---------------------------------------------------------------------------------


def test_duplicates_are_embedded_once_kept_with_every_source_and_retrieved_once(
    tmp_path: Path, counting_embeddings: CountingEmbeddings
) -> None:
    shared = article(0)
    spaced = shared.replace(". ", ".   ")  # the same chunks after whitespace normalisation
    folder = make_folder(tmp_path / "docs", {"a.txt": shared, "b/copy.txt": spaced, "c.txt": article(3)})
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    a_keys = distinct_chunks(folder / "a.txt")
    assert a_keys.keys() == distinct_chunks(folder / "b" / "copy.txt").keys()
    assert len(counting_embeddings.texts) == len(set(counting_embeddings.texts)) == report.embedded
    assert report.embedded == len(a_keys | distinct_chunks(folder / "c.txt")) and report.duplicates == len(a_keys)
    both = sorted([str(folder / "a.txt"), str(folder / "b" / "copy.txt")])
    for key, text in a_keys.items():
        (doc,) = store.get_by_ids([key])
        assert doc.metadata["sources"] == both and doc.metadata["source"] == both[0]
        assert doc.page_content == text  # the primary source's own text and offsets
        assert shared[doc.metadata["start_index"] :].startswith(text)
    # retrieved once: dense, BM25 and hybrid see each text a single time
    keys = [content_key(d.page_content) for d in store.similarity_search(shared[:300], k=len(store))]
    assert len(keys) == len(set(keys)) == len(store)
    hybrid = HybridRetriever(vectorstore=store, k=len(store), fetch_k=len(store))
    assert len(hybrid.bm25.documents) == len(store)
    fused = [content_key(h.document.page_content) for h in hybrid.search(shared[:300])]
    assert len(fused) == len(set(fused))


@pytest.mark.parametrize("same_title", [True, False])
def test_removing_one_source_of_a_duplicate_keeps_the_chunk(
    tmp_path: Path, counting_embeddings: CountingEmbeddings, same_title: bool
) -> None:
    """The chunk stays with its other source. Its vector stays too when the header embedded with it (the
    first source's title) is the same; under another title it is embedded again, as a fresh build would."""
    body = article(2)
    a, z = ("a.md", "z.md") if same_title else ("a.txt", "z.txt")  # .txt files: their names are their titles
    head = "# Ledgerline notes\n\n" if same_title else ""
    folder = make_folder(tmp_path / "docs", {a: head + body, z: head + "Preface.\n\n" + body})
    sync(folder, tmp_path / "idx", counting_embeddings)
    a_keys = set(distinct_chunks(folder / a))
    shared = a_keys & set(distinct_chunks(folder / z))
    assert shared
    (folder / a).unlink()
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert report.removed == [str(folder / a)] and report.removed_chunks == len(a_keys - shared)
    z_text = (folder / z).read_text()
    kept = store.get_by_ids(sorted(shared))
    assert len(kept) == len(shared)
    for doc in kept:
        assert doc.metadata["sources"] == [str(folder / z)] and doc.metadata["source"] == str(folder / z)
        assert z_text[doc.metadata["start_index"] :].startswith(doc.page_content)  # offsets now point into z
    if same_title:
        assert counting_embeddings.texts == [] and report.reembedded == 0
    else:
        assert embedded_chunks(counting_embeddings, store) == sorted(d.page_content for d in kept)
        assert report.reembedded == report.embedded == len(shared)
    assert contents(store) == contents(sync(folder, tmp_path / "full", counting_embeddings)[0])


def test_when_the_primary_source_goes_the_record_takes_the_next_sources_own_text(
    tmp_path: Path, counting_embeddings: CountingEmbeddings
) -> None:
    """a.txt and b.txt hold the same chunks, b.txt with other spacing; a.txt is the primary source.
    When a.txt goes, each record holds b.txt's exact text and offsets, as a fresh build of b.txt would."""
    text = article(2)
    folder = make_folder(tmp_path / "docs", {"a.txt": text, "b.txt": re.sub(r"(?<=\w) (?=\w)", "  ", text)})
    store, _ = sync(folder, tmp_path / "idx", counting_embeddings)
    shared = {d.id for d in store.documents() if len(d.metadata["sources"]) == 2}
    assert shared and all(store.get_by_ids([k])[0].metadata["source"] == str(folder / "a.txt") for k in shared)
    (folder / "a.txt").unlink()
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    b_text = (folder / "b.txt").read_text()
    switched = store.get_by_ids(sorted(shared))
    assert len(switched) == len(shared) and any("  " in d.page_content for d in switched)
    assert embedded_chunks(counting_embeddings, store) == sorted(d.page_content for d in switched)  # embedded as b's
    for doc in switched:
        assert doc.metadata["sources"] == [str(folder / "b.txt")]
        assert b_text[doc.metadata["start_index"] :].startswith(doc.page_content)
    assert contents(store) == contents(sync(folder, tmp_path / "full", counting_embeddings)[0])


# -- incremental == full rebuild ---------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_incremental_updates_equal_a_full_rebuild(tmp_path: Path, counting_embeddings: CountingEmbeddings) -> None:
    """Random edits (new, changed, deleted, copied, whitespace variants); after each, the synced index
    must hold exactly what a sync into an empty folder builds, and its catalog must be the same."""
    rng = random.Random(7)
    folder = make_folder(tmp_path / "docs", {f"f{i}.txt": article(i) for i in range(3)})
    paragraphs = [p for i in range(len(ARTICLES)) for p in article(i).split("\n\n") if p.strip()]
    for step in range(12):
        files = sorted(folder.rglob("*.txt"))
        action = rng.choice(["new", "change", "delete", "copy", "respace"] if len(files) > 1 else ["new", "copy"])
        if action == "new":
            text = "\n\n".join(rng.sample(paragraphs, rng.randint(1, 8)))
            make_folder(folder, {f"sub{step % 2}/n{step}.txt": text})
        elif action == "change":
            target = rng.choice(files)
            parts = target.read_text().split("\n\n")
            parts.insert(rng.randint(0, len(parts)), rng.choice(paragraphs))
            target.write_text("\n\n".join(parts))
        elif action == "delete":
            rng.choice(files).unlink()
        elif action == "copy":
            shutil.copy(rng.choice(files), folder / f"copy{step}.txt")
        else:
            source = rng.choice(files)
            (folder / f"spaced{step}.txt").write_text(source.read_text().replace(" ", "  "))
        incremental, report = sync(folder, tmp_path / "idx", counting_embeddings)
        embedded = embedded_chunks(counting_embeddings, incremental)
        full, _ = sync(folder, tmp_path / f"full{step}", counting_embeddings)
        assert contents(incremental) == contents(full), f"step {step}: {action}"
        assert incremental.catalog == full.catalog
        assert len(embedded) == report.embedded and {content_key(t) for t in embedded} <= set(contents(full))
        reloaded = FaissVectorStore.load(tmp_path / "idx", counting_embeddings)
        query = rng.choice(paragraphs)[:120]
        assert [(d.id, round(s, 5)) for d, s in reloaded.similarity_search_with_score(query, k=5)] == [
            (d.id, round(s, 5)) for d, s in full.similarity_search_with_score(query, k=5)
        ]
        assert report.passages == len(full)


# -- full rebuilds, formats --------------------------------------------------------------------------


def test_changed_chunking_rebuilds_everything_and_says_why(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    smaller = ChunkingSettings(chunk_size=30, chunk_overlap=6, length_function=words)
    store, report = sync(folder, tmp_path / "idx", counting_embeddings, chunking=smaller)
    assert report.rebuilt == "the chunking settings changed (chunk_size 40 -> 30)"
    assert report.embedded == len(store) == len(counting_embeddings.texts) and report.saved
    full, _ = sync(folder, tmp_path / "full", counting_embeddings, chunking=smaller)
    assert contents(store) == contents(full) and store.catalog == full.catalog
    _, again = sync(folder, tmp_path / "idx", counting_embeddings, chunking=smaller)
    assert again.rebuilt is None and counting_embeddings.texts == []


def test_another_embedding_model_rebuilds_everything_and_says_why(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    other = CountingEmbeddings(size=16, texts=[])
    store, report = sync(folder, tmp_path / "idx", other)
    assert report.rebuilt is not None and report.rebuilt.startswith("the embedding model changed")
    assert "size=8" in report.rebuilt and "size=16" in report.rebuilt
    assert store.dimension == 16 and len(other.texts) == len(store)


def test_an_index_without_a_catalog_is_migrated_by_a_full_rebuild(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    # What FaissVectorStore.save and ragspec before incremental ingest wrote: format 1, no "ingest" section.
    old = FaissVectorStore(counting_embeddings)
    old.add_documents(split_documents(retrievers.load_documents(folder).documents, 40, 6, words))
    old.save(tmp_path / "idx")
    assert "ingest" not in json.loads((tmp_path / "idx" / "manifest.json").read_text())
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert report.rebuilt is not None and "no file catalog" in report.rebuilt
    full, _ = sync(folder, tmp_path / "full", counting_embeddings)
    assert contents(store) == contents(full)
    _, again = sync(folder, tmp_path / "idx", counting_embeddings)
    assert again.rebuilt is None and counting_embeddings.texts == []


def test_a_store_changed_outside_sync_is_rebuilt(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    store = FaissVectorStore.load(tmp_path / "idx", counting_embeddings)
    store.add_documents([Document(page_content="added by hand", metadata={"source": "elsewhere"})], ids=["hand"])
    store.save(tmp_path / "idx")
    rebuilt, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert report.rebuilt is not None and "changed outside sync_index (1 passage(s) not in its file catalog" in report.rebuilt
    assert "hand" not in rebuilt


@pytest.mark.parametrize("where", ["catalog", "format"])
def test_an_index_from_a_newer_ragspec_is_refused_and_left_alone(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings, where: str
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    manifest_path = tmp_path / "idx" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if where == "catalog":
        manifest["ingest"]["version"] = CATALOG_VERSION + 1
    else:
        manifest["format_version"] = persistence.FORMAT_VERSION + 1
    manifest_path.write_text(json.dumps(manifest))
    before = snapshot(tmp_path / "idx")
    (folder / "note0.txt").write_text("changed")
    with pytest.raises(IndexVersionError, match="newer"):
        sync(folder, tmp_path / "idx", counting_embeddings)
    assert snapshot(tmp_path / "idx") == before and counting_embeddings.texts == []
    if where == "catalog":  # searching does not need the catalog: a reader of this version still loads it
        assert len(FaissVectorStore.load(tmp_path / "idx", counting_embeddings)) > 0


def test_a_malformed_catalog_is_reported_as_corrupt(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    manifest_path = tmp_path / "idx" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["ingest"]["files"] = {"not-listed-in-the-docstore.txt": manifest["ingest"]["files"].popitem()[1]}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexCorruptError, match="malformed"):
        sync(folder, tmp_path / "idx", counting_embeddings)


# -- atomicity: errors and Ctrl-C ------------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_an_interruption_while_embedding_leaves_the_previous_index(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    before = snapshot(tmp_path / "idx")
    expected = contents(FaissVectorStore.load(tmp_path / "idx", counting_embeddings))
    (folder / "note0.txt").write_text(article(0) + "\n\nOne more paragraph.\n\n" + article(2))
    (folder / "note3.md").unlink()
    (folder / "new.txt").write_text(article(4))
    calls = 0

    def fail_on_second_batch(self: CountingEmbeddings, texts: list[str]) -> list[list[float]]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise error("interrupted")
        return DeterministicFakeEmbedding.embed_documents(self, texts)

    monkeypatch.setattr(CountingEmbeddings, "embed_documents", fail_on_second_batch)
    with pytest.raises(error):
        sync(folder, tmp_path / "idx", counting_embeddings, batch_size=3)
    assert calls == 2 and snapshot(tmp_path / "idx") == before
    assert contents(FaissVectorStore.load(tmp_path / "idx", counting_embeddings)) == expected
    monkeypatch.undo()
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert report.files_line() == "1 new, 1 changed, 2 unchanged, 1 removed"
    assert contents(store) == contents(sync(folder, tmp_path / "full", counting_embeddings)[0])


@pytest.mark.parametrize(
    ("target", "error"),
    [("_write_index", Boom), ("_write_index", KeyboardInterrupt), ("replace", KeyboardInterrupt), ("replace", OSError)],
)
def test_an_interruption_while_saving_leaves_the_previous_index(
    tmp_path: Path,
    folder: Path,
    counting_embeddings: CountingEmbeddings,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    error: type[BaseException],
) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    before = committed(tmp_path / "idx")
    expected = contents(FaissVectorStore.load(tmp_path / "idx", counting_embeddings))
    (folder / "note1.md").write_text(article(1) + "\n\nAnother paragraph, to be saved.\n")
    if target == "_write_index":

        def half_written(index: object, path: Path) -> None:
            path.write_bytes(b"half an index")
            raise error("interrupted")

        monkeypatch.setattr(persistence, "_write_index", half_written)
    else:
        real_replace = os.replace

        def refuse_manifest(src: object, dst: object) -> None:
            if str(dst).endswith("manifest.json"):
                raise error("interrupted")
            real_replace(src, dst)  # type: ignore[arg-type]

        monkeypatch.setattr(persistence.os, "replace", refuse_manifest)
    with pytest.raises((error, retrievers.IndexSaveError)):
        sync(folder, tmp_path / "idx", counting_embeddings)
    assert committed(tmp_path / "idx") == before
    assert contents(FaissVectorStore.load(tmp_path / "idx", counting_embeddings)) == expected
    monkeypatch.undo()
    _, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert report.changed == [str(folder / "note1.md")] and report.saved
    assert not [p for p in (tmp_path / "idx").iterdir() if p.name.startswith(".tmp-")]  # leftovers cleaned by the save


# -- inputs ------------------------------------------------------------------------------------------


def test_files_over_the_size_limit_are_skipped_with_a_reason_and_dropped(
    tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings
) -> None:
    big = folder / "note0.txt"
    big.write_text(article(0) * 3)
    sync(folder, tmp_path / "idx", counting_embeddings)
    limit = max(p.stat().st_size for p in folder.iterdir() if p != big)
    store, report = sync(folder, tmp_path / "idx", counting_embeddings, max_file_bytes=limit)
    assert [s.path for s in report.skipped] == [str(big)] and "too large" in report.skipped[0].reason
    assert report.removed == [str(big)] and all(d.metadata["source"] != str(big) for d in store.documents())


def test_nothing_to_index_is_an_error_that_leaves_the_index(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    sync(folder, tmp_path / "idx", counting_embeddings)
    before = snapshot(tmp_path / "idx")
    empty = make_folder(tmp_path / "empty", {"blank.txt": "  \n\n ", "bin.txt": "a\x00b"})
    with pytest.raises(NothingToIndexError, match="found no text to index") as info:
        sync(empty, tmp_path / "idx", counting_embeddings)
    assert "blank.txt: empty file" in str(info.value) and "bin.txt: binary file" in str(info.value)
    assert "was left as it was" in str(info.value) and snapshot(tmp_path / "idx") == before


def test_html_and_pdf_files_are_synced_too(tmp_path: Path, counting_embeddings: CountingEmbeddings, make_pdf) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "docs"
    shutil.copytree(CORPUS_DIR, folder)
    (folder / "r.pdf").write_bytes(make_pdf(["First page of the report", "Second page"], title="Report"))
    store, report = sync(folder, tmp_path / "idx", counting_embeddings)
    assert len(report.new) == 6 and not report.skipped
    pages = sorted(d.metadata["page"] for d in store.documents() if d.metadata["file_type"] == "pdf")
    assert pages == [1, 2]
    _, again = sync(folder, tmp_path / "idx", counting_embeddings)
    assert counting_embeddings.texts == [] and len(again.unchanged) == 6


def test_progress_counts_what_was_done(tmp_path: Path, folder: Path, counting_embeddings: CountingEmbeddings) -> None:
    seen: list[SyncProgress] = []
    _, report = sync(folder, tmp_path / "idx", counting_embeddings, progress=seen.append, batch_size=4)
    stages = [p.stage for p in seen]
    assert stages == sorted(stages, key=["scan", "chunk", "embed", "save"].index)
    last = {p.stage: p for p in seen}
    total = sum(p.stat().st_size for p in folder.iterdir())
    assert last["scan"].files_done == last["scan"].files_total == 4 and last["scan"].bytes_done == total
    assert last["chunk"].files_done == 4 and last["chunk"].bytes_done == last["chunk"].bytes_total == total
    assert last["chunk"].chunks_done == report.chunks_read
    assert last["embed"].chunks_done == last["embed"].chunks_total == report.embedded
    done = [p.chunks_done for p in seen if p.stage == "embed"]
    assert done == sorted(done) and done[1] == 4  # one update per batch
    assert last["embed"].eta_s == 0.0 and (last["embed"].rate or 0) > 0
    assert set(last["embed"].as_dict()) >= {"stage", "files_done", "chunks_done", "chunks_total", "rate", "eta_s"}


# -- streaming ----------------------------------------------------------------------------------------


def random_text(rng: random.Random) -> str:
    vocabulary = ["alpha", "beta.", "gamma\n", "delta", "eps,", "zeta?", "eta;"]
    paragraphs = [" ".join(rng.choice(vocabulary) for _ in range(rng.choice([1, 3, 8, 20, 60, 150]))) for _ in range(rng.randint(1, 40))]
    return "".join(p + rng.choice(["\n\n", "\n\n\n", "\n", " \n\n", "\n\n  ", "\n\n\n\n"]) for p in paragraphs)


@pytest.mark.parametrize("window", [257, 1000, 4099])
@pytest.mark.parametrize(("size", "overlap"), [(5, 1), (17, 4), (40, 0)])
def test_streamed_chunks_equal_whole_text_chunks(window: int, size: int, overlap: int) -> None:
    rng = random.Random(window * 100 + size)
    texts = [random_text(rng) for _ in range(8)] + ["\n\n".join(article(i) for i in range(3))]
    chunking = ChunkingSettings(chunk_size=size, chunk_overlap=overlap, window_chars=window, length_function=words)
    for text in texts:
        whole = split_documents([Document(page_content=text, metadata={"source": "s.txt"})], size, overlap, words)
        blocks, i = [], 0
        while i < len(text):
            step = rng.randint(1, 300)
            blocks.append(text[i : i + step])
            i += step
        streamed = list(split_stream(blocks, {"source": "s.txt"}, chunking))
        assert [(d.id, d.page_content, d.metadata) for d in streamed] == [(d.id, d.page_content, d.metadata) for d in whole]


@pytest.mark.parametrize("window", [1000, 4099])
def test_streamed_chunks_equal_whole_text_chunks_with_the_default_tokenizer(window: int) -> None:
    text = "\n\n".join(article(i) for i in range(len(ARTICLES)))
    whole = split_documents([Document(page_content=text, metadata={"source": "s.md", "title": "T"})])
    blocks = [text[i : i + 333] for i in range(0, len(text), 333)]
    streamed = list(split_stream(blocks, {"source": "s.md", "title": "T"}, ChunkingSettings(window_chars=window)))
    assert [(d.id, d.metadata) for d in streamed] == [(d.id, d.metadata) for d in whole]


def test_text_without_blank_lines_is_still_chunked_completely() -> None:
    text = " ".join(f"w{i}" for i in range(5000))  # no paragraph breaks at all: cut approximately
    chunks = list(split_stream([text], {"source": "s"}, ChunkingSettings(chunk_size=20, chunk_overlap=0, window_chars=64, length_function=words)))
    seen = [w for c in chunks for w in c.page_content.split()]
    assert set(seen) == set(text.split()) and all(words(c.page_content) <= 20 for c in chunks)
    assert all(text[c.metadata["start_index"] :].startswith(c.page_content) for c in chunks)


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 7, 4096])
def test_iter_text_reads_what_load_file_reads(tmp_path: Path, block_bytes: int) -> None:
    cases = {
        "crlf.txt": "one\r\ntwo\r\rthree\r\n".encode() * 5,
        "bom.md": "\ufeffintro\n\n# Ti\u00e9tle #\n\nbody \u00e9\u00e8 \U0001f600\n".encode(),
        "late.md": ("x " * 5000 + "\n\n# Late heading\n\ntext").encode(),
        "nohead.md": b"just text\n\n#no heading\n",
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        (doc,) = load_file(path, warn=False).documents
        digest = hashlib.sha256()
        blocks = list(iter_text(path, block_bytes=block_bytes, digest=digest))
        assert "".join(blocks) == doc.page_content and digest.hexdigest() == hashlib.sha256(data).hexdigest()
        if name.endswith(".md"):
            assert markdown_title(iter_text(path, block_bytes=block_bytes)) == doc.metadata.get("title")


@pytest.mark.parametrize(
    "data",
    [b"", b"  \n\t \n", b"\xc2\xa0\n", b"text\x00more", bytes(range(1, 256)) * 40, b"caf\xe9 au lait, " * 10, b"ok " * 5000 + b"\xff"],
)
def test_iter_text_skips_for_the_reasons_load_file_gives(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    (skipped,) = load_file(path, warn=False).skipped
    with pytest.raises(retrievers.FileSkippedError) as info:
        list(iter_text(path, block_bytes=1000))
    assert info.value.reason == skipped.reason and info.value.path == str(path)


def test_file_digest_refuses_what_the_loader_refuses(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 100)
    assert file_digest(path) == (hashlib.sha256(b"x" * 100).hexdigest(), 100)
    with pytest.raises(retrievers.FileSkippedError, match="too large"):
        file_digest(path, max_file_bytes=99)
    with pytest.raises(retrievers.FileSkippedError, match="not found"):
        file_digest(tmp_path / "missing.txt")


RSS_PROBE = textwrap.dedent(
    """
    import json, sys
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from retrievers.ingest import ChunkingSettings, sync_index

    def words(text):
        return len(text.split())

    def peak_kib():  # this process's peak RSS (ru_maxrss would count the parent's RSS at the fork)
        return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])

    emb = DeterministicFakeEmbedding(size=8)
    warm = sync_index(sys.argv[1], sys.argv[3], emb, chunking=ChunkingSettings(chunk_size=100, chunk_overlap=10, length_function=words))
    before = peak_kib()
    store, report = sync_index(sys.argv[2], sys.argv[4], emb, chunking=ChunkingSettings(chunk_size=100, chunk_overlap=10, length_function=words))
    print(json.dumps({"grew_kib": peak_kib() - before, "chunks": report.chunks_read, "embedded": report.embedded}))
    """
)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak RSS from /proc (Linux)")
def test_a_20_mb_file_is_ingested_in_bounded_memory(tmp_path: Path) -> None:
    """One article repeated to 20 MiB: read and chunked as a stream, and embedded once per distinct chunk.

    Measured in a fresh process: the peak RSS after warming up on a small file grows by less than
    the file's size (reading and splitting it whole takes several times its size).
    """
    text = article(2) + "\n\n"
    small = make_folder(tmp_path / "small", {"s.txt": text * 3})
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "big.txt", "w", encoding="utf-8") as f:
        for _ in range(20 * 2**20 // len(text) + 1):
            f.write(text)
    probe = tmp_path / "probe.py"
    probe.write_text(RSS_PROBE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, str(probe), str(small), str(big), str(tmp_path / "i1"), str(tmp_path / "i2")],
        capture_output=True, text=True, timeout=280, env=env, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["chunks"] > 10_000 and result["embedded"] < 100
    # Measured: about 10 MiB (the 1 MiB window's splits and chunks); reading the file whole, about 90 MiB.
    assert result["grew_kib"] < 24 * 1024, result


# Digest of how the bundled corpus (default settings) and a synthetic text (small chunks, every
# separator) are cut, per chunker revision. When this fails, chunking changed: bump
# retrievers.ingest.CHUNKER_REVISION (synced indexes then rebuild instead of mixing old and new
# chunks) and record the new digest under the new revision.
RECORDED_CUTS = {1: "7ab3c932df3a42120fb0c268101f27a4b5ed1a2bd9a19a22244230f6c2849bfb"}


def _cuts_digest() -> str:
    corpus = split_documents(retrievers.load_documents(CORPUS_DIR).documents)
    # Each unit longer than a chunk, so that every separator of the splitter cuts somewhere.
    words = iter(f"w{i % 97}" for i in range(100_000))
    part = lambda n: " ".join(next(words) for _ in range(n))  # noqa: E731
    clause = lambda: ", ".join(part(7) for _ in range(8))  # noqa: E731
    sentence = lambda end: "; ".join(clause() for _ in range(2)) + end  # noqa: E731
    line = lambda: " ".join(sentence(end) for end in ".?!")  # noqa: E731
    text = "\n\n".join("\n".join(line() for _ in range(2)) for _ in range(3)) + "\n\n" + part(120) + " " + "x" * 400
    synthetic = split_documents([Document(page_content=text, metadata={"source": "synthetic.txt", "title": "Synthetic"})],
                                chunk_size=48, chunk_overlap=8)
    rows = [[Path(c.metadata["source"]).name, c.metadata["start_index"], c.metadata.get(retrievers.HEADER_KEY), c.page_content]
            for c in [*corpus, *synthetic]]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def test_the_chunker_revision_names_how_text_is_cut() -> None:
    digest = _cuts_digest()
    assert RECORDED_CUTS.get(CHUNKER_REVISION) == digest, (
        f"chunking changed (digest {digest}) without a new CHUNKER_REVISION: bump it in retrievers/ingest.py "
        f"and record the digest in RECORDED_CUTS"
    )


def test_a_custom_token_counter_is_recorded_by_name_and_behaviour() -> None:
    import functools

    def count(text: str, per: int = 1) -> int:
        return len(text.split()) * per

    partial = ChunkingSettings(length_function=functools.partial(count, per=1)).fingerprint()["length"]
    assert "0x" not in partial and partial == ChunkingSettings(length_function=functools.partial(count, per=1)).fingerprint()["length"]
    words_a = ChunkingSettings(length_function=lambda t: len(t.split())).fingerprint()["length"]
    chars_b = ChunkingSettings(length_function=lambda t: len(t)).fingerprint()["length"]
    assert words_a != chars_b  # two lambdas with one name, told apart by what they count
