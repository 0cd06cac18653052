"""Execute the notebooks, so an API change that breaks them fails here (nbclient, python3)."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


@pytest.mark.parametrize("name", ["compare_policies.ipynb", "capacity_planning.ipynb"])
def test_notebook_runs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
        f"{name} is committed with outputs; regenerate it with notebooks/make_notebooks.py"
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()      # raises CellExecutionError, with the failing cell, on any error
    images = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert images, f"{name} showed no figures"


def test_notebooks_match_their_generator(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, cells in module.NOTEBOOKS.items():
        module.write(cells, name, tmp_path)
        assert (tmp_path / name).read_text() == (NOTEBOOKS / name).read_text(), \
            f"{name} differs from make_notebooks.py; run it to regenerate"
