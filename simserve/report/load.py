"""What a report is made from, read back from the directories simserve writes.

- a **run** directory (``Result.save``): scenario.yaml, requests.csv, summary.json, and
  steps.csv where it was written (a long run writes it only when asked: ``--steps``); or the
  same tables as ``.parquet`` files;
- a **compare** directory (``simserve run`` on a compare file): one run directory per variant
  and comparison.csv (whose row order is kept);
- a **sweep** directory: sweep.csv and sweep.yaml;
- a **capacity** directory: capacity.json and probes.csv;
- a **plan** directory: plan.json, candidates.csv and probes.csv.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from simserve.errors import DataError, SimserveError
from simserve.safeyaml import read_text


# What the report reads from each file (a file cut short or edited by hand lacked one and the
# report was a KeyError traceback): checked when the directory is read, named with its file.
REQUEST_NEEDS = ("status", "ttft_s", "tpot_s", "e2el_s")
STEP_NEEDS = ("replica", "start_s", "duration_s", "num_running", "num_waiting",
              "num_prefill_tokens", "num_batched_tokens", "kv_blocks_used", "kv_blocks_total",
              "num_preempted")
CAPACITY_NEEDS = ("target_attainment", "max_rate", "first_failing_rate", "replicas", "spread",
                  "target_rate", "replicas_needed")
PROBE_NEEDS = ("phase", "rate", "replicas", "slo_attainment")
PLAN_NEEDS = ("candidates", "model", "target_rate", "simulated")
CANDIDATE_NEEDS = ("candidate",)
# the load curves of a sweep table or capacity probes (report/figures.py load_curves)
CURVE_NEEDS = ("policy", "request_throughput")


def _expect_result(method: str, result, module: str, name: str, made_by: str) -> None:
    """``result`` is a ``module.name`` (a wrong kind of result was an AttributeError from
    inside); SimserveError saying what ``method`` takes otherwise. The class is looked up among
    the modules already imported, not imported here: plan/planner.py imports this module, and
    nothing is an instance of a class whose module was never loaded."""
    cls = getattr(sys.modules.get(module), name, None)
    if cls is None or not isinstance(result, cls):
        raise SimserveError(f"{method}: expected a simserve {name} (what {made_by} returns), "
                            f"got {type(result).__name__}")


def _needs(path: Path, have, needed: Sequence[str], what: str) -> None:
    missing = [k for k in needed if k not in have]
    if missing:
        raise DataError(path, f"no {what} {missing[0]!r} (a simserve output cut short or "
                              "edited?)")


@dataclass
class RunData:
    """One run's tables, as a report needs them."""

    label: str
    policy: str
    requests: pd.DataFrame
    steps: pd.DataFrame | None      # None: the run wrote no per-step table
    summary: dict
    scenario: dict
    path: Path | None = None
    overrides: tuple[str, ...] = ()        # the --set overrides that made the run

    @property
    def slo(self) -> dict:
        return self.scenario.get("slo") or {}

    @classmethod
    def from_result(cls, label: str, result) -> RunData:
        """From a :class:`simserve.runner.Result` (no files needed)."""
        if not isinstance(label, str):
            raise SimserveError(f"RunData.from_result: label: expected a str, got "
                                f"{type(label).__name__}")
        _expect_result("RunData.from_result", result, "simserve.runner", "Result",
                       "simserve.run")
        # (a long run's steps folded away: its figures that need no steps are still drawn)
        steps = result.steps if result.has_steps else None
        return cls(label, result.scenario.policy, result.requests, steps,
                   result.summary, result.scenario.to_dict(),
                   overrides=tuple(result.scenario.overrides))

    @classmethod
    def from_dir(cls, path: Path, label: str | None = None) -> RunData:
        scenario = _read_yaml(path / "scenario.yaml")
        # runner.scenario_yaml names the overrides in comment lines "# --set FIELD=VALUE"
        overrides = tuple(line[len("# --set "):].strip()
                          for line in read_text(path / "scenario.yaml").splitlines()
                          if line.startswith("# --set "))
        requests = _read_table(path / "requests")
        steps = _read_table(path / "steps", optional=True)
        summary = _read_json(path / "summary.json")
        # the columns once every file is read: an unreadable file is named before a short one
        assert requests is not None
        _needs(_table_path(path / "requests"), requests.columns, REQUEST_NEEDS, "column")
        if steps is not None:
            _needs(_table_path(path / "steps"), steps.columns, STEP_NEEDS, "column")
        _check_run(path / "summary.json", summary, path / "scenario.yaml", scenario)
        return cls(label or path.name, scenario.get("scheduler", {}).get("policy", "?"),
                   requests, steps, summary, scenario, path, overrides)


@dataclass
class SweepData:
    label: str
    table: pd.DataFrame
    spec: dict                       # sweep.yaml: name, scenario (the base), grid, zip
    path: Path | None = None

    @property
    def fields(self) -> list[str]:
        return [*(self.spec.get("grid") or {}), *(self.spec.get("zip") or {})]

    @property
    def slo(self) -> dict:
        return (self.spec.get("scenario") or {}).get("slo") or {}


@dataclass
class CapacityData:
    label: str
    answer: dict                     # capacity.json (CapacityResult.to_dict)
    probes: pd.DataFrame
    path: Path | None = None

    @classmethod
    def from_result(cls, result) -> CapacityData:
        _expect_result("CapacityData.from_result", result, "simserve.plan.capacity",
                       "CapacityResult", "simserve.capacity")
        return cls(result.scenario, result.to_dict(), result.probes)


@dataclass
class PlanData:
    label: str
    answer: dict                     # plan.json (PlanResult.to_dict)
    table: pd.DataFrame              # candidates.csv: one row per candidate deployment
    path: Path | None = None

    @classmethod
    def from_result(cls, result) -> PlanData:
        _expect_result("PlanData.from_result", result, "simserve.plan.planner", "PlanResult",
                       "simserve.plan")
        return cls(result.scenario, result.to_dict(), result.table)


@dataclass
class Inputs:
    runs: list[RunData] = field(default_factory=list)
    sweeps: list[SweepData] = field(default_factory=list)
    capacities: list[CapacityData] = field(default_factory=list)
    plans: list[PlanData] = field(default_factory=list)


def load_inputs(paths: Sequence[str | Path]) -> Inputs:
    """Read every directory, detecting its kind; labels are directory names, made unique."""
    dirs = [Path(p) for p in paths]
    for d in dirs:
        if not d.is_dir():
            raise DataError(d, "not a directory (expected a run, compare, sweep, capacity "
                               "or plan output directory)")
    seen: dict[Path, Path] = {}
    for d in dirs:      # (the same runs twice: two series of one run, under two labels)
        first = seen.setdefault(d.resolve(), d)
        if first is not d:
            raise DataError(d, f"given twice (also as {first}): name each directory once")
    labels = _unique_labels(dirs)
    out = Inputs()
    for d, label in zip(dirs, labels):
        if (d / "summary.json").is_file():
            out.runs.append(RunData.from_dir(d, label))
        elif (d / "sweep.csv").is_file():
            spec = _read_yaml(d / "sweep.yaml") if (d / "sweep.yaml").is_file() else {}
            table = _read_csv(d / "sweep.csv", CURVE_NEEDS[:1])
            _check_sweep(d / "sweep.yaml", spec, d / "sweep.csv", table)
            out.sweeps.append(SweepData(spec.get("name") or label, table, spec, d))
        elif (d / "plan.json").is_file():
            answer = _read_json(d / "plan.json")
            _needs(d / "plan.json", answer, PLAN_NEEDS, "key")
            table = _read_csv(d / "candidates.csv", CANDIDATE_NEEDS)
            _check_plan(d / "plan.json", answer, d / "candidates.csv", table)
            out.plans.append(PlanData(answer.get("scenario") or label, answer, table, d))
        elif (d / "capacity.json").is_file():
            answer = _read_json(d / "capacity.json")
            _needs(d / "capacity.json", answer, CAPACITY_NEEDS, "key")
            _check_capacity(d / "capacity.json", answer)
            probes = _read_csv(d / "probes.csv", PROBE_NEEDS + CURVE_NEEDS[1:])
            _numeric_columns(d / "probes.csv", probes,
                             ("rate", "replicas", "slo_attainment", *CURVE_NEEDS[1:]))
            out.capacities.append(CapacityData(answer.get("scenario") or label, answer,
                                               probes, d))
        elif variants := _variant_dirs(d):
            _check_compare_dir(d, variants)
            out.runs.extend(RunData.from_dir(v) for v in variants)
        else:
            raise DataError(d, "not a simserve output directory (no summary.json, sweep.csv, "
                               "capacity.json, plan.json, or run subdirectories)")
    return out


# What the plan section reads from plan.json beyond PLAN_NEEDS, by type (PlanResult.to_dict);
# a value of another type (an edited file) was a TypeError or KeyError traceback from the report
_NUMBER = (int, float)
PLAN_TYPES: dict[str, tuple[type, ...]] = {
    "scenario": (str,), "model": (str,), "target_rate": _NUMBER, "candidates": (int,),
    "simulated": (int,), "met": (bool,), "slo": (dict,), "pruned": (dict,),
    "winner": (int,), "runners_up": (list,), "pareto": (list,), "closest": (list,),
    "vllm_serve": (list,), "notes": (list,), "winner_row": (dict,), "assumed": (list,)}
PLAN_OPTIONAL = {"scenario", "met", "slo", "pruned", "winner", "runners_up", "pareto",
                 "closest", "vllm_serve", "notes", "winner_row",
                 "assumed"}     # may be absent or null
WINNER_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "deployment": (str,), "max_num_batched_tokens": _NUMBER, "max_num_seqs": _NUMBER,
    "replicas": _NUMBER, "gpus": _NUMBER, "cost_per_hour": _NUMBER,
    "cost_per_million_output_tokens": _NUMBER}
# the Pareto chart of a plan: its axes, columns of the plan's candidate table (plan/planner.py),
# and what else it reads from the table
PARETO_X = "tokens_per_s_per_user"
PARETO_Y = "output_tokens_per_s_per_gpu"
PARETO_COLUMNS = (PARETO_X, PARETO_Y, "hardware", "mode", "deployment")


def _typed(path: Path, node: dict, key: str, kinds: tuple[type, ...], name: str,
           optional: bool) -> None:
    """``node[key]`` is one of ``kinds`` (``optional``: or absent, or null); DataError naming
    the key as ``name`` (``winner_row.gpus``) otherwise."""
    v = node.get(key)
    if v is None and optional:
        return
    if key not in node:
        raise DataError(path, f"no key {name!r} (a simserve output cut short or edited?)")
    if v is None or isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        what = "a number" if kinds == _NUMBER else {
            str: "a string", int: "an integer", bool: "true or false", dict: "an object",
            list: "a list"}[kinds[0]]
        raise DataError(path, f"{name} must be {what}, got {json.dumps(v)[:60]}")


def _check_plan(path: Path, a: dict, table_path: Path, table: pd.DataFrame) -> None:
    """Every value the plan section reads, of the type it reads it as; the candidate ids it
    names are rows of candidates.csv. DataError naming the key (``winner_row.gpus``)."""
    for key, kinds in PLAN_TYPES.items():
        _typed(path, a, key, kinds, key, key in PLAN_OPTIONAL)
    for key in ("slo", "pruned"):
        for k in a.get(key) or {}:
            _typed(path, a[key], k, _NUMBER, f"{key}.{k}", optional=key == "slo")
    for key in ("vllm_serve", "notes", "assumed"):
        for i, v in enumerate(a.get(key) or []):
            _typed(path, {"v": v}, "v", (str,), f"{key}[{i}]", optional=False)
    if a.get("met"):
        _typed(path, a, "winner", (int,), "winner", optional=False)
        _typed(path, a, "winner_row", (dict,), "winner_row", optional=False)
        for key, kinds in WINNER_ROW_TYPES.items():
            _typed(path, a["winner_row"], key, kinds, f"winner_row.{key}", optional=False)
    ids = pd.to_numeric(table["candidate"], errors="coerce")
    twice = ids[ids.duplicated()].dropna()
    if len(twice):
        raise DataError(table_path, f"candidate {twice.iloc[0]:g} appears twice",
                        int(twice.index[0]) + 2)
    for key in ("winner", "runners_up", "pareto", "closest"):
        named = a.get(key)
        for i, c in enumerate(named if isinstance(named, list) else
                              [] if named is None else [named]):
            where = f"{key}[{i}]" if isinstance(named, list) else key
            _typed(path, {"c": c}, "c", (int,), where, optional=False)
            if c not in set(ids.dropna()):
                raise DataError(path, f"{where}: candidate {c} is not a row of {table_path}")
    if a.get("pareto") or PARETO_X in table or PARETO_Y in table:
        _needs(table_path, table.columns, PARETO_COLUMNS, "column")


# What the capacity section and figure read from capacity.json (CapacityResult.to_dict)
CAPACITY_TYPES: dict[str, tuple[type, ...]] = {
    "scenario": (str,), "policy": (str,), "slo": (dict,), "target_attainment": _NUMBER,
    "max_rate": _NUMBER, "first_failing_rate": _NUMBER, "per_gpu_rate": _NUMBER,
    "replicas": (int,), "tensor_parallel_size": (int,), "pipeline_parallel_size": (int,),
    "tolerance": _NUMBER, "seeds": (list,), "aggregate": (str,), "spread": (dict,),
    "target_rate": _NUMBER, "replicas_needed": (int,), "notes": (list,)}
CAPACITY_OPTIONAL = {"scenario", "policy", "slo", "pipeline_parallel_size", "aggregate",
                     "target_rate", "replicas_needed", "notes"}


def _check_capacity(path: Path, a: dict) -> None:
    """Every value the capacity section reads, of the type it reads it as."""
    for key, kinds in CAPACITY_TYPES.items():
        _typed(path, a, key, kinds, key, key in CAPACITY_OPTIONAL)
    for k in a.get("slo") or {}:
        _typed(path, a["slo"], k, _NUMBER, f"slo.{k}", optional=True)
    for k in ("min", "mean", "max"):
        _typed(path, a["spread"], k, _NUMBER, f"spread.{k}", optional=False)
    if not 0 < a["target_attainment"] <= 1:     # (a fraction, as the figures take it)
        raise DataError(path, f"target_attainment must be a fraction in (0, 1], got "
                              f"{a['target_attainment']:g}")
    for i, v in enumerate(a.get("notes") or []):
        _typed(path, {"v": v}, "v", (str,), f"notes[{i}]", optional=False)


# What the run sections read from summary.json as numbers (the headline table, the policy bars,
# the rejected count of the CDFs; tests/unit/test_report.py holds the report's keys to this)
SUMMARY_NUMBERS = (
    "completed", "num_rejected", "request_throughput", "request_goodput", "slo_attainment",
    "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_e2el_ms", "p99_e2el_ms", "total_preemptions", "mean_kv_utilization",
    "prefix_cache_hit_rate")
TRUST_TYPES: dict[str, tuple[type, ...]] = {
    "expected_error_pct": (dict,), "curves": (str,), "basis": (str,), "outside_corpus": (list,)}


def _check_run(path: Path, summary: dict, scenario_path: Path, scenario: dict) -> None:
    """What the run sections read from summary.json and scenario.yaml, of the types they read."""
    for key in SUMMARY_NUMBERS:
        _typed(path, summary, key, _NUMBER, key, optional=True)
    _typed(path, summary, "latency_model", (str,), "latency_model", optional=True)
    _typed(path, summary, "latency_trust", (dict,), "latency_trust", optional=True)
    trust = summary.get("latency_trust")
    if trust:
        for key, kinds in TRUST_TYPES.items():
            _typed(path, trust, key, kinds, f"latency_trust.{key}", optional=False)
        for k in trust["expected_error_pct"]:
            _typed(path, trust["expected_error_pct"], k, _NUMBER,
                   f"latency_trust.expected_error_pct.{k}", optional=False)
        for i, v in enumerate(trust["outside_corpus"]):
            _typed(path, {"v": v}, "v", (str,), f"latency_trust.outside_corpus[{i}]",
                   optional=False)
    _typed(scenario_path, scenario, "slo", (dict,), "slo", optional=True)
    for k in scenario.get("slo") or {}:
        _typed(scenario_path, scenario["slo"], k, _NUMBER, f"slo.{k}", optional=True)
    _typed(scenario_path, scenario, "scheduler", (dict,), "scheduler", optional=True)
    _typed(scenario_path, scenario.get("scheduler") or {}, "policy", (str,), "scheduler.policy",
           optional=True)


def _check_sweep(path: Path, spec: dict, table_path: Path, table: pd.DataFrame) -> None:
    """What the sweep section reads from sweep.yaml (the base scenario's SLO, the axes) and
    sweep.csv (numbers for its curves)."""
    _typed(path, spec, "name", (str,), "name", optional=True)
    _typed(path, spec, "scenario", (dict,), "scenario", optional=True)
    for key in ("grid", "zip"):
        _typed(path, spec, key, (dict,), key, optional=True)
    slo = (spec.get("scenario") or {}).get("slo")
    _typed(path, {"slo": slo}, "slo", (dict,), "scenario.slo", optional=True)
    for k in slo or {}:
        _typed(path, slo, k, _NUMBER, f"scenario.slo.{k}", optional=True)
    ran = table["error"].isna() if "error" in table else pd.Series(True, index=table.index)
    if ran.any():            # curves are drawn (a sweep whose every point failed has no metrics)
        _needs(table_path, table.columns, CURVE_NEEDS, "column")
        _numeric_columns(table_path, table, CURVE_NEEDS[1:])
    if "slo_attainment_target" in table:        # (a fraction, as the figures take it)
        _numeric_columns(table_path, table, ["slo_attainment_target"])
        target = pd.to_numeric(table["slo_attainment_target"])
        out = target.notna() & ~target.between(0, 1, inclusive="right")
        if out.any():
            i = int(out.to_numpy().argmax())
            raise DataError(table_path, f"slo_attainment_target must be a fraction in (0, 1], "
                                        f"got {target.iloc[i]:g}", i + 2)


def _numeric_columns(path: Path, table: pd.DataFrame, columns: Sequence[str]) -> None:
    """Each of ``columns`` holds numbers (or nothing, a failed point's)."""
    for c in columns:
        if not pd.api.types.is_numeric_dtype(table[c]) and table[c].notna().any():
            values = pd.to_numeric(table[c], errors="coerce")
            i = int((values.isna() & table[c].notna()).to_numpy().argmax())
            raise DataError(path, f"column {c!r} is not a number: {str(table[c].iloc[i])!r}",
                            i + 2)


def _variant_dirs(d: Path) -> list[Path]:
    """A compare directory's runs, in comparison.csv's order when it is there."""
    subdirs = sorted(p for p in d.iterdir() if (p / "summary.json").is_file())
    table = d / "comparison.csv"
    if table.is_file():
        # its first column names the variants (an unreadable file is named, not a traceback)
        order = [str(x) for x in _read_csv(table).iloc[:, 0]]
        rank = {name: i for i, name in enumerate(order)}
        subdirs.sort(key=lambda p: (rank.get(p.name, len(rank)), p.name))
    return subdirs


def _check_compare_dir(d: Path, runs: list[Path]) -> None:
    """A folder of runs that `simserve run` did not write as a compare (no comparison.csv)
    beside other outputs (a compare, sweep, capacity or plan folder) is a folder of results,
    ``runs/`` say, not a comparison: refused, naming what it holds."""
    if (d / "comparison.csv").is_file():
        return
    others = sorted(p.name for p in d.iterdir() if p.is_dir() and p not in runs and (
        any((p / f).is_file() for f in ("sweep.csv", "capacity.json", "plan.json"))
        or any((q / "summary.json").is_file() for q in p.iterdir() if q.is_dir())))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                         else "")
        raise DataError(d, f"holds several outputs, not one: {len(runs)} run(s) and {shown}; "
                           f"name the ones to report, e.g. simserve report {runs[0]} "
                           f"{d / others[0]} --out DIR")


def _unique_labels(dirs: list[Path]) -> list[str]:
    names = [d.resolve().name for d in dirs]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([d.resolve() for d in dirs]))
    return [str(d.resolve().relative_to(common)) or d.resolve().name for d in dirs]


def _table_path(stem: Path) -> Path:
    """The file ``_read_table`` reads for ``stem``."""
    parquet = stem.with_suffix(".parquet")
    return parquet if not stem.with_suffix(".csv").exists() and parquet.exists() \
        else stem.with_suffix(".csv")


def _read_table(stem: Path, optional: bool = False) -> pd.DataFrame | None:
    """``stem``.csv, else ``stem``.parquet (``simserve run --format parquet``); None for a
    missing ``optional`` table."""
    parquet = stem.with_suffix(".parquet")
    if not stem.with_suffix(".csv").exists() and parquet.exists():
        try:
            table = pd.read_parquet(parquet)
        except ImportError:
            raise DataError(parquet, "reading Parquet needs pyarrow "
                                     "(pip install 'simserve[parquet]')") from None
        except Exception as e:   # pyarrow's errors for a damaged file have no common base
            raise DataError(parquet, f"not a readable Parquet table ({e})") from None
        return table
    if optional and not stem.with_suffix(".csv").exists():
        return None
    return _read_csv(stem.with_suffix(".csv"))


def _read_csv(path: Path, needs: Sequence[str] = ()) -> pd.DataFrame:
    try:
        table = pd.read_csv(path)
        _needs(path, table.columns, needs, "column")
        return table
    except FileNotFoundError:
        raise DataError(path, "file not found") from None
    except UnicodeDecodeError:
        raise DataError(path, "not a readable CSV table (not UTF-8 text)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(path, f"not a readable CSV table ({' '.join(str(e).split())})") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise DataError(path, f"invalid JSON: {e.msg}", e.lineno) from None
    except RecursionError:
        raise DataError(path, "invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise DataError(path, "expected a JSON object")
    return data


def _read_yaml(path: Path) -> dict:
    from simserve.config import load_yaml
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise DataError(path, "expected a YAML mapping")
    return data
