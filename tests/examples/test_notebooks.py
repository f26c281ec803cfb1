"""Every example notebook runs top to bottom on the embedded defaults, in a fresh kernel.

The notebooks are stored without outputs; this also checks that they stay that way.
"""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear its outputs"


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
