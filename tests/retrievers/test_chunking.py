"""Chunking: token budget, start offsets, overlap, stable ids, metadata."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

import pytest

from retrievers import chunk_id, default_token_length, split_documents

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def long_text(n_words: int, sentence: int = 12, paragraph: int = 60) -> str:
    out = []
    for i in range(n_words):
        word = WORDS[(i * 7) % len(WORDS)] + str(i % 13)
        out.append(word)
        if i % paragraph == paragraph - 1:
            out.append(".\n\n")
        elif i % sentence == sentence - 1:
            out.append(". ")
        else:
            out.append(" ")
    return "".join(out).strip()


def test_chunks_respect_token_budget_and_point_back_into_the_text() -> None:
    doc = Document(page_content=long_text(1500), metadata={"source": "s.txt", "title": "T"})
    chunks = split_documents([doc], chunk_size=64, chunk_overlap=16)
    assert len(chunks) > 10
    for i, chunk in enumerate(chunks):
        assert default_token_length(chunk.page_content) <= 64
        start = chunk.metadata["start_index"]
        assert doc.page_content[start : start + len(chunk.page_content)] == chunk.page_content
        assert chunk.metadata["chunk_index"] == i
        assert chunk.metadata["source"] == "s.txt" and chunk.metadata["title"] == "T"
        assert chunk.id == chunk.metadata["chunk_id"]
    starts = [c.metadata["start_index"] for c in chunks]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


def test_consecutive_chunks_overlap_when_requested() -> None:
    doc = Document(page_content=" ".join(f"w{i}" for i in range(800)), metadata={"source": "s"})
    with_overlap = split_documents([doc], chunk_size=50, chunk_overlap=20, length_function=lambda t: len(t.split()))
    without = split_documents([doc], chunk_size=50, chunk_overlap=0, length_function=lambda t: len(t.split()))
    for a, b in zip(with_overlap, with_overlap[1:]):
        assert b.metadata["start_index"] < a.metadata["start_index"] + len(a.page_content)
    for a, b in zip(without, without[1:]):
        assert b.metadata["start_index"] >= a.metadata["start_index"] + len(a.page_content)
    assert len(with_overlap) > len(without)


def test_ids_are_stable_and_distinguish_source_page_and_repeats() -> None:
    repeated = "Same paragraph here.\n\n" * 3
    docs = [
        Document(page_content=repeated, metadata={"source": "a.pdf", "page": 1}),
        Document(page_content=repeated, metadata={"source": "a.pdf", "page": 2}),
        Document(page_content=repeated, metadata={"source": "b.txt"}),
    ]
    len_fn = lambda t: len(t.split())  # noqa: E731
    first = split_documents(docs, chunk_size=4, chunk_overlap=0, length_function=len_fn)
    second = split_documents(docs, chunk_size=4, chunk_overlap=0, length_function=len_fn)
    assert [c.id for c in first] == [c.id for c in second]
    assert len({c.id for c in first}) == len(first) == 9
    assert first[0].id == chunk_id("a.pdf", 1, "Same paragraph here.", 0)
    assert first[0].metadata["page"] == 1 and "page" not in first[-1].metadata


def test_input_documents_are_not_mutated() -> None:
    doc = Document(page_content=long_text(300), metadata={"source": "s"})
    split_documents([doc], chunk_size=32, chunk_overlap=4)
    assert doc.metadata == {"source": "s"} and doc.id is None


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_invalid_sizes_are_rejected(size: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="chunk_"):
        split_documents([Document(page_content="x")], chunk_size=size, chunk_overlap=overlap)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab .\n,")), min_size=1, max_size=400),
    size=st.integers(min_value=5, max_value=60),
    overlap_frac=st.floats(min_value=0.0, max_value=0.9),
)
def test_offsets_exact_and_every_non_space_character_covered(text: str, size: int, overlap_frac: float) -> None:
    overlap = int(size * overlap_frac)
    chunks = split_documents([Document(page_content=text, metadata={"source": "h"})], size, overlap, length_function=len)
    covered = [False] * len(text)
    for c in chunks:
        start = c.metadata["start_index"]
        assert text[start : start + len(c.page_content)] == c.page_content
        assert len(c.page_content) <= size
        for i in range(start, start + len(c.page_content)):
            covered[i] = True
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())
