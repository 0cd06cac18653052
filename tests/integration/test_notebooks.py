"""The notebooks ship executed (their outputs read on a code host), and what they show is what
the code gives today: each is executed again here (nbclient, python3) and its text outputs —
tables, printed answers, reprs — must equal the saved ones. Figures must be there in both; their
PNG bytes depend on the machine's fonts, so they are not compared."""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

# nbformat, and nbclient which make_notebooks.py executes them with, are dev dependencies
# that `make test` installs: imported, never skipped
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
ADDRESS = re.compile(r" at 0x[0-9a-f]+")       # object reprs (a Styler's text/plain)


def generator():
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def texts(nb) -> list[list[str]]:
    """Per code cell, its outputs as text (images by kind only)."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        shown = []
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                shown.append(f"{o.name}: {o.text}")
            elif o.output_type == "error":
                shown.append(f"error: {o.ename}: {o.evalue}")
            else:
                data = o.get("data", {})
                for kind in ("text/html", "text/plain"):
                    if kind in data and "image/png" not in data:
                        shown.append(ADDRESS.sub("", data[kind]))
                        break
                if "image/png" in data:
                    shown.append("<image/png>")
        out.append(shown)
    return out


@pytest.mark.parametrize("name", ["compare_policies.ipynb", "capacity_planning.ipynb",
                                  "plan_deployment.ipynb"])
def test_notebook_outputs_are_current(name):
    saved = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert any(cell.get("outputs") for cell in saved.cells if cell.cell_type == "code"), \
        f"{name} is saved without outputs; run notebooks/make_notebooks.py"
    fresh = copy.deepcopy(saved)
    for cell in fresh.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    generator().execute(fresh, NOTEBOOKS)     # raises CellExecutionError on any error
    assert texts(fresh) == texts(saved), f"{name}: outputs changed; run make_notebooks.py"
    assert any("<image/png>" in shown for shown in texts(fresh)), f"{name} showed no figures"
    assert not any(o.output_type == "error" for c in fresh.cells if c.cell_type == "code"
                   for o in c.outputs)


def test_notebooks_match_their_generator():
    module = generator()
    for name, cells in module.NOTEBOOKS.items():
        built = module.build(copy.deepcopy(cells), name)
        saved = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert [c.source for c in built.cells] == [c.source for c in saved.cells], \
            f"{name} differs from make_notebooks.py; run it to regenerate"
        assert [c.id for c in built.cells] == [c.id for c in saved.cells]
