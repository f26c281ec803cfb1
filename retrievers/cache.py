"""ragspec's cache folder (``$RAGSPEC_CACHE_DIR`` or ``~/.cache/ragspec``) and how an entry in it is
published: built in a temporary sibling, then renamed into place, so a reader never sees half an
entry and two processes building the same one both end with a complete one. Converted models
(``ragspec.backends.models``) and exported embedding models (``retrievers.embeddings``) are such entries."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "RAGSPEC_CACHE_DIR"


def cache_root() -> Path:
    """``$RAGSPEC_CACHE_DIR``, or ``~/.cache/ragspec``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "ragspec"


def publish_folder(target: Path, marker: str, build: Callable[[Path], None]) -> None:
    """Make ``target`` by ``build(folder)`` in a temporary sibling that is then renamed into place.

    ``build`` writes the file ``marker`` last: its presence marks a complete entry. When another
    process completes ``target`` first, its entry is kept (it may be loading it) and ours dropped;
    an incomplete ``target`` (an older crash) is replaced.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished entry is an ordinary cache directory
    try:
        build(tmp)
        if (target / marker).is_file():
            return
        if target.exists():
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / marker).is_file():  # not another process finishing the same entry first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
