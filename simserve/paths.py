"""File paths a scenario names, and the folders a run writes.

Two promises rest on this module:

* **A written scenario.yaml reruns from where it lies.** A scenario's relative paths (a trace,
  a lengths file, a profile, ``output_dir``) are relative to the scenario file's folder. The
  resolved copy written beside the results lies in another folder, so :func:`rebase_paths`
  rewrites each path relative to that folder (a path that names no file, such as a shipped
  profile's name, is left as written).
* **Nothing is written outside the output folder.** A compare variant's label becomes a folder
  name under ``--out``; :func:`folder_name` keeps it one plain folder (no ``/``, ``..``, NUL or
  other control characters), whatever the label says.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from simserve.errors import SimserveError

# Dotted fields of a scenario mapping that hold file paths, and whether the file must exist to
# be a path (a profile may be a shipped profile's name instead).
PATH_FIELDS: dict[str, bool] = {
    "workload.trace": True,
    "workload.lengths.path": True,
    "workload.prompt.path": True,
    "workload.output.path": True,
    "latency.path": True,
    "output_dir": False,
}

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@,-]+")


def folder_name(label: str) -> str:
    """``label`` as one visible folder name: runs of other characters become ``_``, leading
    dots are dropped (no ``..``, no hidden folder); never empty."""
    name = re.sub(r"^[._]+", "", _UNSAFE.sub("_", label)).rstrip("_")
    return name[:200] or "_"


def rebase_paths(raw: dict, base_dir: Path, out_dir: Path) -> dict:
    """A copy of the scenario mapping ``raw`` (paths relative to ``base_dir``) with its paths
    made relative to ``out_dir`` (absolute paths stay as they are). Cluster groups' latency
    sections are rebased too."""
    out = copy.deepcopy(raw)
    for node, key, must_exist in _path_slots(out):
        node[key] = rebase(node[key], base_dir, out_dir, must_exist)
    return out


def named_files(raw: dict, base_dir: Path) -> list[Path]:
    """The files the scenario mapping ``raw`` (paths relative to ``base_dir``) names: a trace,
    a lengths file, a profile (cluster groups' too)."""
    found = []
    for node, key, must_exist in _path_slots(raw):
        if must_exist:
            p = Path(node[key]).expanduser()
            found.append(p if p.is_absolute() else Path(base_dir) / p)
    return found


def _path_slots(raw: dict) -> list[tuple[dict, str, bool]]:
    """Where the scenario mapping ``raw`` holds a path (``PATH_FIELDS``, and each cluster
    group's ``latency.path``): (the mapping holding it, its key, whether the file must exist
    to be a path), for each such field set to a string."""
    fields = [(raw, dotted.split("."), must_exist) for dotted, must_exist in PATH_FIELDS.items()]
    groups = (raw.get("cluster") or {}).get("groups") if isinstance(raw.get("cluster"), dict) \
        else None
    fields += [(group, ["latency", "path"], True)
               for group in (groups if isinstance(groups, list) else [])]
    slots = []
    for node, parts, must_exist in fields:
        for part in parts[:-1]:
            if not isinstance(node, dict):
                break
            node = node.get(part)
        if isinstance(node, dict) and isinstance(node.get(parts[-1]), str):
            slots.append((node, parts[-1], must_exist))
    return slots


def rebase_value(field: str, value: Any, base_dir: Path, out_dir: Path) -> Any:
    """One ``FIELD: value`` (a sweep axis) rebased if ``field`` holds a path."""
    if field in PATH_FIELDS and isinstance(value, str):
        return rebase(value, base_dir, out_dir, PATH_FIELDS[field])
    return value


def rebase(path: str, base_dir: Path, out_dir: Path, must_exist: bool = True) -> str:
    """``path`` (relative to ``base_dir``) written relative to ``out_dir``."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return path
    src = Path(base_dir) / p
    if must_exist and not src.exists():
        return path
    try:
        return Path(os.path.relpath(src.resolve(), Path(out_dir).resolve())).as_posix()
    except ValueError:          # another drive (Windows): no relative path exists
        return str(src.resolve())


def default_out(base: Path, overrides: list[str] | tuple[str, ...] | None) -> Path:
    """The default output folder: ``base``, or beside it one named after the ``--set``
    overrides (``runs/quickstart+workload.rate=20``), so a run with overrides never lands in
    the folder of the run without them."""
    if not overrides:
        return Path(base)
    slug = folder_name("+".join(o.replace(" ", "") for o in overrides))
    if len(slug) > 80:           # long override lists: a prefix and a stable digest
        slug = slug[:60] + "-" + hashlib.sha1("\n".join(overrides).encode()).hexdigest()[:10]
    return Path(base).with_name(f"{Path(base).name}+{slug}")


REPORT_FIGURES = (".png", ".svg")


def clear_report(out: Path) -> list[str]:
    """Remove the report a folder holds (``report.html``, the figures under ``figures/``), as
    a rerun into the folder that does not write one must: a report of other results must not
    lie beside the new ones. Returns the names removed (nothing else is touched)."""
    out = Path(out)
    removed = []
    if (out / "report.html").is_file():
        (out / "report.html").unlink()
        removed.append("report.html")
    figures = out / "figures"
    if figures.is_dir() and not figures.is_symlink():   # (a link leads elsewhere: not ours)
        stale = [p for p in figures.iterdir() if p.is_file() and p.suffix in REPORT_FIGURES]
        for p in stale:
            p.unlink()
        if stale:
            removed.append(f"{len(stale)} figure(s)")
        if not any(figures.iterdir()):
            figures.rmdir()
    return removed


# The files each kind of output writes at the top of its folder (every kind also writes a
# report: ``clear_report``). A compare writes comparison.csv there and one run folder per
# variant; a replay writes a run's files and two of its own; capacity and plan both write a
# probes.csv.
_RUN_FILES = ("scenario.yaml", "summary.json",
              *(f"{name}.{ext}" for name in ("requests", "steps", "tokens")
                for ext in ("csv", "parquet")))
OUTPUT_FILES: dict[str, tuple[str, ...]] = {
    "run": _RUN_FILES,
    "replay": (*_RUN_FILES, "chunks.csv", "replay.json"),
    "compare": ("comparison.csv",),
    "sweep": ("sweep.csv", "sweep.parquet", "sweep.yaml"),
    "capacity": ("capacity.json", "probes.csv"),
    "plan": ("plan.json", "candidates.csv", "candidates.parquet", "probes.csv"),
}
_KIND_NAMES = {"run": "a run", "replay": "a replay", "compare": "a compare", "sweep": "a sweep",
               "capacity": "a capacity search", "plan": "a plan"}
_MARKERS = {"run": "summary.json", "replay": "replay.json", "compare": "comparison.csv",
            "sweep": "sweep.csv", "capacity": "capacity.json", "plan": "plan.json"}


def clear_other_outputs(out: Path, kind: str, variants: Iterable[str] = (),
                        inputs: Iterable[str | Path] = ()) -> str | None:
    """Before an output of ``kind`` (a key of ``OUTPUT_FILES``) is written into ``out``:
    remove what an output of another kind left there, and, for a compare, the variant folders
    of an earlier compare that this one (``variants``: its folder names) does not write.
    ``simserve report`` tells a folder's kind by the files it finds (a run's summary.json
    first), so another output's files left beside the new ones would be reported instead of
    them, or with them.

    Only what an earlier output wrote goes: the files of a kind whose mark (``_MARKERS``:
    summary.json, comparison.csv...) is there, and the variant folders its comparison.csv
    names (their run files and report; a folder goes only when nothing else is left in it).
    Never a file of ``inputs`` (the files the command read: a scenario.yaml the user keeps
    there), nor anything a symbolic link leads to; a file that cannot be removed is left.
    Returns a sentence saying what was replaced, or None."""
    out = Path(out)
    if not out.is_dir():
        return None
    found = [k for k, marker in _MARKERS.items() if k != kind and (out / marker).is_file()]
    keep = set(variants) if kind == "compare" else set()
    gone = [v for v in _old_variants(out) if v not in keep]
    read = {_resolved(p) for p in inputs}
    removed: list[str] = []
    for k in found:
        for name in OUTPUT_FILES[k]:
            path = out / name
            if name not in OUTPUT_FILES[kind] and name not in removed and path.is_file() \
                    and _resolved(path) not in read and _unlink(path):
                removed.append(name)
    gone = [name for name in gone if _clear_run_folder(out / name, read)]
    if not removed and not gone:
        return None
    what = " and ".join(_KIND_NAMES[k] for k in found) or "another compare"
    parts = [", ".join(removed)] if removed else []
    if gone:
        parts.append(f"{len(gone)} variant folder(s): {', '.join(gone[:3])}"
                     + (f" and {len(gone) - 3} more" if len(gone) > 3 else ""))
    return (f"replacing the results of {what} in {out}/ with {_KIND_NAMES[kind]}'s "
            f"(removed {'; '.join(parts)})")


def _resolved(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):     # (a loop of links)
        return Path(os.path.abspath(path))


def _unlink(path: Path) -> bool:
    """Remove the file ``path``; False if it cannot be (it is left)."""
    try:
        path.unlink()
    except OSError:
        return False
    return True


def _old_variants(out: Path) -> list[str]:
    """The variant folders an earlier compare wrote into ``out``: the folder of each label in
    its comparison.csv's first column that is a folder of ``out`` itself (not a link) holding
    a run. A comparison.csv that cannot be read names none."""
    try:
        with open(out / "comparison.csv", encoding="utf-8", newline="") as f:
            labels = [row[0] for row in csv.reader(f) if row][1:]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    names: list[str] = []
    for label in labels:
        name = folder_name(label)
        d = out / name
        if name not in names and d.is_dir() and not d.is_symlink() \
                and (d / "summary.json").is_file():
            names.append(name)
    return names


def _clear_run_folder(d: Path, read: set[Path]) -> bool:
    """Remove a run's files and report from the folder ``d`` (none of ``read``), and ``d`` if
    nothing else is left; True if any of them went."""
    gone = [name for name in OUTPUT_FILES["run"] if (d / name).is_file()
            and _resolved(d / name) not in read and _unlink(d / name)]
    try:
        gone += clear_report(d)
    except OSError:             # (a figure that cannot be removed: left)
        pass
    try:
        d.rmdir()
    except OSError:             # (something else lies there: kept, with the folder)
        pass
    return bool(gone)


def replaced_note(out: Path, new_scenario: str) -> str | None:
    """A sentence when ``out`` holds the results of a different scenario than ``new_scenario``
    (the scenario.yaml about to be written), naming up to three fields that differ; else None."""
    old_path = Path(out) / "scenario.yaml"
    if not old_path.is_file():
        return None
    try:
        old = yaml.safe_load(old_path.read_text(encoding="utf-8"))
        new = yaml.safe_load(new_scenario)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return f"replacing the files in {out}/ (its scenario.yaml is not one simserve wrote)"
    if old == new:
        return None
    a, b = _flat(old), _flat(new)
    changed = [f"{k}: {_short(a.get(k, '(unset)'))} → {_short(b.get(k, '(unset)'))}"
               for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    more = f", and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"replacing the results of a different scenario in {out}/ "
            f"({'; '.join(changed[:3])}{more})")


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 30 else text[:27] + "..."


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def check_out_dir(out: str | Path, writes: Iterable[str] = (),
                  inputs: Iterable[str | Path] = ()) -> None:
    """Before anything runs: a SimserveError (the one ``make_out_dir`` would raise after the
    run) when ``out`` cannot be created, so a long run, sweep or search is not lost to it: a
    folder above it is a file, or the first folder missing cannot be made there (no
    permission, a read-only or virtual file system: it is made and removed again). Nothing is
    left created. Also when a file the command writes there (``writes``: names relative to
    ``out``) is one it reads (``inputs``): ``keep_inputs``."""
    out = Path(out)
    keep_inputs(out, writes, inputs)
    missing = None                  # the highest folder of ``out`` that does not exist
    for at in (out, *out.parents):
        if at.is_dir():
            break
        if os.path.lexists(at):
            why = "File exists" if at == out else f"{at} is not a directory"
            raise SimserveError(f"{out}: cannot create output directory ({why})")
        missing = at
    if missing is None:
        return
    try:
        missing.mkdir()
    except FileExistsError:         # (made meanwhile by someone else: it can be)
        return
    except OSError as e:
        raise SimserveError(f"{out}: cannot create output directory ({e.strerror})") from None
    missing.rmdir()


def keep_inputs(out: str | Path, writes: Iterable[str], inputs: Iterable[str | Path],
                where: str = "--out") -> None:
    """A SimserveError, before anything is written, when a file an output writes or replaces
    in ``out`` (``writes``: names relative to it) is one of ``inputs`` (the scenario, a trace:
    the files the run read), which the output would destroy; but for a scenario or sweep file
    that is itself the results' (``_rewritten_spec``). ``where``: how the caller names the
    output folder (the CLI's option, or an argument)."""
    read = {_resolved(p) for p in inputs}
    if not read:
        return
    for name in writes:
        target = Path(out) / name
        if _resolved(target) in read and not _rewritten_spec(target):
            raise SimserveError(f"{where} {out}: the results would overwrite {Path(out) / name}, "
                                f"which this run reads; give another output folder")


def _rewritten_spec(path: Path) -> bool:
    """Whether ``path`` is the scenario or sweep file of the results folder it lies in (its
    mark beside it): one simserve wrote, run again in place, rewritten with what it says."""
    marks = {"scenario.yaml": (_MARKERS["run"], _MARKERS["replay"]),
             "sweep.yaml": (_MARKERS["sweep"],)}
    return any((path.parent / mark).is_file() for mark in marks.get(path.name, ()))


REPORT_FILES = ("report.html",)     # what a report adds to a results folder (and figures/)


def make_out_dir(out: str | Path, name: Path | None = None) -> Path:
    """Create the output directory ``out`` (or ``name`` inside it) with its parents; an OS
    error is one SimserveError naming ``out``."""
    out = Path(out)
    try:
        (name or out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SimserveError(f"{out}: cannot create output directory ({e.strerror})") from None
    return out
