"""The package layering: simserve never imports the profiler (the profiler imports simserve)."""

from __future__ import annotations

import ast
from pathlib import Path

SIMSERVE = Path(__file__).resolve().parents[2] / "simserve"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_simserve_never_imports_the_profiler():
    offenders = [str(p.relative_to(SIMSERVE)) for p in sorted(SIMSERVE.rglob("*.py"))
                 if "profiler" in _imported_roots(p)]
    assert offenders == []


def test_the_scan_sees_imports(tmp_path):
    # the check above would pass vacuously if the scan missed import statements
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom profiler.cli import main\ndef f():\n    import torch\n")
    assert _imported_roots(f) == {"os", "profiler", "torch"}


ROOT = SIMSERVE.parent


def _folders() -> tuple[set[str], set[str]]:
    """Top-level folders of the repository and folders of simserve/ (those holding files)."""
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
           and p.name not in ("runs", "build") and not p.name.startswith(".venv")
           and any(p.rglob("*.*")) and not p.name.endswith(".egg-info")}
    inner = {p.name for p in SIMSERVE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return top, inner


def test_readme_layout_names_every_folder():
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    top, inner = _folders()
    assert {"simserve", "tests", "docs", "benchmarks", "profiler"} <= top  # the scan works
    missing = sorted(f"{name}/" for name in top | inner if f"{name}/" not in layout)
    assert missing == []


def test_architecture_table_names_every_package_and_module():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    _, inner = _folders()
    modules = {p.name for p in SIMSERVE.glob("*.py") if p.name not in ("__init__.py",
                                                                         "__main__.py")}
    assert "config.py" in modules and "sched" in inner                   # the scan works
    missing = sorted([f"`{d}/`" for d in inner if f"`{d}/`" not in doc]
                     + [f"`{m}`" for m in modules if f"`{m}`" not in doc])
    assert missing == []
