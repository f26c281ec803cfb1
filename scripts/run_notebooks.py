"""Execute the example notebooks top to bottom and store them with their outputs.

    python scripts/run_notebooks.py                      # all of examples/*.ipynb
    python scripts/run_notebooks.py examples/quickstart.ipynb

Each notebook runs in a fresh kernel in a scratch folder, as ``tests/examples/test_notebooks.py``
runs them. Before saving, machine-specific paths in the outputs (this checkout, the Python
installation, the home and temporary folders) are replaced by short placeholders, consecutive
printed pieces are joined into one output, per-cell timing metadata is dropped and cell ids are
kept, so a re-run changes only what the code printed.
A notebook whose run fails is left as it was.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 900


def _placeholders() -> list[tuple[str, str]]:
    """(path, placeholder) pairs, longest path first so that the most specific one wins."""
    pairs = [
        (str(ROOT), "<ragspec>"),
        (sysconfig.get_paths()["purelib"], "<site-packages>"),
        *[(p, "<site-packages>") for p in site.getsitepackages()],
        (sys.prefix, "<python>"),
        (sys.base_prefix, "<python>"),
        (tempfile.gettempdir(), "<tmp>"),
        (str(Path.home()), "~"),
    ]
    return sorted({p: h for p, h in pairs if p and p != "/"}.items(), key=lambda x: -len(x[0]))


def scrub(text: str, placeholders: list[tuple[str, str]]) -> str:
    for path, placeholder in placeholders:
        text = text.replace(path, placeholder)
    return text


def _scrub_output(output: dict, placeholders: list[tuple[str, str]]) -> None:
    if "text" in output:
        output["text"] = scrub(output["text"], placeholders)
    if "traceback" in output:
        output["traceback"] = [scrub(line, placeholders) for line in output["traceback"]]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith("json"):
            output["data"][mime] = scrub(value, placeholders) if isinstance(value, str) else value


def run(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="ragspec-notebook-") as scratch:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # Progress bars (model loading) and tqdm's notice that ipywidgets is missing say nothing
        # about ragspec and change on every run.
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("PYTHONWARNINGS", "ignore:IProgress not found")
        client = NotebookClient(
            notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
            coalesce_streams=True, resources={"metadata": {"path": scratch}},
        )
        client.execute()
    placeholders = [(scratch, "<scratch>"), *_placeholders()]
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            _scrub_output(output, placeholders)
    nbformat.validate(notebook)
    nbformat.write(notebook, path)
    print(f"ran {path.name}")


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "examples").glob("*.ipynb"))
    for path in paths:
        run(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
