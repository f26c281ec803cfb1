"""Chunking: token budget (never over the embedding model's limit), start offsets, overlap, stable ids, metadata, headers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

import pytest

from retrievers import (
    HEADER_KEY,
    chunk_header,
    chunk_id,
    contextual_text,
    default_max_tokens,
    default_token_length,
    split_documents,
)

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


# --- contextual headers and the embedding model's limit -------------------------------------------

PIECES = ["lighthouse", "keeper", "unbelievably", "antidisestablishmentarianism", "42", "3.14", "x",
          "naïve", "café", "東京", "🙂", "—", "(", ")", ",", ".", ";", "a-b", "`code`", "| 3 |"]


def embedded_length(chunk: Document) -> int:
    """Word pieces the default model reads for a chunk: its contextual text plus [CLS] and [SEP]."""
    from retrievers.chunking import _default_tokenizer

    return len(_default_tokenizer().encode(contextual_text(chunk), add_special_tokens=True).ids)


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(PIECES), min_size=1, max_size=700),
    breaks=st.lists(st.sampled_from([" ", " ", " ", "\n", "\n\n", ""]), min_size=1, max_size=700),
    title=st.text(alphabet=st.sampled_from(list("Tidepool guide: écrit 東 ")), max_size=200),
    size=st.sampled_from([8, 17, 64, 128, 256]),
)
def test_no_chunk_is_truncated_by_the_default_model(words: list[str], breaks: list[str], title: str, size: int) -> None:
    text = "".join(w + breaks[i % len(breaks)] for i, w in enumerate(words))
    if not text.strip():
        return
    doc = Document(page_content=text, metadata={"source": "guide.md", "title": title})
    chunks = split_documents([doc], chunk_size=size, chunk_overlap=size // 8)
    covered = [False] * len(text)
    for chunk in chunks:
        assert embedded_length(chunk) <= min(size, default_max_tokens())  # header + text + specials
        start = chunk.metadata["start_index"]
        assert text[start : start + len(chunk.page_content)] == chunk.page_content  # page_content is the text itself
        covered[start : start + len(chunk.page_content)] = [True] * len(chunk.page_content)
        header = chunk.metadata.get(HEADER_KEY, "")
        assert default_token_length(header + "\n\n") <= size // 4 if header else True
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())  # nothing is left out


def test_a_full_size_chunk_fits_the_model_with_its_header_and_special_tokens() -> None:
    doc = Document(page_content=long_text(3000, paragraph=10**6), metadata={"source": "notes/ledgerline-recovery-note.txt"})
    chunks = split_documents([doc])  # the defaults: 256 tokens, the model's max_seq_length
    assert default_max_tokens() == 256
    lengths = [embedded_length(c) for c in chunks]
    assert max(lengths) <= 256 and max(lengths) >= 240  # full, and not one word piece over
    with pytest.raises(ValueError, match="exceeds the 256 tokens"):
        split_documents([doc], chunk_size=257, chunk_overlap=0)
    assert len(split_documents([doc], chunk_size=512, chunk_overlap=0, length_function=len)) > 1  # another model's count


def test_header_is_in_the_metadata_and_embedded_text_not_in_page_content() -> None:
    md = Document(page_content="Setting `trust_mtime = false` helps on network drives.", metadata={"source": "d/tidepool.md", "title": "tidepool: a user guide"})
    txt = Document(page_content="Every change is appended to the log first.", metadata={"source": "d/ledgerline-recovery_note.txt"})
    (a,) = split_documents([md])
    (b,) = split_documents([txt])
    assert a.page_content == md.page_content and b.page_content == txt.page_content
    assert a.metadata[HEADER_KEY] == chunk_header(md) == "tidepool: a user guide"
    assert b.metadata[HEADER_KEY] == "ledgerline recovery note"  # no title: the file name in words
    assert contextual_text(a) == "tidepool: a user guide\n\n" + md.page_content
    (plain,) = split_documents([md], headers=False)
    assert HEADER_KEY not in plain.metadata and contextual_text(plain) == md.page_content
    assert plain.id == a.id  # the header does not change the chunk's identity
    untitled = Document(page_content="text", metadata={})
    assert chunk_header(untitled) == "" and HEADER_KEY not in split_documents([untitled])[0].metadata


def test_a_long_title_is_shortened_to_a_quarter_of_the_chunk() -> None:
    doc = Document(page_content=long_text(400), metadata={"source": "s", "title": "word " * 100})
    chunks = split_documents([doc], chunk_size=64, chunk_overlap=8)
    header = chunks[0].metadata[HEADER_KEY]
    assert header.startswith("word word") and default_token_length(header + "\n\n") <= 16
    assert all(embedded_length(c) <= 64 for c in chunks)


def test_chunks_fit_even_when_lengths_do_not_add_up() -> None:
    """The splitter adds up the lengths of the parts it merges; a count that is more than that sum
    (here: 4 extra for any inner space) must still be respected, by splitting again."""

    def count(text: str) -> int:
        return len(text) + (4 if " " in text.strip() else 0)

    text = "ab cd ef gh ij kl mn op qr st uv wx yz " * 5
    chunks = split_documents([Document(page_content=text, metadata={"source": "s"})], chunk_size=12, chunk_overlap=0, length_function=count)
    assert all(count(contextual_text(c)) <= 12 for c in chunks)
    assert "".join(c.page_content for c in chunks).replace(" ", "") == text.replace(" ", "")
