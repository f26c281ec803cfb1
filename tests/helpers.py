"""Small helpers shared by test files of several packages: a folder of notes, work run in threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path


def write_notes(folder: Path, count: int, text: str = "The ferry number {i} leaves at {hour} in the morning.",
                name: str = "note{i}.md") -> Path:  # fmt: skip
    """``count`` Markdown notes in ``folder`` (made if missing): ``# Note {i}`` over ``text``, with
    ``{i}`` and ``{hour}`` (``i + 6``) filled in, in files named ``name``. Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / name.format(i=i)).write_text(f"# Note {i}\n\n{text.format(i=i, hour=i + 6)}\n")
    return folder


def run_in_threads(*works: Callable[[], None], timeout: float = 240) -> list[BaseException]:
    """Run each of ``works`` in its own thread, all at once, and wait for them (up to ``timeout`` s each):
    what they raised, and a ``TimeoutError`` for each thread still running."""
    errors: list[BaseException] = []

    def guarded(work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(work,)) for work in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return errors + [TimeoutError(f"{t.name} still runs after {timeout} s") for t in threads if t.is_alive()]
