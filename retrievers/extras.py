"""ragspec's optional parts (pyproject.toml's extras) and the one error their absence raises.

``pip install ragspec`` installs what ``ChatRagSpec``, ``RagSpecLLM`` and ``DocumentQA`` over a
retriever of your own need; the rest is an extra (``pip install 'ragspec[retrieval]'``, ``[all]``
for everything). Whatever needs an extra checks for it where it is built or imported (a
constructor, a module of that extra, a CLI command) and raises `MissingExtraError` naming the
extra, never a bare ``ModuleNotFoundError`` deep inside a call.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

__all__ = ["EXTRA_MODULES", "MissingExtraError", "needs", "require"]

EXTRA_MODULES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    # FAISS, BM25, chunking and the bundled embedding model with its three runtimes.
    "retrieval": ("faiss", "bm25s", "langchain_text_splitters", "sentence_transformers", "onnx", "onnxruntime", "openvino"),
    # PDF, HTML; Office, OpenDocument and EPUB files, whose XML ragspec parses with defusedxml (retrievers/loaders.py).
    "formats": ("pypdf", "bs4", "defusedxml"),
    # The web app and the OpenAI-compatible API (apps/web).
    "server": ("fastapi", "uvicorn", "multipart", "markdown_it", "nh3"),
    "llamacpp": ("llama_cpp",),
    "ocr": ("pytesseract", "PIL"),
    "postgres": ("psycopg", "psycopg_pool", "pgvector"),
    # The planning and batch drafting kernels, compiled (ragspec/engine/jit.py; plain Python without it).
    "compiled": ("numba",),
})
"""The top-level modules each extra installs that ragspec imports (what a `require` checks)."""


class MissingExtraError(ImportError):
    """Something ragspec was asked to do needs an extra that is not installed; the message names it."""

    def __init__(self, extra: str, what: str, module: str, hint: str = "") -> None:
        super().__init__(
            f"{what} needs the {extra!r} extra ({module} is not installed): pip install 'ragspec[{extra}]'"
            + (f" ({hint})" if hint else ""),
            name=module,
        )
        self.extra = extra


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # None in sys.modules, or a module without a spec
        return True


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise `MissingExtraError` unless ``modules`` (default: all of ``extra``'s) can be imported.

    ``what`` names the thing asked for, as the user wrote it ("FaissVectorStore", "ragspec serve").
    Nothing is imported: this is cheap enough for a constructor.
    """
    for module in EXTRA_MODULES[extra] if modules is None else modules:
        if _missing(module):
            raise MissingExtraError(extra, what, module)


@contextmanager
def needs(extra: str, what: str, hint: str = "") -> Iterator[None]:
    """Around the imports of an extra's modules: a module of ``extra`` that is missing raises
    `MissingExtraError` (from the ``ModuleNotFoundError``); other import errors pass unchanged."""
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in EXTRA_MODULES[extra]:
            raise
        raise MissingExtraError(extra, what, top, hint) from e
