"""Token-aware chunking with stable chunk ids and start offsets for citations."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import lru_cache

from langchain_core.documents import Document
from langchain_text_splitters import RecursiveCharacterTextSplitter

__all__ = ["chunk_id", "default_token_length", "split_documents"]

# Paragraphs, then lines, then sentences, then words: a chunk breaks at the largest unit that fits.
_SEPARATORS = ["\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ", ""]


@lru_cache(maxsize=1)
def _default_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer

    from retrievers.embeddings import default_model_path

    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()  # the bundled tokenizer.json pads every input to 128 tokens
    tokenizer.no_truncation()
    return tokenizer


def default_token_length(text: str) -> int:
    """Number of word-piece tokens of `text` for the default embedding model (no special tokens)."""
    return len(_default_tokenizer().encode(text, add_special_tokens=False).ids)


def chunk_id(source: str, page: object, content: str, occurrence: int = 0) -> str:
    """Stable id of a chunk: a hash of its source, page, content and which repeat of that content it is."""
    key = json.dumps([source, page, content, occurrence], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def split_documents(
    documents: Sequence[Document],
    chunk_size: int = 256,
    chunk_overlap: int = 32,
    length_function: Callable[[str], int] | None = None,
) -> list[Document]:
    """Split documents into overlapping chunks measured in tokens.

    Args:
        documents: Documents from `load_documents` (or any with a ``source`` in metadata).
        chunk_size: Largest chunk, in tokens of the default embedding model (its
            ``max_seq_length`` is 256, so longer chunks would be truncated when embedded).
        chunk_overlap: Tokens shared by consecutive chunks of one document.
        length_function: Counts tokens for another embedding model; default
            `default_token_length`.

    Returns:
        Chunks in document order. Each has ``id`` (see `chunk_id`) and the metadata of its
        document plus ``chunk_id`` (= id), ``chunk_index`` (0-based within its document)
        and ``start_index``: the character offset of the chunk in the document's
        ``page_content`` (for .txt/.md files, the offset in the file's decoded text).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise ValueError(f"chunk_overlap must be in [0, chunk_size), got {chunk_overlap} for chunk_size {chunk_size}")
    splitter = RecursiveCharacterTextSplitter(
        separators=_SEPARATORS,
        keep_separator="end",
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        length_function=length_function or default_token_length,
    )
    chunks: list[Document] = []
    for document in documents:
        source = str(document.metadata.get("source", ""))
        page = document.metadata.get("page")
        seen: dict[str, int] = {}
        text = document.page_content
        prev_start, prev_end = -1, 0
        for index, piece in enumerate(splitter.split_text(text)):
            start = _locate(text, piece, prev_start, prev_end)
            prev_start, prev_end = start, start + len(piece)
            occurrence = seen.get(piece, 0)
            seen[piece] = occurrence + 1
            cid = chunk_id(source, page, piece, occurrence)
            metadata = {**document.metadata, "chunk_id": cid, "chunk_index": index, "start_index": start}
            chunks.append(Document(id=cid, page_content=piece, metadata=metadata))
    return chunks



def _locate(text: str, piece: str, prev_start: int, prev_end: int) -> int:
    """Offset of `piece`, the chunk after one at [prev_start, prev_end).

    Chunks are substrings of the text in order: each starts after the previous one's start
    and, unless whitespace was dropped between them, no later than its end. In repetitive
    text the piece can match several places: right after the previous chunk (and any
    whitespace) is preferred, then the latest match in that window.
    """
    after_gap = prev_end
    while after_gap < len(text) and text[after_gap].isspace():
        after_gap += 1
    if text.startswith(piece, after_gap):
        return after_gap
    start = text.rfind(piece, prev_start + 1, prev_end + len(piece))
    if start < 0:
        start = text.find(piece, prev_end)
    return start if start >= 0 else text.find(piece)
