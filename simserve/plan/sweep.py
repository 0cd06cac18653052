"""Sweeps: one base scenario, a grid of field values, one table row per point.

A sweep file (``simserve sweep grid.yaml``)::

    base: ../scenarios/quickstart.yaml    # relative to this file; or an inline `scenario:` mapping
    set: {workload.num_requests: 300}     # optional: fixed changes to the base
    grid:                                 # cartesian product, the last field varies fastest
      scheduler.policy: [vllm_v1, sarathi]
      workload.rate: [4, 8, 12]
    zip:                                  # optional: lists advanced together (one more axis,
      engine.max_num_seqs: [64, 128]      # innermost), all of the same length
      engine.max_num_batched_tokens: [2048, 4096]

Every point's scenario is validated before any runs, so a misspelt field fails at once with one
message. Points run in processes (default), in this process (``workers=1``), or on a Ray
cluster; the table is ordered by point index whatever finished first, so it is deterministic.
A point that fails at run time gets its message in the ``error`` column; the others still run.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import math
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from simserve.config import (Scenario, apply_overrides, check_overrides, given_fields,
                             load_yaml, parse_scenario, set_field)
from simserve.errors import ConfigError, SimserveError
from simserve.fields import Fields
from simserve.limits import MAX_SWEEP_POINTS, MAX_WORKERS, MAX_WORKERS_PER_CPU
from simserve.paths import (OUTPUT_FILES, PATH_FIELDS, clear_other_outputs, keep_inputs,
                            make_out_dir, named_files, rebase_paths, rebase_value)
from simserve.plan.values import as_list, plain

EXECUTORS = ("local", "ray")
# Columns every sweep table has besides the point's own fields and the summary metrics.
META_COLUMNS = ("point", "policy", "offered_rate", "error")


@dataclass(frozen=True)
class SweepSpec:
    """A base scenario mapping (raw, not yet validated) and the fields to vary."""

    name: str
    base: dict
    base_dir: Path
    grid: dict[str, list]
    zip: dict[str, list]
    # (where it was given, field) for each fixed change already applied to ``base``, in the
    # order applied: ("set.seed", "seed") from the file's set:, ("--set seed", "seed")
    fixed: tuple[tuple[str, str], ...] = ()

    @property
    def fields(self) -> list[str]:
        return [*self.grid, *self.zip]

    def points(self) -> list[dict[str, Any]]:
        return expand(self.grid, self.zip)

    def scenarios(self) -> list[Scenario]:
        """Every point's validated scenario; the first bad one raises, naming point and field."""
        out = []
        for i, point in enumerate(self.points()):
            raw = copy.deepcopy(self.base)
            where = ", ".join(f"{k}={v!r}" for k, v in point.items())
            try:
                for key, value in point.items():
                    set_field(raw, key, value)
                s = parse_scenario(raw, base_dir=self.base_dir, name=self.name)
            except ConfigError as e:
                raise (self._blame(e, point) if i == 0 else None) or ConfigError(
                    e.field, f"{e.message} (in sweep point {i}: {where})") from None
            out.append(s)
        return out

    def _blame(self, e: ConfigError, point: dict[str, Any]) -> ConfigError | None:
        """The first point's error named after the set: field or --set option it comes from, or
        after the base scenario, when the point has no part in it: no axis sets the field, and
        the base scenario with the fixed changes but without the point fails the same way. None
        when the point may be to blame (the caller names it; an error at a later point always
        is: the first point passed with the same fixed changes)."""
        if any(e.field == a or e.field.startswith(f"{a}.") for a in point):
            return None
        given = next(((where, key) for where, key in reversed(self.fixed)
                      if e.field == key or e.field.startswith(f"{key}.")), None)
        try:
            parse_scenario(copy.deepcopy(self.base), base_dir=self.base_dir, name=self.name)
        except ConfigError as alone:
            if (alone.field, alone.message) == (e.field, e.message):
                if given is None:          # the base scenario's own value
                    return ConfigError(e.field, f"{e.message} (in the sweep's base scenario, "
                                                f"before any point)")
                where, key = given
                return ConfigError(where, e.message if e.field == key
                                   else f"{e.field}: {e.message}")
        return None

    def to_dict(self) -> dict:
        return {"name": self.name, "scenario": self.base, "grid": self.grid, "zip": self.zip}


def expand(grid: dict[str, list], zip_: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """The points of a sweep: the cartesian product of ``grid`` (last field fastest) times the
    rows of ``zip_`` (its lists advanced together, as the innermost axis)."""
    grid, zip_ = _as_axes(grid), _as_axes(zip_ or {})
    _check_axes(grid, zip_)
    zip_rows = [dict(zip(zip_, values)) for values in zip(*zip_.values())] or [{}]
    points = []
    for combo in itertools.product(*grid.values()):
        for row in zip_rows:
            points.append({**dict(zip(grid, combo)), **row})
    return points


def _as_axes(axes: Any) -> Any:
    """Each axis's values as a plain list (a tuple, range or NumPy array of them too, each
    NumPy scalar as Python's own: ``values.as_list``), so that ``np.arange(5, 20, 5)`` makes
    the same points, table and sweep.yaml as ``[5, 10, 15]``; anything else is left for
    ``_check_axes`` to refuse."""
    if not isinstance(axes, dict):
        return axes
    return {plain(key): values if as_list(values) is None else as_list(values)
            for key, values in axes.items()}


def _check_axes(grid: Any, zip_: Any) -> None:
    for section, axes in (("grid", grid), ("zip", zip_)):
        if not isinstance(axes, dict):
            raise ConfigError(section, "expected a mapping of FIELD: [values]")
        for key, values in axes.items():
            if not isinstance(key, str) or not key.strip():
                raise ConfigError(section, f"field names must be dotted paths, got {key!r}")
            if isinstance(values, dict):
                raise ConfigError(f"{section}.{key}", "expected a list of values; a nested "
                                  "field is one dotted path (engine.max_num_seqs: [16, 64])")
            if not isinstance(values, list):      # (what _as_axes could not read as one)
                raise ConfigError(f"{section}.{key}", f"expected a non-empty list of values, "
                                                      f"got {type(values).__name__} "
                                                      f"{values!r:.60}")
            if not values:
                raise ConfigError(f"{section}.{key}", "expected a non-empty list of values")
    both = sorted(set(grid) & set(zip_))
    if both:
        raise ConfigError(f"zip.{both[0]}", "is also in grid; give each field in one place")
    lengths = {key: len(values) for key, values in zip_.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ConfigError("zip", f"lists must all have the same length: {listed}")
    if not grid and not zip_:
        raise ConfigError("grid", "nothing to sweep: give grid: and/or zip: with lists of values")
    # counted before anything is expanded: 10^12 points must not be built to be refused
    count = math.prod(len(v) for v in grid.values()) * (next(iter(lengths.values()), 1))
    if count > MAX_SWEEP_POINTS:
        axes = [f"{k} {len(v):,}" for k, v in grid.items()]
        if zip_:
            axes.append(f"zip ({', '.join(zip_)}) {next(iter(lengths.values())):,}")
        raise ConfigError("grid" if grid else "zip",
                          f"{count:,} points ({' x '.join(axes)}) is more than the "
                          f"{MAX_SWEEP_POINTS:,} a sweep may have; use fewer values or split "
                          f"it into several sweeps")
    # after the shape and size checks: zip() stops at the shortest list, and a field in both
    # places is that mistake, not a value repeated
    for key, values in grid.items():
        _check_distinct(f"grid.{key}", values)
    _check_distinct("zip", [tuple(row) for row in zip(*zip_.values())], rows=True)


def _check_distinct(where: str, values: list, rows: bool = False) -> None:
    """No value twice: a repeated value is the same point run twice (the same seed, the same
    result), which a report then counts twice in its averages. 5 and 5.0 are one value."""
    def canonical(v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, (list, tuple)):
            return [canonical(x) for x in v]
        if isinstance(v, dict):
            return {str(k): canonical(x) for k, x in v.items()}
        return v

    seen: dict[str, int] = {}
    for i, v in enumerate(values):
        key = json.dumps(canonical(v), sort_keys=True, default=repr)
        if key in seen:
            what = "rows" if rows else "values"
            raise ConfigError(where, f"{what} {seen[key]} and {i} repeat {v!r}; each point "
                                     f"would run twice")
        seen[key] = i


def max_workers() -> int:
    """The most local processes a sweep may use: MAX_WORKERS_PER_CPU per CPU, at most
    MAX_WORKERS."""
    return min(MAX_WORKERS, MAX_WORKERS_PER_CPU * (os.cpu_count() or 1))


def check_workers(workers: Any, field: str = "workers") -> int | None:
    """``workers`` as a plain int (a NumPy integer too), or None; a ConfigError unless it is
    1 to :func:`max_workers`."""
    if workers is None:
        return None
    workers = plain(workers)
    top = max_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= top:
        raise ConfigError(field, f"must be 1 to {top} ({MAX_WORKERS_PER_CPU} x this machine's "
                                 f"{os.cpu_count() or 1} CPUs, at most {MAX_WORKERS}: more "
                                 f"processes only share the same cores), got {workers!r}")
    return workers


SWEEP_FIELDS = ("base", "scenario", "name", "set", "grid", "zip")   # a sweep file's own


def load_sweep(path: str | Path, overrides: Sequence[str] | None = None) -> SweepSpec:
    """Read a sweep file; ``overrides`` (``FIELD=VALUE``) apply to its base scenario."""
    overrides = check_overrides(overrides)
    path = Path(path)
    raw = load_yaml(path)
    f = Fields(raw, "")
    if isinstance(raw, dict) and "model" in raw and not f.has("base") \
            and not f.has("scenario"):
        raise ConfigError(str(path), "is a scenario, not a sweep file: run it with `simserve "
                                     f"run {path}` (a sweep file names base: or scenario: and "
                                     "grid:/zip:)")
    if f.has("base") == f.has("scenario"):
        if isinstance(raw, dict) and not f.has("base"):
            f.only(SWEEP_FIELDS)     # a misspelt base: (bsae:) is named as the unknown field
        raise ConfigError("base", "give either base: (a scenario file) or scenario: (inline), "
                                  "exactly one")
    if f.has("base"):
        base_path = path.parent / f.str("base")
        if not base_path.is_file():
            raise ConfigError("base", f"{f.str('base')}: file not found (a path relative to the "
                                      f"sweep file's folder, {path.parent}/)")
        base, base_dir = load_yaml(base_path), base_path.parent
    else:
        base, base_dir = f.any("scenario"), path.parent
    name = f.str("name", path.stem)
    fixed = f.any("set", {})
    grid, zip_ = f.any("grid", {}), f.any("zip", {})
    f.done()
    return make_spec(base, grid, zip_, base_dir=base_dir, name=name, fixed=fixed,
                     overrides=overrides)


def make_spec(base: dict | Scenario | str | Path, grid: dict | None = None,
              zip_: dict | None = None, *, base_dir: Path | None = None, name: str | None = None,
              fixed: dict | None = None, overrides: Sequence[str] | None = None) -> SweepSpec:
    """A SweepSpec from a base (scenario mapping, Scenario or scenario file) and axes."""
    overrides = check_overrides(overrides)
    if isinstance(base, Scenario):
        if base.source is None:
            raise ConfigError("scenario", f"{base.name}: a scenario changed with replace() "
                                          "cannot be swept; sweep the file or mapping it came "
                                          "from, with the change as fixed= (or set: in a file)")
        name = name or base.name
        base_dir = base_dir or base.base_dir
        base = base.source
    elif isinstance(base, (str, Path)):
        path = Path(base)
        base_dir = base_dir or path.parent
        name = name or path.stem
        base = load_yaml(path)
    if not isinstance(base, dict):
        raise ConfigError("scenario", "the base scenario must be a mapping of sections")
    if "compare" in base:
        raise ConfigError("compare", "a sweep's base scenario cannot have compare:; put the "
                                     "field in the grid instead")
    base = plain(copy.deepcopy(base))
    if not isinstance(fixed or {}, dict):
        raise ConfigError("set", "expected a mapping of FIELD: VALUE")
    fixed = plain(fixed)
    for key, value in (fixed or {}).items():
        set_field(base, key, value)
    apply_overrides(base, overrides)
    grid, zip_ = _as_axes(grid or {}), _as_axes(zip_ or {})
    _check_axes(grid, zip_)
    grid, zip_ = dict(grid), dict(zip_)
    given = [(f"set.{k}", str(k).strip()) for k in fixed or {}] + \
        [(f"--set {k.strip()}", k.strip()) for k, _, _ in
         (item.partition("=") for item in overrides or [])]
    for where, key in given_fields(fixed, overrides):
        # every point sets the axis after set: and --set, so the fixed value was dropped
        axis = next((a for a in (*grid, *zip_) if key == a or key.startswith(f"{a}.")), None)
        if axis is not None:
            section = "grid" if axis in grid else "zip"
            raise ConfigError(where, f"is also varied by {section}.{axis}, whose values "
                                     f"would replace it at every point; give it in one place")
    return SweepSpec(name or base.get("name", "sweep"), base, Path(base_dir or "."), grid, zip_,
                     tuple(given))


# --- running ----------------------------------------------------------------------------------

def _run_point(scenario: Scenario) -> tuple[dict | None, str | None]:
    """Run one point; any failure becomes its message (the sweep goes on)."""
    from simserve.runner import run
    try:
        summary = run(scenario).summary
    except SimserveError as e:        # bad input: its message names the field already
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - recorded in the table, never fatal to the sweep
        return None, f"{type(e).__name__}: {e}"
    summary = dict(summary)
    summary.pop("warnings", None)
    summary["rejected_by_reason"] = json.dumps(summary.get("rejected_by_reason") or {},
                                               sort_keys=True)
    return summary, None


Done = Callable[[int, bool], None]   # (point index, failed) after each point finishes
Task = Callable[[Any], tuple[Any, str | None]]   # item -> (value, error message)


class Executor:
    """Runs a module-level ``task(item) -> (value, error)`` over items in this process
    (``workers=1``), in local processes, or as Ray tasks; open across several :meth:`map`
    calls (a plan runs its candidates in waves), closed by ``with`` or :meth:`close`."""

    def __init__(self, executor: str = "local", workers: int | None = None,
                 address: str | None = None):
        if executor not in EXECUTORS:
            raise ConfigError("executor", f"unknown executor {executor!r}; expected one of: "
                                          f"{', '.join(EXECUTORS)}")
        if address is not None and executor != "ray":
            # (it was ignored: the points ran on local processes as if it were not given)
            raise ConfigError("address", "names a Ray cluster: give it with executor ray, not "
                                         f"{executor}")
        self.executor, self.address = executor, address
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._own_ray = False

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._own_ray:
            self._ray.shutdown()
            self._own_ray = False

    def map(self, task: Task, items: Sequence[Any],
            on_done: Done | None = None) -> list[tuple[Any, str | None]]:
        """``task(item)`` for each item, in input order; a worker that dies gives its item
        the error ``"ExceptionName: message"``."""
        on_done = on_done or (lambda i, failed: None)
        results: list = [None] * len(items)
        if self.executor == "ray":
            return self._map_ray(task, items, on_done)
        if self.workers <= 1 or len(items) <= 1:
            for i, item in enumerate(items):
                results[i] = task(item)
                on_done(i, results[i][1] is not None)
            return results
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        futures = {self._pool.submit(task, item): i for i, item in enumerate(items)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as e:  # noqa: BLE001 - a worker died (memory, signal)
                results[i] = (None, f"{type(e).__name__}: {e}")
            on_done(i, results[i][1] is not None)
        return results

    def _start_ray(self) -> Any:
        if self._ray is not None:
            return self._ray
        try:
            import ray
        except ImportError:
            raise SimserveError("executor 'ray' needs the ray package: "
                                "pip install 'simserve[ray]'") from None
        if not ray.is_initialized():   # a cluster the caller connected to is left running
            _check_reachable(self.address)
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise SimserveError(f"ray: cannot start or reach a cluster at "
                                    f"{self.address or 'local'}: {e}") from None
            self._own_ray = True
        self._ray = ray
        return ray

    def _map_ray(self, task: Task, items: Sequence[Any], on_done: Done) -> list:
        ray = self._start_ray()
        remote = ray.remote(task)
        pending = {remote.remote(item): i for i, item in enumerate(items)}
        results: list = [None] * len(items)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a task lost with its worker or node
                    results[i] = (None, f"{type(e).__name__}: {e}")
                on_done(i, results[i][1] is not None)
        return results


def run_scenarios(scenarios: Sequence[Scenario], executor: str = "local", *,
                  workers: int | None = None, address: str | None = None,
                  on_done: Done | None = None) -> list[tuple[dict | None, str | None]]:
    """``(summary, error)`` for each scenario, in input order."""
    workers = check_workers(workers)
    # Relative paths (traces, profiles) must not depend on a worker's working directory.
    scenarios = [s.replace(base_dir=s.base_dir.resolve()) for s in scenarios]
    workers = min(workers or os.cpu_count() or 1, len(scenarios))
    with Executor(executor, workers, address) as pool:
        return pool.map(_run_point, scenarios, on_done)


def _check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody answers at (ray.init would retry for minutes)."""
    if not address or address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return            # some other form ray understands; let it decide
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise SimserveError(f"ray: no cluster answers at {address} ({e.strerror or e})") from None


def sweep(base: SweepSpec | Scenario | dict | str | Path, grid: dict | None = None,
          zip: dict | None = None, *, fixed: dict | None = None,
          overrides: Sequence[str] | None = None, executor: str = "local",
          workers: int | None = None, address: str | None = None,
          progress: bool = False) -> pd.DataFrame:
    """Run a sweep and return its table: one row per point, ordered by point index.

    ``base`` is a sweep file (when ``grid`` and ``zip`` are not given), a scenario file, a
    Scenario, a scenario mapping, or a SweepSpec. Columns: ``point``, the varied fields,
    ``policy`` and ``offered_rate`` (resolved per point), ``error`` (None when the point ran),
    then every summary metric of docs/metrics.md.
    """
    if isinstance(base, SweepSpec):
        # (they were ignored: the spec's own points ran)
        _refuse_given("a SweepSpec holds its axes and fixed changes already; build it with "
                      "them (make_spec)", grid=grid, zip=zip, fixed=fixed, overrides=overrides)
        spec = base
    elif grid is None and zip is None and isinstance(base, (str, Path)):
        _refuse_given("a sweep file gives its fixed changes in set:, or give them as "
                      "overrides", fixed=fixed)
        spec = load_sweep(base, overrides)
    else:
        spec = make_spec(base, grid, zip, fixed=fixed, overrides=overrides)
    scenarios = spec.scenarios()
    if not progress:
        outcomes = run_scenarios(scenarios, executor, workers=workers, address=address)
        return sweep_table(spec, scenarios, outcomes)
    from simserve.progress import bar
    with bar(len(scenarios), "sweep", "point") as points:
        failures = 0

        def done(index: int, failed: bool) -> None:
            nonlocal failures
            failures += failed
            if failed:
                points.set_postfix(failed=failures, refresh=False)
            points.update(1)
        outcomes = run_scenarios(scenarios, executor, workers=workers, address=address,
                                 on_done=done)
    return sweep_table(spec, scenarios, outcomes)


def _refuse_given(why: str, **arguments: Any) -> None:
    """A ConfigError naming the first argument given (not None) that would be ignored."""
    for name, value in arguments.items():
        if value is not None:
            raise ConfigError(name, f"would be ignored: {why}")


def sweep_table(spec: SweepSpec, scenarios: Sequence[Scenario],
                outcomes: Sequence[tuple[dict | None, str | None]]) -> pd.DataFrame:
    metrics: list[str] = []
    for summary, _ in outcomes:
        if summary is not None:
            metrics = list(summary)
            break
    rows = []
    for i, (point, s, (summary, error)) in enumerate(zip(spec.points(), scenarios, outcomes)):
        row = {"point": i, **point, "policy": s.policy, "offered_rate": offered_rate(s),
               "error": error}
        row.update({m: (summary or {}).get(m) for m in metrics})
        rows.append(row)
    columns = ["point", *spec.fields, "policy", "offered_rate", "error", *metrics]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(columns)))


def offered_rate(s: Scenario) -> float | None:
    """The mean arrival rate asked for (req/s), or None (burst, or a trace's own clock)."""
    w = s.workload
    if w.trace is not None:
        return w.trace.rate
    return w.arrival.rate if w.arrival is not None else None


def sweep_inputs(spec: SweepSpec) -> list[Path]:
    """The files a sweep's points read: those its base scenario names, and each value of an
    axis that holds a path (relative to the sweep's folder, as its base's are)."""
    files = named_files(spec.base, spec.base_dir)
    for name, values in (*spec.grid.items(), *spec.zip.items()):
        if PATH_FIELDS.get(name):
            files += [spec.base_dir / Path(v).expanduser() for v in values if isinstance(v, str)]
    return files


def save_sweep(table: pd.DataFrame, spec: SweepSpec, out: str | Path) -> Path:
    """Write ``sweep.csv`` (and ``sweep.parquet`` when pyarrow is installed) and
    ``sweep.yaml`` (the base scenario and axes, to rerun or to label the report); refused
    before anything is written where they would replace a file the sweep reads (a trace its
    base or an axis names), and another kind of output in ``out`` is replaced, as the CLI
    does."""
    inputs = sweep_inputs(spec)
    keep_inputs(out, OUTPUT_FILES["sweep"], inputs, "out")
    out = make_out_dir(out)
    clear_other_outputs(out, "sweep", inputs=inputs)
    table.to_csv(out / "sweep.csv", index=False, float_format="%.9g")
    if importlib.util.find_spec("pyarrow") is not None:   # optional, never a dependency
        _nested_as_json(table).to_parquet(out / "sweep.parquet", index=False)
    elif (out / "sweep.parquet").is_file():     # an earlier sweep's, beside this one's CSV
        (out / "sweep.parquet").unlink()
    (out / "sweep.yaml").write_text(yaml.safe_dump(sweep_record(spec, out), sort_keys=False))
    return out


def sweep_record(spec: SweepSpec, out: str | Path) -> dict[str, Any]:
    """What ``save_sweep`` writes to ``out/sweep.yaml``: the spec, its paths relative to
    ``out``, so that ``simserve sweep OUT/sweep.yaml`` reruns the same points."""
    out = Path(out)
    d = spec.to_dict()
    d["scenario"] = rebase_paths(d["scenario"], spec.base_dir, out)
    for axes in ("grid", "zip"):
        d[axes] = {k: [rebase_value(k, v, spec.base_dir, out) for v in values]
                   for k, values in d[axes].items()}
    return d


def replaced_sweep_note(out: str | Path, spec: SweepSpec) -> str | None:
    """A sentence when ``out`` holds another sweep's table (its ``sweep.yaml`` records other
    points or another base scenario), naming what differs; None otherwise."""
    old_path = Path(out) / "sweep.yaml"
    if not old_path.is_file():
        return None
    new = sweep_record(spec, out)
    try:
        old = yaml.safe_load(old_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return f"replacing the files in {out}/ (its sweep.yaml is not one simserve wrote)"
    if old == new:
        return None
    if not isinstance(old, dict):
        return f"replacing the files in {out}/ (its sweep.yaml is not one simserve wrote)"
    changed = [k for k in (*new, *(k for k in old if k not in new)) if old.get(k) != new.get(k)]
    what = f"name: {old.get('name')} → {new.get('name')}; " \
        if old.get("name") != new.get("name") else ""
    return (f"replacing the results of a different sweep in {out}/ ({what}differs in "
            f"{', '.join(changed)})")


def _nested_as_json(table: pd.DataFrame) -> pd.DataFrame:
    """The table with mappings and lists (``failed_by_reason``, per-class figures) as JSON
    text: Parquet cannot store an empty mapping, and a column's mappings differ in keys."""
    nested = [c for c in table.columns if table[c].dtype == object
              and any(isinstance(v, (dict, list)) for v in table[c])]
    if not nested:
        return table
    return table.assign(**{c: [json.dumps(v, sort_keys=True) if isinstance(v, (dict, list))
                               else v for v in table[c]] for c in nested})
