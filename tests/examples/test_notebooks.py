"""Every example notebook runs top to bottom on the embedded defaults, in a fresh kernel.

The notebooks are stored executed, so that a reader on a code host sees their results and the
speedup plot; ``scripts/run_notebooks.py`` refreshes them. This also checks that what is stored
reads well: every code cell ran once, in order, without errors, with stable cell ids and no
machine paths in its outputs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # per cell; the benchmark cell is the longest (about 40 s on an idle 2-core CPU)


def test_the_five_notebooks_are_there() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "langchain_chain.ipynb",
        "quickstart.ipynb",
        "retrieval_options.ipynb",
        "speedup_benchmark.ipynb",
        "structured_output.ipynb",
    ]


MACHINE_PATH = re.compile(r"(?<![\w<>.~-])(?:/(?:work|root|home|tmp|Users|opt|usr|var|private|srv|mnt)/|[A-Z]:\\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_executed_with_readable_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    ids = [cell.id for cell in notebook.cells]
    assert ids == [f"{path.stem.replace('_', '-')}-{i:02d}" for i in range(len(ids))], "stable, readable cell ids"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: run it top to bottom"
    outputs = [o for c in code for o in c.outputs]
    assert outputs and all(c.outputs for c in code), f"{path.name}: every code cell shows something"
    assert not [o for o in outputs if o.output_type == "error"]
    for o in outputs:
        text = o.get("text", "") + "".join(v for k, v in o.get("data", {}).items() if k.startswith("text/"))
        assert not MACHINE_PATH.search(text), f"{path.name}: a machine path in an output: {text[:200]!r}"
    assert not [c for c in code if "execution" in c.metadata], "no per-cell timing metadata"


def test_the_benchmark_notebook_shows_its_plot() -> None:
    notebook = nbformat.read(EXAMPLES / "speedup_benchmark.ipynb", as_version=4)
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1


@pytest.mark.integration
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # runs in a scratch folder
    )
    client.execute()  # raises CellExecutionError, with the failing cell and its traceback
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert printed.strip(), f"{path.name} printed nothing"
