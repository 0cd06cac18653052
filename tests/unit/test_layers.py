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
