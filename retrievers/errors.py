"""Exceptions raised by the retrievers package; each message says how to fix the problem."""

from __future__ import annotations


class RetrieverError(Exception):
    """Base class of every error raised by `retrievers`."""


class FileSkippedError(RetrieverError):
    """A file could not be ingested (the reasons `load_file` gives); raised by the streaming readers."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"skipped {path}: {reason}")
        self.path = path
        self.reason = reason


class NothingToIndexError(RetrieverError):
    """The given files and folders hold no text to index; the message lists the files skipped and why."""


class EmbeddingModelError(RetrieverError):
    """An embedding or reranking model could not be loaded (offline) or used."""


class DimensionMismatchError(RetrieverError, ValueError):
    """Vectors of one dimension were given to an index built for another."""


class IndexSaveError(RetrieverError):
    """A vector store could not be written to disk; the previous save is left intact."""


class IndexLockedError(IndexSaveError):
    """Another process (or thread) is writing the same index folder and did not finish in time."""


class IndexLoadError(RetrieverError):
    """A saved vector store could not be loaded."""


class IndexNotFoundError(IndexLoadError, FileNotFoundError):
    """There is no saved index in the given directory."""


class IndexCorruptError(IndexLoadError):
    """The saved index is damaged: unreadable, truncated or inconsistent."""


class IndexVersionError(IndexLoadError):
    """The index was written by a newer (or unknown) on-disk format version."""


class IndexMismatchError(IndexLoadError):
    """The index was built with another embedding model or dimension than the one given."""


class FilterError(RetrieverError, ValueError):
    """A metadata filter with an unknown operator or a malformed condition; the message says which."""
