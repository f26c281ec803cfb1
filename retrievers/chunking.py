"""Token-aware chunking with stable chunk ids, start offsets for citations and contextual headers.

What a chunk guarantees about the embedding model's limit: with the default length function,
the text the model is given for a chunk, `contextual_text` (its header, a blank line and its
text) plus the model's two special tokens, is at most ``chunk_size`` word pieces, and
``chunk_size`` may not exceed the model's ``max_seq_length`` (256 for all-MiniLM-L6-v2). So
the embedding never truncates a chunk, and since the chunks together cover every non-space
character of the document, no text is left out of the index.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from langchain_core.documents import Document

from retrievers.extras import needs

__all__ = [
    "HEADER_KEY",
    "chunk_header",
    "chunk_id",
    "contextual_text",
    "default_max_tokens",
    "default_token_length",
    "split_documents",
]

#: Metadata key holding a chunk's contextual header (its document's title).
HEADER_KEY = "chunk_header"
_HEADER_SEP = "\n\n"

# Paragraphs, then lines, then sentences, then words: a chunk breaks at the largest unit that fits.
_SEPARATORS = ["\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ", ""]


@lru_cache(maxsize=1)
def _default_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer

    from retrievers.default_model import default_model_path

    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()  # the bundled tokenizer.json pads every input to 128 tokens
    tokenizer.no_truncation()
    return tokenizer


def default_token_length(text: str) -> int:
    """Number of word-piece tokens of `text` for the default embedding model (no special tokens)."""
    return len(_default_tokenizer().encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=1)
def _default_special_tokens() -> int:
    """Tokens the default model's tokenizer adds to every input ([CLS] and [SEP]: 2)."""
    return len(_default_tokenizer().encode("", add_special_tokens=True).ids)


@lru_cache(maxsize=1)
def default_max_tokens() -> int:
    """The default embedding model's ``max_seq_length``: the most word pieces it reads, special tokens included."""
    from retrievers.default_model import default_model_path

    config = json.loads((default_model_path() / "sentence_bert_config.json").read_text(encoding="utf-8"))
    return int(config["max_seq_length"])


def chunk_header(document: Document) -> str:
    """The contextual header of `document`'s chunks: its title, else its file name in words.

    ("ledgerline-recovery-note.txt" becomes "ledgerline recovery note".) Empty when the
    document has neither.
    """
    title = document.metadata.get("title")
    if isinstance(title, str) and title.strip():
        return " ".join(title.split())
    stem = Path(str(document.metadata.get("source", ""))).stem
    return " ".join(stem.replace("_", " ").replace("-", " ").split())


def contextual_text(document: Document) -> str:
    """What is embedded and BM25-indexed for a chunk: its header, a blank line, its text.

    The header comes from the chunk's metadata (`HEADER_KEY`, set by `split_documents`), so
    ``page_content``, which is what a user is shown and cited, stays the document's own text.
    """
    header = document.metadata.get(HEADER_KEY)
    return f"{header}{_HEADER_SEP}{document.page_content}" if header else document.page_content


def chunk_id(source: str, page: object, content: str, occurrence: int = 0) -> str:
    """Stable id of a chunk: a hash of its source, page, content and which repeat of that content it is."""
    key = json.dumps([source, page, content, occurrence], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def split_documents(
    documents: Sequence[Document],
    chunk_size: int = 256,
    chunk_overlap: int = 32,
    length_function: Callable[[str], int] | None = None,
    *,
    headers: bool = True,
) -> list[Document]:
    """Split documents into overlapping chunks measured in tokens.

    Args:
        documents: Documents from `load_documents` (or any with a ``source`` in metadata).
        chunk_size: The most tokens the embedding model is given for one chunk: its
            `contextual_text` (header and text) plus, with the default length function, the
            model's two special tokens. With the default length function it may not exceed
            the default model's ``max_seq_length`` (256), so no chunk is ever truncated.
        chunk_overlap: Tokens shared by consecutive chunks of one document (at most half of
            what is left for the text once the header is counted).
        length_function: Counts tokens for another embedding model (then ``chunk_size``
            counts header and text only); default `default_token_length`.
        headers: Give each chunk its document's `chunk_header` (metadata `HEADER_KEY`),
            which retrievers prepend to the text they embed and index. A header is
            shortened to at most a quarter of ``chunk_size``.

    Returns:
        Chunks in document order. Each has ``id`` (see `chunk_id`) and the metadata of its
        document plus ``chunk_id`` (= id), ``chunk_index`` (0-based within its document),
        ``start_index``: the character offset of the chunk in the document's
        ``page_content`` (for .txt/.md files, the offset in the file's decoded text), and
        `HEADER_KEY` when it has a header. Together the chunks of a document cover all of
        its text but whitespace.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise ValueError(f"chunk_overlap must be in [0, chunk_size), got {chunk_overlap} for chunk_size {chunk_size}")
    with needs("retrieval", "split_documents"):
        from langchain_text_splitters import RecursiveCharacterTextSplitter
    count = length_function or default_token_length
    reserved = 0
    if length_function is None:
        reserved = _default_special_tokens()
        if chunk_size > default_max_tokens():
            raise ValueError(
                f"chunk_size {chunk_size} exceeds the {default_max_tokens()} tokens the default embedding model reads; "
                f"the rest of each chunk would be cut off when embedded: use chunk_size <= {default_max_tokens()}"
            )
        if chunk_size <= reserved + 1:
            raise ValueError(f"chunk_size must leave room for text besides the model's {reserved} special tokens")
    chunks: list[Document] = []
    for document in documents:
        header = _fit_header(chunk_header(document), count, chunk_size // 4) if headers else ""
        limit = chunk_size - reserved  # for header + separator + text
        budget = limit - (count(header + _HEADER_SEP) if header else 0)
        splitter = RecursiveCharacterTextSplitter(
            separators=_SEPARATORS,
            keep_separator="end",
            chunk_size=budget,
            chunk_overlap=min(chunk_overlap, budget // 2),
            length_function=count,
        )

        def fits(piece: str, header: str = header) -> bool:
            return count(f"{header}{_HEADER_SEP}{piece}" if header else piece) <= limit

        source = str(document.metadata.get("source", ""))
        page = document.metadata.get("page", document.metadata.get("part"))  # a PDF page, a slide, sheet or section
        seen: dict[str, int] = {}
        text = document.page_content
        prev_start, prev_end = -1, 0
        pieces = [p for piece in splitter.split_text(text) for p in _fit(piece, fits, budget, count)]
        for index, piece in enumerate(pieces):
            start = _locate(text, piece, prev_start, prev_end)
            prev_start, prev_end = start, start + len(piece)
            occurrence = seen.get(piece, 0)
            seen[piece] = occurrence + 1
            cid = chunk_id(source, page, piece, occurrence)
            metadata = {**document.metadata, "chunk_id": cid, "chunk_index": index, "start_index": start}
            if header:
                metadata[HEADER_KEY] = header
            chunks.append(Document(id=cid, page_content=piece, metadata=metadata))
    return chunks


def _fit_header(header: str, count: Callable[[str], int], limit: int) -> str:
    """`header` with words dropped from its end until it and its separator take at most `limit` tokens."""
    words = header.split()
    while words and count(" ".join(words) + _HEADER_SEP) > limit:
        words.pop()
    return " ".join(words)


def _fit(piece: str, fits: Callable[[str], bool], budget: int, count: Callable[[str], int]) -> list[str]:
    """`piece` split further until each part fits.

    The splitter adds up the lengths of the parts it merges, which for word pieces is not
    always the length of the merged text (a word cut inside, a separator's own tokens); a
    piece over the limit is split again with a smaller budget.
    """
    from langchain_text_splitters import RecursiveCharacterTextSplitter  # split_documents checked it is there

    if fits(piece):
        return [piece]
    for smaller in range(min(budget, count(piece)) - 1, 0, -1):
        splitter = RecursiveCharacterTextSplitter(
            separators=_SEPARATORS, keep_separator="end", chunk_size=smaller, chunk_overlap=0, length_function=count
        )
        parts = splitter.split_text(piece)
        if len(parts) > 1 or (parts and fits(parts[0])):
            return [p for part in parts for p in _fit(part, fits, smaller, count)]
    raise ValueError(f"cannot split {piece[:40]!r} into chunks that fit")  # pragma: no cover - one character always fits


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
