"""``simserve plan``: the cheapest deployment that serves a target rate within the SLOs.

Every candidate of the space (``plan/space.py``) is built as a scenario; the cheap bounds of
``plan/bounds.py`` rule out what cannot start (parallelism, memory), what misses the SLO even
alone, and what cannot reach the rate with ``max_replicas``; the rest are searched with the
capacity search (``plan/capacity.py``, with ``target_rate``: the fewest replicas) in waves run
by the sweep's executor (local processes or Ray), cheapest cost bound first. Before each wave,
a candidate whose cost bound exceeds the cost of the ``runners_up + 1``-th cheapest deployment
found is pruned: the bound is a lower bound, so the cheapest deployments are the ones an
exhaustive search finds.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simserve.config import (Scenario, apply_overrides, check_overrides, given_fields,
                             load_yaml, parse_scenario)
from simserve.errors import ConfigError, DataError, SimserveError
from simserve.plan.bounds import Lengths, bound, kv_fits
from simserve.plan.space import GIVEN_PRICE, Candidate, PlanSpace, candidates
from simserve.plan.values import check_log, number, plain
from simserve.report.load import PARETO_X, PARETO_Y
from simserve.paths import OUTPUT_FILES, clear_other_outputs, keep_inputs, make_out_dir, named_files

Log = Callable[[str], None]
BOUNDS = ("parallelism", "config", "memory", "slo", "throughput", "cost")
EXIT_NOT_MET = 3       # `simserve plan` exit code when no deployment meets the SLOs


@dataclass
class PlanResult:
    """Every candidate (``table``: one row each, why it was pruned or what its search found),
    every capacity probe run (``probes``), and the answer."""

    scenario: str
    model: str
    target_rate: float
    slo: dict
    space: dict
    table: pd.DataFrame
    probes: pd.DataFrame
    pruned: dict[str, int]              # bound -> candidates it removed
    winner: int | None                  # candidate index of the cheapest that serves R
    runners_up: list[int]
    pareto: list[int]                   # candidates on the frontier, by tokens/s per user
    closest: list[int]                  # when none serves R: the nearest misses
    commands: list[str]                 # the winner's `vllm serve` line(s)
    notes: list[str] = field(default_factory=list)
    clocks: dict[str, str] = field(default_factory=dict)   # hardware -> its step-time model
    probe_requests: int | str = ""      # requests a capacity probe runs
    # the files the plan read (scenario, space, a trace): ``save`` never writes over them
    inputs: tuple[Path, ...] = field(default=(), repr=False, compare=False)

    @property
    def met(self) -> bool:
        return self.winner is not None

    @property
    def simulated(self) -> int:
        return int(self.table["simulated"].sum())

    def row(self, index: int) -> pd.Series:
        return self.table.set_index("candidate").loc[index]

    def ranking(self) -> pd.DataFrame:
        """The winner and runners-up (or, when none meets the SLOs, the closest, with the
        latencies of one request alone on each); a replica count that rests on probes too
        short to load it steadily says so in its status."""
        ids = [self.winner, *self.runners_up] if self.met else self.closest
        cols = ["candidate", "deployment", "max_num_batched_tokens", "max_num_seqs",
                "replicas", "gpus", "cost_per_hour", "cost_per_million_output_tokens",
                "max_rate_per_copy", PARETO_Y, PARETO_X, "status"]
        if not self.met:     # (none serves the rate: no replica count or cost to show)
            cols[4:8] = ["lone_ttft_ms", "lone_tpot_ms"]
        table = self.table
        if "short_probe" in table:
            table = table.assign(status=table["status"].where(
                ~table["short_probe"].astype(bool), table["status"] + " (short probe)"))
        t = table.set_index("candidate", drop=False).loc[ids, [c for c in cols if c in table]]
        return t.reset_index(drop=True)

    def answer(self) -> str:
        """The plan in words."""
        from simserve.fmt import format_table
        n = len(self.table)
        removed = ", ".join(f"{b} {self.pruned.get(b, 0)}" for b in BOUNDS)
        lines = [f"plan for {self.target_rate:g} req/s of {self.model} ({self.scenario}): "
                 f"{n} candidate deployments; pruned by bound: {removed}; "
                 f"simulated {self.simulated}", ""]
        if self.met:
            w = self.row(self.winner)
            lines += [f"cheapest: {w['deployment']} (max_num_batched_tokens "
                      f"{w['max_num_batched_tokens']}, max_num_seqs {w['max_num_seqs']}) × "
                      f"{w['replicas']} replica(s) = {w['gpus']} GPU(s), "
                      f"${w['cost_per_hour']:.2f}/hour, "
                      f"${w['cost_per_million_output_tokens']:.3f} per million output tokens"]
            if bool(w.get("short_probe", False)):
                lines.append(f"warning: {w['reason']} (see the note below)")
            lines += ["", "vllm serve command (one per replica):"]
            lines += [f"  {c}" for c in self.commands]
            lines += ["", "the cheapest and the runners-up:"]
        else:
            lines += ["no deployment meets the SLOs at this rate; the closest:"]
        lines.append(format_table(self.ranking(), index=False))
        if self.pareto:
            lines += ["", f"Pareto frontier (output tokens/s per GPU against tokens/s per user, "
                          f"at each deployment's max rate): candidates "
                          f"{', '.join(map(str, self.pareto))}"]
        lines += ["", *self.assumptions()]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def assumptions(self) -> list[str]:
        """What the answer assumes, in words: the price of a GPU-hour of each hardware and
        where it comes from, the step-time model that times it, and how each candidate was
        probed."""
        prices = self.space.get("prices", {})
        lines = ["assumed:"]
        for name in self.clocks:
            p = next((v for k, v in prices.items() if k.lower() == str(name).lower()), None)
            price = (f"${p['price_per_hour']:g}/GPU-hour ("
                     + ("yours" if p["source"] == GIVEN_PRICE else "shipped default, an "
                        "assumption: plan.prices sets your own") + ")") if p else "no price"
            clock = self.clocks.get(str(name), "")
            lines.append(f"  {name}: {price}; step times: {clock}")
        sp = self.space
        lines.append(f"  each candidate probed with {self.probe_requests} requests a run, "
                     f"{sp.get('seeds')} seed(s) a rate, capacity to within "
                     f"{sp.get('tolerance', 0):.0%}")
        kinds = {("transferred" if "transferred" in c else "fitted" if "fitted" in c
                  else "estimate") for c in self.clocks.values()}
        if len(kinds) > 1:
            lines.append("  these cards are timed by step-time models of different standing "
                         "(fitted to measured runs on that hardware, transferred from "
                         "another, or estimates): compare costs across them with that in "
                         "mind")
        return lines

    def __repr__(self) -> str:
        answer = (f"cheapest: candidate {self.winner}, {self.row(self.winner)['deployment']}"
                  if self.met else "no deployment meets the SLOs")
        notes = f"; {len(self.notes)} note(s): .notes" if self.notes else ""
        return (f"<PlanResult {self.scenario}: {self.target_rate:g} req/s of {self.model}, "
                f"{len(self.table)} candidates, {self.simulated} simulated; {answer}{notes}; "
                f".answer(), .ranking(), .table, .probes>")

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "model": self.model, "target_rate": self.target_rate,
                "slo": self.slo, "met": self.met, "winner": self.winner,
                "runners_up": self.runners_up, "pareto": self.pareto, "closest": self.closest,
                "candidates": len(self.table), "pruned": self.pruned,
                "simulated": self.simulated, "vllm_serve": self.commands, "space": self.space,
                "notes": self.notes, "assumed": [a.strip() for a in self.assumptions()[1:]],
                "clocks": self.clocks, "probe_requests": self.probe_requests,
                "winner_row": _plain(self.row(self.winner).to_dict()) if self.met else None}

    def save(self, out: str | Path) -> Path:
        """Write ``plan.json`` (the answer), ``candidates.csv`` (and ``candidates.parquet``
        when pyarrow is installed: one row per candidate) and ``probes.csv``; refused before
        anything is written where they would replace a file the plan read, and another kind
        of output in ``out`` is replaced, as the CLI does."""
        keep_inputs(out, OUTPUT_FILES["plan"], self.inputs, "out")
        out = make_out_dir(out)
        clear_other_outputs(out, "plan", inputs=self.inputs)
        (out / "plan.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        self.table.to_csv(out / "candidates.csv", index=False, float_format="%.9g")
        if importlib.util.find_spec("pyarrow") is not None:
            self.table.to_parquet(out / "candidates.parquet", index=False)
        self.probes.to_csv(out / "probes.csv", index=False, float_format="%.9g")
        return out


def _plain(d: dict) -> dict:
    """JSON-ready values (numpy scalars and NaN as plain numbers and null)."""
    out = {}
    for k, v in d.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


# --- loading -----------------------------------------------------------------------------------

def load_plan_inputs(scenario: Scenario | Mapping | str | Path,
                     space: PlanSpace | Mapping | str | Path | None = None,
                     overrides: Sequence[str] | None = None) -> tuple[dict, Path, str, PlanSpace]:
    """The base scenario mapping (its ``plan:`` section taken out), its folder, its name and
    the space: ``space`` if given (a mapping, a plan file whose ``plan:`` section or whole
    mapping is the space), else the scenario's ``plan:`` section, else the defaults."""
    overrides = check_overrides(overrides)
    if isinstance(scenario, Scenario):
        if scenario.source is None:
            raise ConfigError("scenario", f"{scenario.name}: a scenario changed with replace() "
                                          "cannot be planned; plan the file or mapping it came "
                                          "from")
        raw, base_dir, name = copy.deepcopy(scenario.source), scenario.base_dir, scenario.name
    elif isinstance(scenario, Mapping):
        raw, base_dir, name = plain(copy.deepcopy(dict(scenario))), Path("."), \
            str(scenario.get("name", "scenario"))
    else:
        path = Path(scenario)
        raw = load_yaml(path)
        if not isinstance(raw, dict):
            raise DataError(path, "a scenario must be a YAML mapping (model:, hardware:, ...)")
        base_dir, name = path.parent, str(raw.get("name", path.stem))
    if "compare" in raw:
        raise ConfigError("compare", "a planned scenario cannot have compare:; the plan "
                                     "varies the deployment itself")
    apply_overrides(raw, overrides)     # --set plan.max_replicas=8 too
    plan_raw, where = raw.pop("plan", None), "plan"
    if isinstance(space, PlanSpace):
        return raw, base_dir, name, space
    if isinstance(space, (str, Path)):
        file_raw = load_yaml(space)
        plan_raw = file_raw.get("plan", file_raw) if isinstance(file_raw, dict) else file_raw
        where = f"{space}: plan" if isinstance(file_raw, dict) and "plan" in file_raw \
            else str(space)
    elif space is not None:
        plan_raw = space
    return raw, base_dir, name, PlanSpace.from_mapping(plan_raw, raw, where)


def _check_overrides(overrides: Sequence[str] | None, sp: PlanSpace, raw: dict) -> None:
    """Refuse a ``--set`` of a field every candidate sets itself (it would be dropped)."""
    varied = {"engine.tensor_parallel_size": "plan.tensor_parallel_size",
              "engine.pipeline_parallel_size": "plan.pipeline_parallel_size",
              "engine.enable_expert_parallel": "plan.expert_parallel",
              "cluster.replicas": "the replica search (plan.max_replicas)",
              "cluster.groups": "plan.disaggregation", "cluster.kv_transfer": "plan.kv_transfer"}
    for knob in ("max_num_batched_tokens", "max_num_seqs"):
        if all(v is not None for v in getattr(sp, knob)):     # None: the scenario's value
            varied[f"engine.{knob}"] = f"plan.{knob}"
    if list(sp.hardware) != [raw.get("hardware")]:   # the plan names other hardware
        varied["hardware"] = "plan.hardware"
    for where, key in given_fields(None, overrides):
        field = next((f for f in varied if key == f or key.startswith(f"{f}.")), None)
        if field is not None:
            raise ConfigError(where, f"simserve plan sets {field} for every "
                                              f"candidate, from {varied[field]}: this value "
                                              f"would be dropped; vary it there")


# --- building and bounding candidates ----------------------------------------------------------

@dataclass
class _Entry:
    cand: Candidate
    row: dict
    scenario: Scenario | None = None
    parsed: Scenario | None = None      # the candidate's scenario, if it parses
    start_rate: float = 0.0
    cost_lb: float = math.inf


def _divides(model, cand: Candidate) -> str:
    """Why the parallelism does not split the model (heads, layers, experts), or ""."""
    from simserve.kv.capacity import check_expert_parallel, check_tensor_parallel
    try:
        check_tensor_parallel(model, cand.tensor_parallel_size)
        check_expert_parallel(model, cand.tensor_parallel_size if cand.expert_parallel else 1)
    except ConfigError as err:
        return f"{err.field}: {err.message}"
    if cand.pipeline_parallel_size > model.num_layers:
        return (f"engine.pipeline_parallel_size: {cand.pipeline_parallel_size} stages for "
                f"{model.num_layers} layers")
    return ""


def _build(cand: Candidate, raw: dict, base_dir: Path, name: str, space: PlanSpace,
           lengths: Lengths, target: float, prune: bool, model) -> _Entry:
    from simserve.plan.capacity import with_rate
    row: dict[str, Any] = {**cand.to_dict(), "status": "", "pruned_by": None, "reason": None,
                           "simulated": False, "short_probe": False}
    e = _Entry(cand, row)
    why = _divides(model, cand)
    if why:
        return _pruned(e, "parallelism", why)
    try:
        s = parse_scenario(cand.fields(raw, space.kv_transfer), base_dir, name)
    except ConfigError as err:      # what simserve (or vLLM) refuses to combine
        return _pruned(e, "config", f"{err.field}: {err.message}")
    e.parsed = s
    row.update(max_num_batched_tokens=s.max_num_batched_tokens,   # resolved (vLLM's)
               max_num_seqs=s.engine.max_num_seqs)
    why = kv_fits(s)
    if why:
        return _pruned(e, "memory", why)
    p, d = cand.prefill_decode
    try:
        b = bound(s, lengths, max(p, 1), max(d, 1))
    except ConfigError as err:         # the latency model refuses it (a link it lacks)
        return _pruned(e, "config", f"{err.field}: {err.message}")
    row.update(rate_bound=b.rate_ub, lone_ttft_ms=1000 * b.lone_ttft_s,
               lone_tpot_ms=1000 * b.lone_tpot_s)
    if prune and b.slo_miss:
        return _pruned(e, "slo", b.slo_miss)
    copies = space.max_replicas // cand.unit_replicas
    if prune and b.rate_ub * copies < target:
        return _pruned(e, "throughput",
                       f"at most {b.rate_ub:.4g} req/s a copy, {copies} copies ≤ "
                       f"{space.max_replicas} replicas reach {b.rate_ub * copies:.4g}")
    need = 1 if math.isinf(b.rate_ub) else max(1, math.ceil(target / b.rate_ub))
    e.cost_lb = need * cand.unit_replicas * cand.gpus_per_replica * cand.price_per_hour
    row["cost_bound_per_hour"] = e.cost_lb
    e.start_rate = float(f"{b.sustained / 3:.4g}")   # capacity is often a third of the bound
    e.scenario = with_rate(s, e.start_rate)
    return e


def _clock(scenarios: list[Scenario]) -> str:
    """The step-time model that times these candidates (of one hardware), in words: fitted to
    measured runs on this hardware, transferred from another, or an estimate; with a fitted
    set, how many candidates lie outside its measured runs, and why (a run's trust note)."""
    from simserve.engine.build import scenario_curves
    from simserve.latency.trust import latency_trust
    s = scenarios[0]
    if s.latency.model != "roofline":
        return f"latency.model {s.latency.model}"
    try:
        curves = scenario_curves(s)
    except ConfigError as err:
        return f"roofline ({err.message})"
    if curves is None:
        return f"roofline from the {s.hardware.name} spec sheet (an estimate)"
    err_pct = curves.expected_error_pct
    if not err_pct:
        return f"roofline with the {curves.name} efficiency curves (an estimate)"
    on = (curves.corpus or {}).get("hardware")
    text = f"roofline with the {curves.name} curves, fitted to measured vLLM runs"
    if on and on != s.hardware.name:
        text += f" on {on} (transferred to {s.hardware.name})"
    elif "e2e_mean" in err_pct:
        text += f", median E2E mean error {err_pct['e2e_mean']:g} % within them"
    from simserve.workload import build_workload
    from simserve.workload.spec import longest_request
    reasons: dict[str, None] = {}
    out = 0
    longest: dict[int, int] = {}     # the longest request of each workload (one, usually)
    for c in scenarios:
        key = id(c.workload)
        if key not in longest:
            longest[key] = longest_request(build_workload(c.workload, c.seed, c.base_dir))
        trust = latency_trust(c, scenario_curves(c), longest[key]) or {}
        why = [w.split(":")[0] for w in trust.get("outside_corpus", [])
               if not w.startswith("hardware ")]      # (said above)
        out += bool(why)
        reasons.update(dict.fromkeys(why))
    if out:
        text += (f"; {out} of {len(scenarios)} candidates outside those runs "
                 f"({', '.join(reasons)})")
    return text


def _pruned(e: _Entry, which: str, reason: str) -> _Entry:
    e.row.update(status=f"pruned: {which}", pruned_by=which, reason=reason)
    return e


# --- the capacity search of one candidate (runs in a worker) -----------------------------------

SEARCH_FAILED = "search failed"     # a candidate's capacity search raised: nothing measured


def _search(job: tuple) -> tuple[dict | None, str | None]:
    """The capacity search (fewest replicas for the target) of one candidate."""
    from simserve.plan.capacity import SloUnreachable, capacity
    scenario, target, seeds, tolerance, max_replicas = job
    try:
        r = capacity(scenario, target_rate=target, seeds=seeds, tolerance=tolerance,
                     max_replicas=max_replicas)
    except SloUnreachable as e:     # measured: no load of it meets the SLO
        return {"unreachable": str(e), "probes": e.probes.to_dict("records"),
                "runs": len(e.probes)}, None
    except SimserveError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - recorded against the candidate, never fatal
        return None, f"{type(e).__name__}: {e}"
    p = r.probes
    at_max = p[(p["rate"] == r.max_rate) & (p["replicas"] == r.replicas)]
    out = {"max_rate": r.max_rate, "first_failing_rate": r.first_failing_rate,
           "replicas_needed": r.replicas_needed, "unit": r.replicas,
           "output_throughput_at_max": float(at_max["output_throughput"].mean()),
           "median_tpot_ms_at_max": float(at_max["median_tpot_ms"].mean()),
           "median_ttft_ms_at_max": float(at_max["median_ttft_ms"].mean()),
           "attainment_at_max": float(at_max["slo_attainment"].min()),
           "runs": len(p), "notes": r.notes, "probes": p.to_dict("records"),
           "short_probe": r.short_probe}
    if r.replicas_needed is not None:
        at = p[(p["rate"] == target) & (p["replicas"] == r.replicas_needed)]
        out["output_throughput_at_target"] = float(at["output_throughput"].mean())
        out["attainment_at_target"] = float(at["slo_attainment"].min())
    return out, None


def _record(e: _Entry, value: dict | None, error: str | None, probes: list[dict]) -> None:
    row, c = e.row, e.cand
    row["simulated"] = True
    row["start_rate"] = e.start_rate
    if value is None:
        row.update(status=SEARCH_FAILED, reason=error)
        return
    if "unreachable" in value:
        for pr in value["probes"]:
            probes.append({"candidate": c.index, **pr})
        row.update(status="not served", reason=value["unreachable"].removeprefix("capacity: "),
                   runs=value["runs"])
        return
    for pr in value["probes"]:
        probes.append({"candidate": c.index, **pr})
    gpus_copy = c.gpus_per_replica * c.unit_replicas
    row.update(max_rate_per_copy=value["max_rate"], runs=value["runs"],
               max_rate_per_gpu=value["max_rate"] / gpus_copy,
               median_ttft_ms_at_max=value["median_ttft_ms_at_max"],
               median_tpot_ms_at_max=value["median_tpot_ms_at_max"],
               attainment_at_max=value["attainment_at_max"])
    row[PARETO_Y] = value["output_throughput_at_max"] / gpus_copy
    tpot = value["median_tpot_ms_at_max"]
    row[PARETO_X] = 1000.0 / tpot if tpot and math.isfinite(tpot) and tpot > 0 else None
    cost_copy = gpus_copy * c.price_per_hour
    row["cost_per_million_output_tokens_at_max"] = \
        cost_copy / (3600 * value["output_throughput_at_max"]) * 1e6 \
        if value["output_throughput_at_max"] > 0 else None
    need = value["replicas_needed"]
    if need is None:
        row.update(status="not served", reason=f"{'; '.join(value['notes'])}")
        return
    gpus = need * c.gpus_per_replica
    if value["short_probe"]:
        row.update(short_probe=True,
                   reason=f"{need} replica(s) served the target only in probes too short to "
                          f"load them steadily (more than {need // c.unit_replicas} × the "
                          f"rate one copy misses at): a lower bound")
    row.update(status="serves target", replicas=need, gpus=gpus,
               cost_per_hour=gpus * c.price_per_hour,
               attainment_at_target=value["attainment_at_target"])
    tput = value["output_throughput_at_target"]
    row["cost_per_million_output_tokens"] = gpus * c.price_per_hour / (3600 * tput) * 1e6 \
        if tput > 0 else None


# --- the plan ----------------------------------------------------------------------------------

def plan(scenario: Scenario | Mapping | str | Path, target_rate: float, *,
         space: PlanSpace | Mapping | str | Path | None = None,
         overrides: Sequence[str] | None = None, executor: str = "local",
         workers: int | None = None, address: str | None = None, prune: bool = True,
         log: Log | None = None) -> PlanResult:
    """The cheapest deployment serving ``target_rate`` req/s within the scenario's SLOs, over
    the space of ``space`` (or the scenario's ``plan:`` section). ``prune=False`` simulates
    every candidate that can start (the exhaustive search the SLO, throughput and cost bounds
    are checked against). ``log`` gets a line per wave."""
    from simserve.plan.sweep import Executor
    target_rate = number("target_rate", target_rate)
    if not 0 < target_rate < math.inf:
        raise ConfigError("target_rate", f"must be > 0 and finite, got {target_rate!r}")
    overrides = check_overrides(overrides)
    if workers is not None:     # (a str failed at the first wave; 0 meant every core)
        workers = number("workers", workers, integer=True)
        if workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {workers}")
    check_log(log)
    log = log or (lambda line: None)
    base, sp, entries, pruned, notes = _built(scenario, target_rate, space, overrides, prune)
    queue = sorted((e for e in entries if e.scenario is not None),
                   key=lambda e: (e.cost_lb, e.cand.index))
    probes: list[dict] = []
    served: list[float] = []             # costs found, ascending
    keep = sp.runners_up + 1
    wave_no = 0
    with Executor(executor, workers, address) as pool:
        while queue:
            if prune and len(served) >= keep:
                limit = served[keep - 1]
                for e in [e for e in queue if e.cost_lb > limit]:
                    _pruned(e, "cost", f"cost bound ${e.cost_lb:.2f}/hour > the "
                                       f"{keep}th cheapest found (${limit:.2f}/hour)")
                    pruned["cost"] += 1
                queue = [e for e in queue if e.cost_lb <= limit]
                if not queue:
                    break
            wave, queue = queue[:sp.wave], queue[sp.wave:]
            # longest first (pipeline-parallel runs step every micro-batch), so the workers
            # finish a wave together; pruning waits for the whole wave, so what is simulated
            # does not depend on which finished first
            wave = sorted(wave, key=lambda e: -e.cand.pipeline_parallel_size)
            wave_no += 1
            jobs = [(e.scenario, target_rate, sp.seeds, sp.tolerance, sp.max_replicas)
                    for e in wave]
            for e, (value, error) in zip(wave, pool.map(_search, jobs)):
                _record(e, value, error, probes)
                if e.row["status"] == "serves target":
                    served.append(e.row["cost_per_hour"])
            served.sort()
            best = f"${served[0]:.2f}/hour" if served else "none yet"
            log(f"wave {wave_no}: {len(wave)} simulated, {len(queue)} left; cheapest so far "
                f"{best}")
    ran = [e for e in entries if e.row.get("simulated")]
    if ran and all(e.row["status"] == SEARCH_FAILED for e in ran):
        # nothing was measured, so "none meets the SLOs" would be a guess: the reason is the
        # input (a workload too short to find a capacity, say), the same for every candidate
        first = min(ran, key=lambda e: e.cand.index)
        raise SimserveError(f"plan: the capacity search failed for all {len(ran)} candidates "
                            f"simulated; candidate {first.cand.index} ({first.cand.label}): "
                            f"{first.row['reason']}")
    result = _result(base, target_rate, sp, entries, probes, pruned, notes)
    result.inputs = _plan_inputs(scenario, space, overrides)
    return result


def check_plan(scenario: str | Path, overrides: Sequence[str] | None = None) -> str:
    """``simserve validate`` of a scenario with a ``plan:`` section: its candidates built as
    the planner builds them (the base deployment itself need not start: every candidate
    replaces its hardware and parallelism); what can start, and a ``--set`` the planner would
    refuse, in words. ConfigError when none can start."""
    overrides = check_overrides(overrides)
    _, sp, entries, pruned, _ = _built(scenario, 1.0, None, overrides, prune=False,
                                       check_sets=False)
    left = sum(1 for e in entries if e.scenario is not None)
    removed = ", ".join(f"{b} {pruned[b]}" for b in ("parallelism", "config", "memory")
                        if pruned[b])
    text = (f"plan of {len(entries)} candidate deployments, {left} can start"
            + (f" (ruled out: {removed})" if removed else ""))
    try:                # a --set that `simserve plan` would refuse (`run` keeps it)
        _check_overrides(overrides, sp, load_plan_inputs(scenario, None, overrides)[0])
    except ConfigError as err:
        text += f"; simserve plan would refuse {err}"
    return text


def _built(scenario: Scenario | Mapping | str | Path, target_rate: float,
           space: PlanSpace | Mapping | str | Path | None, overrides: Sequence[str] | None,
           prune: bool, check_sets: bool = True
           ) -> tuple[Scenario, PlanSpace, list[_Entry], dict[str, int], list[str]]:
    """The plan's inputs read and every candidate built and bounded (nothing simulated but
    the lone requests of the bounds): the base scenario, the space, the candidates, how many
    each bound pruned, and the notes so far. ConfigError when no candidate can start or none
    can reach the rate."""
    from simserve.plan.capacity import _prepare
    raw, base_dir, name, sp = load_plan_inputs(scenario, space, overrides)
    if check_sets:      # (validate checks a file for run and plan alike: a --set run keeps)
        _check_overrides(overrides, sp, raw)
    base = parse_scenario(raw, base_dir, name)
    notes: list[str] = []
    base, _ = _prepare(base, notes)            # the SLO and workload capacity search needs
    if base.slo.ttft_ms is None and base.slo.e2el_ms is None:
        raise ConfigError("slo", "planning needs slo.ttft_ms or slo.e2el_ms: a queue that "
                                 "grows without bound breaks no TPOT limit, so without one "
                                 "every deployment would 'serve' any rate")
    if base.cluster.groups or base.cluster.replicas != 1:
        notes.append("the scenario's cluster replicas/groups are replaced by each candidate's")
    if base.latency.model != "roofline" and len(sp.hardware) > 1:
        raise ConfigError("plan.hardware", f"latency.model {base.latency.model} prices one "
                                           "device; planning across hardware needs latency."
                                           "model: roofline")
    if base.workload.arrival is not None and base.workload.arrival.num_requests is not None:
        raw = copy.deepcopy(raw)     # the count capacity search fixes, for every candidate
        w = raw.setdefault("workload", {})
        w.pop("duration", None)
        w["num_requests"] = base.workload.arrival.num_requests
    lengths = Lengths.of(base)
    cands = candidates(sp)
    entries = [_build(c, raw, base_dir, name, sp, lengths, target_rate, prune, base.model)
               for c in cands]
    pruned = {b: 0 for b in BOUNDS}
    for e in entries:
        if e.row["pruned_by"]:
            pruned[e.row["pruned_by"]] += 1
    if all(e.row["pruned_by"] in ("parallelism", "config", "memory") for e in entries):
        raise ConfigError("plan", f"no candidate of the {len(entries)} can start: the "
                                  "parallelism does not divide the model or the weights and one "
                                  "max_model_len request do not fit (widen "
                                  "plan.tensor_parallel_size / plan.hardware, or lower "
                                  "engine.max_model_len)")
    if all(e.row["pruned_by"] in ("parallelism", "config", "memory", "throughput")
           for e in entries) \
            and pruned["throughput"]:
        raise ConfigError("target_rate", f"{target_rate:g} req/s is beyond every candidate "
                                         f"with at most {sp.max_replicas} replicas (throughput "
                                         "bound); lower it or raise plan.max_replicas")
    return base, sp, entries, pruned, notes


def _result(base: Scenario, target: float, sp: PlanSpace, entries: list[_Entry],
            probes: list[dict], pruned: dict[str, int], notes: list[str]) -> PlanResult:
    by_card: dict[str, list[Scenario]] = {}
    for e in entries:
        if e.parsed is not None:
            by_card.setdefault(e.cand.hardware, []).append(e.parsed)
    clocks = {card: _clock(scenarios) for card, scenarios in by_card.items()}
    w = base.workload
    probe_requests: int | str = (w.trace.num_requests or "the trace's") if w.trace is not None \
        else (w.arrival.num_requests if w.arrival is not None else "")
    table = pd.DataFrame([e.row for e in entries])
    for col in ("replicas", "gpus", "cost_per_hour", "cost_per_million_output_tokens",
                "max_rate_per_copy", "max_rate_per_gpu", PARETO_X, PARETO_Y, "rate_bound",
                "cost_bound_per_hour", "lone_ttft_ms", "runs"):
        if col not in table:
            table[col] = None
    for col in ("replicas", "gpus", "runs"):
        if col in table:
            table[col] = table[col].astype("Int64")
    ok = table[table["status"] == "serves target"]
    ok = ok.assign(_rate=-ok["max_rate_per_gpu"]).sort_values(
        ["cost_per_hour", "_rate", "candidate"])
    ranked = [int(i) for i in ok["candidate"]]
    winner = ranked[0] if ranked else None
    runners = ranked[1:1 + sp.runners_up]
    short = [i for i in ranked[:1 + sp.runners_up]
             if bool(table.loc[table["candidate"] == i, "short_probe"].iloc[0])]
    if short:
        notes = [*notes, f"candidate(s) {', '.join(map(str, short))} (status 'short probe'): "
                         f"their replica counts served {target:g} req/s only in probes too "
                         f"short to load them steadily, so they (and their costs) are lower "
                         f"bounds; {_longer(base, probe_requests)} for a steady-state answer"]
    pareto = _pareto(table)
    closest: list[int] = []
    if winner is None:
        ran = table[table["max_rate_per_copy"].notna()]
        unit = (ran["prefill_replicas"] + ran["decode_replicas"]).clip(lower=1)
        ran = ran.assign(_share=-ran["max_rate_per_copy"] * (sp.max_replicas // unit))
        closest = [int(i) for i in ran.sort_values(["_share", "candidate"])["candidate"]]
        # then those that sustain no load, the best alone first (missed by the SLO bound, or
        # measured missing it at any rate)
        alone = table[(table["pruned_by"] == "slo") | (
            (table["status"] == "not served") & table["max_rate_per_copy"].isna())]
        alone = alone.sort_values(["lone_ttft_ms", "candidate"])
        closest = (closest + [int(i) for i in alone["candidate"]])[:5]
    commands: list[str] = []
    if winner is not None:
        e = next(e for e in entries if e.cand.index == winner)
        assert e.scenario is not None
        from simserve.plan.command import vllm_serve
        commands = vllm_serve(e.scenario, e.cand)
    probe_cols = ["candidate", "phase", "rate", "replicas", "seed", "slo_attainment",
                  "slo_met", "output_throughput", "median_ttft_ms", "median_tpot_ms"]
    probe_table = pd.DataFrame(probes)
    probe_table = probe_table[[c for c in probe_cols if c in probe_table]] if probes \
        else pd.DataFrame(columns=probe_cols)
    return PlanResult(
        scenario=base.name, model=base.model.name, target_rate=target,
        slo={k: v for k, v in base.slo.to_dict().items()}, space=sp.to_dict(), table=table,
        probes=probe_table, pruned=pruned, winner=winner, runners_up=runners, pareto=pareto,
        closest=closest, commands=commands, notes=notes, clocks=clocks,
        probe_requests=probe_requests)


def _plan_inputs(scenario: Any, space: Any, overrides: Any) -> tuple[Path, ...]:
    """The files a plan read: its scenario and space files (given as paths), and the files
    the scenario names (a trace, a profile)."""
    raw, base_dir, _, _ = load_plan_inputs(scenario, space, overrides)
    files = [Path(f) for f in (scenario, space) if isinstance(f, (str, os.PathLike))]
    if isinstance(scenario, Scenario) and scenario.path is not None:
        files.append(scenario.path)
    return (*files, *named_files(raw, base_dir))


def _longer(base: Scenario, probe_requests: int | str) -> str:
    """How to make every probe longer, in words."""
    if base.workload.trace is not None:
        return "replay more of the trace (workload.num_requests, workload.end_s) or a longer one"
    return f"raise workload.num_requests (now {probe_requests})"


def _pareto(table: pd.DataFrame) -> list[int]:
    """Candidates no other beats on both output tokens/s per GPU and tokens/s per user (at
    each one's max rate), by tokens/s per user ascending."""
    pts = table[table[PARETO_X].notna() & table[PARETO_Y].notna()]
    pts = pts.sort_values([PARETO_X, PARETO_Y, "candidate"], ascending=[False, False, True])
    front, best_y = [], -math.inf
    for _, r in pts.iterrows():
        if r[PARETO_Y] > best_y:
            front.append(int(r["candidate"]))
            best_y = r[PARETO_Y]
    return front[::-1]
