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


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Every module of the package at ``root`` and the package's modules it imports: every
    import statement counts, at module level, in a function or under ``TYPE_CHECKING``. An
    import of ``a.b.c`` is an edge to ``a.b.c`` (or to ``a.b`` when ``c`` is a name in it), not
    to the packages above it."""
    mods: dict[str, tuple[Path, bool]] = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (p, is_pkg) in mods.items():
        pkg = m if is_pkg else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != m:
                        graph[m].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (``[a, b, ..., a]``), or [] if it has none."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def test_simserve_has_no_import_circles():
    graph = _module_graph(SIMSERVE)
    assert len(graph) > 100 and "simserve.sched.core" in graph["simserve.sched"]   # it scans
    circle = _cycle(graph)
    assert circle == [], "import circle: " + " -> ".join(circle)


def test_simserve_rooms_import_one_way():
    """Between rooms (a folder of simserve/, or a top-level module) imports flow one way too:
    the order docs/architecture.md draws."""
    rooms: dict[str, set[str]] = {}
    for m, targets in _module_graph(SIMSERVE).items():
        room = m.split(".")[1] if "." in m else m
        rooms.setdefault(room, set()).update(
            t.split(".")[1] for t in targets if "." in t and t.split(".")[1] != room)
    for targets in list(rooms.values()):
        for t in targets:
            rooms.setdefault(t, set())
    assert {"sched", "latency"} <= set(rooms) and "kv" in rooms["sched"]   # it scans
    circle = _cycle(rooms)
    assert circle == [], "rooms importing each other: " + " -> ".join(circle)


def test_the_circle_check_finds_hidden_circles(tmp_path):
    # a circle closed only by a function-level import, and one by a TYPE_CHECKING import
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    assert _cycle(_module_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .sub.c import X\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    assert _cycle(_module_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]


def test_architecture_draws_the_rooms_as_they_import():
    """docs/architecture.md's rows of rooms: each imports only rows above it, and every room
    is drawn."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("Imports flow one way", 1)[1].split("```")[1]
    rows = [line.split("   ")[0].strip().split(" · ") for line in block.strip().splitlines()]
    row = {room: i for i, names in enumerate(rows) for room in names}
    assert row["errors"] == 0 and row["__main__"] == len(rows) - 1         # the parse works
    wrong = set()
    for m, targets in _module_graph(SIMSERVE).items():
        a = m.split(".")[1] if "." in m else m
        for t in targets:
            b = t.split(".")[1] if "." in t else t
            if a != b and (a not in row or b not in row or row[b] >= row[a]):
                wrong.add(f"{a} imports {b}")
    assert sorted(wrong) == []
