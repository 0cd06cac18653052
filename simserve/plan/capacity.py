"""Capacity planning: the highest request rate a deployment serves within its SLOs.

DistServe's goodput: the largest arrival rate at which the fraction of requests meeting every SLO
(``slo_attainment``) stays at or above the target ``slo.attainment`` — and every run-level
criterion the SLO gives holds (``slo.tbt_ms``: a percentile of all inter-token gaps, Sarathi-Serve's
P99 TBT; ``slo.scheduling_delay_ms``: its median scheduling delay; ``slo.normalized_latency_ms``:
the vLLM/Orca papers' mean normalized latency). Meeting the SLO is assumed to get harder as
the rate grows; the search is

1. *bracket* with one seed: from the scenario's rate, double until the target is missed (or
   halve until it is met);
2. *confirm* the passing end with every seed (halving again if a seed misses);
3. *bisect* (geometric midpoints), every probe with every seed, until
   ``(fail - pass) / pass <= tolerance``. The answer is the passing end: under the assumption,
   the true knee lies in ``[answer, answer * (1 + tolerance))``.

Seeds are aggregated by their **minimum** (a rate passes only if every seed meets the target, so
a probe stops at its first missing seed); the spread (min/mean/max over seeds) at the answer is
reported. ``num_requests`` stays fixed while the rate moves, so every probe sends the same work
(``hold="requests"``, the default). ``hold="duration"`` keeps the workload's ``duration``
instead: every probe sends that many seconds of arrivals at its rate, so more requests at a
higher rate, as a benchmark harness that runs each rate for a fixed time measures capacity
(DistServe's artifact: 100 s a rate). Short runs at an overloaded rate may still pass before
their queues build: the two answers differ most where a queue grows slowly.

The fewest replicas for a target rate is a search over ``cluster.replicas`` at that rate (same
seeds and aggregation), starting from the per-replica capacity found above; a count passed only
by probes that are one burst (every request arriving before the median one ends) is refused. So
is a max rate searched for alone whose probes are one burst; beside a target rate it is only
where the replica search starts, and stands flagged (``burst_max_rate``) with a note.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simserve.config import Scenario, as_scenario
from simserve.errors import ConfigError, SimserveError
from simserve.fmt import format_table
from simserve.limits import MAX_REPLICAS, MAX_REQUESTS, MAX_SECONDS
from simserve.paths import OUTPUT_FILES, clear_other_outputs, keep_inputs, make_out_dir
from simserve.plan.values import check_log, number

PROBE_METRICS = (
    "slo_attainment", "num_requests", "num_good", "completed", "num_rejected", "request_throughput",
    "request_goodput", "output_throughput", "duration_s",
    "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p90_tpot_ms",
    "p99_tpot_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "total_preemptions",
    "latency_model",
)
MAX_STEPS = 30          # doublings/halvings before the bracket search gives up
MIN_TOLERANCE = 1e-3    # bisection to a narrower bracket would outlast float precision
MAX_SEEDS = 100         # runs per probe
HOLDS = ("requests", "duration")    # what stays fixed while the rate moves


class SloUnreachable(SimserveError):
    """The SLO is missed even at a rate where requests rarely overlap: no load of this
    deployment meets it (``simserve plan`` records such a candidate as not serving the rate,
    not as a failed search). ``probes``: the runs that showed it (as ``CapacityResult``'s)."""

    def __init__(self, message: str, probes: pd.DataFrame):
        super().__init__(message)
        self.probes = probes


@dataclass
class CapacityResult:
    """The answer and every probe that supports it (``probes``: one row per run)."""

    scenario: str
    policy: str
    target_attainment: float
    max_rate: float                 # req/s for the whole cluster (the passing end)
    first_failing_rate: float       # the failing end of the final bracket
    tolerance: float
    seeds: list[int]
    replicas: int
    tensor_parallel_size: int
    spread: dict                    # attainment over seeds at max_rate: min, mean, max
    probes: pd.DataFrame
    target_rate: float | None = None
    replicas_needed: int | None = None
    aggregate: str = "min"
    slo: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    data_parallel_size: int = 1     # DP + EP (#18): ranks of a replica, each TP GPUs
    pipeline_parallel_size: int = 1  # stages of a replica, each TP GPUs
    hold: str = "requests"          # what every probe kept fixed: the count, or the duration
    # the replica count serves the target only in a probe too short to load it steadily (the
    # count is then a lower bound: ``notes`` says so)
    short_probe: bool = False
    # max_rate passed only in probes that are one burst (given a target_rate; alone it is
    # refused): bounded by the probe size, not sustained (``notes`` says so)
    burst_max_rate: bool = False
    # the files the search read (its scenario file, a trace): ``save`` never writes over them
    inputs: tuple[Path, ...] = field(default=(), repr=False, compare=False)

    def __repr__(self) -> str:
        need = "" if self.target_rate is None else (
            f", {self.replicas_needed} replica(s) for {self.target_rate:g} req/s"
            if self.replicas_needed is not None else
            f", no replica count found for {self.target_rate:g} req/s")
        notes = f"; {len(self.notes)} note(s): .notes" if self.notes else ""
        return (f"<CapacityResult {self.scenario}: max rate {self.max_rate:.4g} req/s on "
                f"{self.replicas} replica(s){need}{notes}; .table(), .rate_table(), "
                f".probes ({len(self.probes)} runs)>")

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size * self.pipeline_parallel_size

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def per_gpu_rate(self) -> float:
        return self.max_rate / self.gpus

    def rate_table(self) -> pd.DataFrame:
        """Rate → attainment over the seeds run there, at the scenario's replica count."""
        p = self.probes[self.probes["replicas"] == self.replicas]
        g = p.groupby("rate")["slo_attainment"]
        table = pd.DataFrame({"seeds": g.size(), "min attainment": g.min(),
                              "mean attainment": g.mean(), "max attainment": g.max()})
        table["meets target"] = p.groupby("rate")["slo_met"].all()
        table.index = [f"{r:.4g}" for r in table.index]
        table.index.name = "rate (req/s)"
        return table

    def table(self) -> str:
        """The answer in words, with the runs that support it."""
        slo = ", ".join(f"{k} ≤ {v:g}" for k, v in self.slo.items() if v is not None)
        lines = [
            f"capacity of {self.scenario}: SLO {slo}, target attainment "
            f"{self.target_attainment:.0%} ({self.aggregate} over {len(self.seeds)} seeds)",
            "",
            format_table(self.rate_table()),
            "",
            f"max rate: {self.max_rate:.3g} req/s "
            f"(target missed at {self.first_failing_rate:.3g} req/s; tolerance "
            f"{self.tolerance:.0%})",
            f"attainment at max rate over seeds: min {self.spread['min']:.1%}, "
            f"mean {self.spread['mean']:.1%}, max {self.spread['max']:.1%}",
            f"per GPU: {self.per_gpu_rate:.3g} req/s ({self.replicas} replica(s) × TP "
            f"{self.tensor_parallel_size}"
            + (f" × DP {self.data_parallel_size}" if self.data_parallel_size > 1 else "")
            + (f" × PP {self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1
               else "")
            + f" = {self.gpus} GPU(s))",
        ]
        if self.target_rate is not None:
            need = (f"{self.replicas_needed} replica(s) = "
                    f"{self.replicas_needed * self.gpus_per_replica} GPU(s)"
                    if self.replicas_needed is not None else "not found (see notes)")
            lines.append(f"replicas for {self.target_rate:g} req/s: {need}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario, "policy": self.policy, "slo": self.slo,
            "target_attainment": self.target_attainment, "max_rate": self.max_rate,
            "first_failing_rate": self.first_failing_rate, "per_gpu_rate": self.per_gpu_rate,
            "replicas": self.replicas, "tensor_parallel_size": self.tensor_parallel_size,
            "gpus": self.gpus, "tolerance": self.tolerance, "seeds": self.seeds,
            "aggregate": self.aggregate, "spread": self.spread, "target_rate": self.target_rate,
            "replicas_needed": self.replicas_needed, "notes": self.notes,
            **({"data_parallel_size": self.data_parallel_size}
               if self.data_parallel_size > 1 else {}),
            **({"pipeline_parallel_size": self.pipeline_parallel_size}
               if self.pipeline_parallel_size > 1 else {}),
            **({"hold": self.hold} if self.hold != "requests" else {}),
            **({"short_probe": True} if self.short_probe else {}),
            **({"burst_max_rate": True} if self.burst_max_rate else {}),
        }

    def save(self, out: str | Path) -> Path:
        """Write ``capacity.json`` (the answer) and ``probes.csv`` (every run); refused
        before anything is written where they would replace a file the search read, and
        another kind of output in ``out`` is replaced, as the CLI does."""
        keep_inputs(out, OUTPUT_FILES["capacity"], self.inputs, "out")
        out = make_out_dir(out)
        clear_other_outputs(out, "capacity", inputs=self.inputs)
        (out / "capacity.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        self.probes.to_csv(out / "probes.csv", index=False, float_format="%.9g")
        return out


Log = Callable[[str], None]


class _Prober:
    """Runs (rate, replicas, seed) probes once each and keeps every row."""

    def table(self) -> pd.DataFrame:
        """Every probe run so far, one row each."""
        return pd.DataFrame(self.rows, columns=["phase", "rate", "replicas", "seed",
                                                *PROBE_METRICS, "slo_met"])

    def __init__(self, base: Scenario, seeds: list[int], log: Log, bar: Any = None,
                 held_duration: float | None = None):
        self.base, self.seeds, self.bar = base, seeds, bar
        self.held_duration = held_duration    # hold="duration": every probe's seconds
        if bar is not None:     # log lines printed around the bar, not through it
            def log_beside_bar(line: str) -> None:
                with bar.external_write_mode():
                    log(line)
            self.log = log_beside_bar
        else:
            self.log = log
        self.rows: list[dict] = []
        self.cache: dict[tuple, dict] = {}

    def attainment(self, rate: float, replicas: int, seed: int, phase: str) -> float:
        from simserve.runner import run
        key = (rate, replicas, seed)
        arrival = self.base.workload.arrival
        if arrival is not None and arrival.duration_s is not None \
                and rate * arrival.duration_s > MAX_REQUESTS:
            raise SimserveError(
                f"capacity: a probe of {arrival.duration_s:g} s at {rate:.3g} req/s would send "
                f"over {MAX_REQUESTS:,} requests; the SLO still holds below that rate (tighten "
                f"the SLO or shorten workload.duration)")
        if key not in self.cache:
            result = run(with_rate(self.base, rate, replicas, seed))
            summary = result.summary
            row = {"phase": phase, "rate": rate, "replicas": replicas, "seed": seed,
                   **{m: summary.get(m) for m in PROBE_METRICS}}
            arrivals = result.request_column("arrival_s")
            # first to last arrival (not in probes.csv): is the probe a load or one burst?
            row["arrival_span_s"] = float(arrivals.max() - arrivals.min()) if len(arrivals) \
                else 0.0
            # met: the attainment target and every run-level criterion (slo.AGGREGATES)
            row["slo_met"] = bool(summary.get("slo_met"))
            for k in ("slo_tbt_ms", "slo_scheduling_delay_ms", "slo_normalized_latency_ms"):
                if k in summary:
                    row[k] = summary[k]
            self.cache[key] = row
            self.rows.append(row)
            self._check_duration(row)
            extra = "".join(f", {k[4:-3].replace('_', ' ')} {row[k]:.1f} ms"
                            for k in ("slo_tbt_ms", "slo_scheduling_delay_ms",
                                      "slo_normalized_latency_ms") if k in row)
            if self.bar is not None:
                self.bar.update(1)
            self.log(f"  {phase:8s} rate {rate:9.4g} req/s  replicas {replicas:3d}  seed {seed}: "
                     f"attainment {row['slo_attainment']:.3f}{extra} "
                     f"({'meets' if row['slo_met'] else 'misses'} target)")
        return self.cache[key]["slo_attainment"]

    def _check_duration(self, row: dict) -> None:
        """Holding the duration, a probe that meets the SLO must outlast its requests: if the
        median request lives longer than the whole window of arrivals, the probe is one burst
        that ends before any queue can build, and its rate means nothing (1 ms of arrivals
        "held" 1.2e5 req/s of Llama-3.1-8B on one H100)."""
        d = self.held_duration
        e2el = row.get("median_e2el_ms")
        if d is None or not row["slo_met"] or e2el is None or not e2el / 1000 > d:
            return
        raise ConfigError(
            "workload.duration",
            f"{d:g} s is too short to hold a request: at {row['rate']:.3g} req/s the median "
            f"request lasted {e2el:.3g} ms, longer than the whole probe, so each probe is one "
            f"burst that ends before a queue can build, not a sustained rate; give a duration "
            f"many times a request's latency (DistServe held each rate for 100 s)")

    def met(self, rate: float, replicas: int, seed: int, phase: str) -> bool:
        self.attainment(rate, replicas, seed, phase)
        return self.cache[(rate, replicas, seed)]["slo_met"]

    def passes(self, rate: float, replicas: int, phase: str, all_seeds: bool = True) -> bool:
        """Every seed meets the SLO (attainment ≥ target and the run-level criteria); stops at
        the first seed that misses."""
        for seed in self.seeds if all_seeds else self.seeds[:1]:
            if not self.met(rate, replicas, seed, phase):
                return False
        return True


def with_rate(s: Scenario, rate: float, replicas: int | None = None,
              seed: int | None = None) -> Scenario:
    """The scenario at another arrival rate (and replica count, seed); num_requests kept."""
    w = s.workload
    if w.trace is not None:
        w = dataclasses.replace(w, trace=dataclasses.replace(w.trace, rate=rate, time_scale=1.0))
    else:
        w = dataclasses.replace(w, arrival=dataclasses.replace(w.arrival, rate=rate))
    changes = {"workload": w}
    if replicas is not None:
        changes["cluster"] = scaled_cluster(s.cluster, replicas)
    if seed is not None:
        changes["seed"] = seed
    return s.replace(**changes)


def unit_size(cluster) -> int:
    """Replicas in one copy of the cluster's deployment: all replicas of its groups (a
    disaggregated cluster grows by whole copies, keeping its prefill:decode ratio), else 1."""
    return sum(g.replicas for g in cluster.groups) if cluster.groups else 1


def scaled_cluster(cluster, replicas: int):
    """The cluster with ``replicas`` replicas; a cluster of groups as ``replicas / unit``
    copies of its groups (``replicas`` a multiple of :func:`unit_size`)."""
    if not cluster.groups:
        return dataclasses.replace(cluster, replicas=replicas)
    unit = unit_size(cluster)
    if replicas % unit:
        raise ValueError(f"{replicas} replicas are not whole copies of {unit}")
    k = replicas // unit
    groups = tuple(dataclasses.replace(g, replicas=g.replicas * k) for g in cluster.groups)
    return dataclasses.replace(cluster, replicas=replicas, groups=groups)


def _prepare(s: Scenario, notes: list[str], hold: str = "requests") -> tuple[Scenario, float]:
    """Check the scenario can be searched over rate; fix num_requests (or, holding the
    duration, check there is one); the start rate."""
    if s.slo.is_empty:
        raise ConfigError("slo", "capacity planning needs an SLO: give slo.ttft_ms, "
                                 "slo.tpot_ms, slo.e2el_ms, slo.tbt_ms, "
                                 "slo.scheduling_delay_ms and/or slo.normalized_latency_ms")
    w = s.workload
    if w.trace is not None:
        if hold == "duration":
            raise ConfigError("hold", "a trace replays its own requests at every rate: holding "
                                      "the duration needs a synthetic workload with "
                                      "workload.duration")
        if w.trace.rate is None:
            raw = s.source.get("workload") if isinstance(s.source, dict) else None
            scaled = isinstance(raw, dict) and raw.get("time_scale") is not None
            raise ConfigError("workload.rate", "capacity planning rescales a trace by its mean "
                                               "rate: give workload.rate (a starting rate)"
                              + (" and drop workload.time_scale (a trace takes one or the "
                                 "other), e.g. --set workload.time_scale=null --set "
                                 "workload.rate=5" if scaled else ""))
        return s, w.trace.rate
    a = w.arrival
    if a.rate is None or a.rate == math.inf:
        raise ConfigError("workload.arrival", "capacity planning needs a finite arrival rate; "
                                              "arrival: burst and rate: inf have none")
    if hold == "duration":
        if a.duration_s is None:
            raise ConfigError("workload.duration", "holding the duration while the rate is "
                                                   "searched needs workload.duration (seconds "
                                                   "of arrivals a probe) in place of "
                                                   "num_requests")
        notes.append(f"every probe: {a.duration_s:g} s of arrivals at its rate (hold: "
                     f"duration)")
        return s, a.rate
    if a.num_requests is None:
        # a fixed duration would send more requests at higher rates; fix the count instead
        n = max(1, round(a.rate * a.duration_s))
        notes.append(f"workload.duration {a.duration_s:g} s at {a.rate:g} req/s replaced by "
                     f"num_requests {n}, fixed while the rate is searched")
        arrival = dataclasses.replace(a, num_requests=n, duration_s=None)
        s = s.replace(workload=dataclasses.replace(w, arrival=arrival))
    return s, a.rate


def capacity(scenario: Scenario | Mapping[str, Any] | str | Path, *,
             target_rate: float | None = None, tolerance: float = 0.05, seeds: int = 3,
             overrides: Sequence[str] | None = None, max_replicas: int = 256,
             log: Log | None = None, progress: bool = False,
             hold: str = "requests") -> CapacityResult:
    """Find the highest rate meeting the SLO attainment target (and, given ``target_rate``,
    the fewest replicas that serve it). ``log`` gets one line per probe; ``progress`` shows
    a bar counting probes on stderr (a bisection's length is not known ahead: no ETA).
    ``hold``: what every probe keeps fixed, ``"requests"`` (the count) or ``"duration"`` (the
    workload's seconds of arrivals; module docstring)."""
    # the comparisons below would raise a bare TypeError ("x" < 1) or pass a 1.5 on
    tolerance = number("tolerance", tolerance)
    seeds = number("seeds", seeds, integer=True)
    target_rate = None if target_rate is None else number("target_rate", target_rate)
    max_replicas = number("max_replicas", max_replicas, integer=True)
    check_log(log)
    # a bracket narrower than 1e-3 needs bisection steps past float precision (never ends)
    if not MIN_TOLERANCE <= tolerance < 1:
        raise ConfigError("tolerance", f"must be in [{MIN_TOLERANCE:g}, 1), got {tolerance:g}")
    if not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError("seeds", f"must be >= 1 and <= {MAX_SEEDS}, got {seeds}")
    if target_rate is not None and not 0 < target_rate < math.inf:
        raise ConfigError("target_rate", f"must be > 0 and finite, got {target_rate:g}")
    if hold not in HOLDS:
        raise ConfigError("hold", f"must be one of {', '.join(HOLDS)}, got {hold!r}")
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise ConfigError("max_replicas", f"must be >= 1 and <= {MAX_REPLICAS}, got "
                                          f"{max_replicas}")
    s = as_scenario(scenario, overrides)
    notes: list[str] = []
    s, start = _prepare(s, notes, hold)
    if hold == "duration" and target_rate is not None:
        duration = s.workload.arrival.duration_s
        if target_rate * duration > MAX_REQUESTS:
            raise ConfigError("target_rate", f"{target_rate:g} req/s for workload.duration "
                                             f"{duration:g} s is over {MAX_REQUESTS:,} requests "
                                             f"a probe")
    seed_list = [s.seed + k for k in range(seeds)]
    if s.workload.trace is not None and seeds > 1:
        notes.append("a trace replays the same requests whatever the seed: one seed used")
        seed_list = seed_list[:1]
    probes = None
    if progress:
        from simserve.progress import bar
        probes = bar(None, "capacity", "probe")
    prober = _Prober(s, seed_list, log or (lambda line: None), probes,
                     s.workload.arrival.duration_s if hold == "duration" else None)
    replicas = s.cluster.replicas

    lo, hi = _bracket(prober, start, replicas, s.workload)
    for _ in range(MAX_STEPS):
        if prober.passes(lo, replicas, "confirm"):
            break
        lo, hi = lo / 2, lo                                 # a later seed misses: step down
    else:
        raise SloUnreachable(f"capacity: some seed misses the target even at {lo:.3g} req/s",
                             prober.table())
    while (hi - lo) / lo > tolerance:
        mid = math.sqrt(lo * hi)
        if prober.passes(mid, replicas, "bisect"):
            lo = mid
        else:
            hi = mid
    burst = hold == "requests" and _burst_max_rate(prober, lo, replicas, target_rate, notes)
    spread_at = [prober.cache[(lo, replicas, seed)]["slo_attainment"] for seed in prober.seeds]
    spread = {"min": min(spread_at), "mean": sum(spread_at) / len(spread_at),
              "max": max(spread_at)}

    needed, short_probe = None, False
    if target_rate is not None:
        unit = unit_size(s.cluster)
        needed = _fewest_replicas(prober, target_rate, lo / (replicas // unit),
                                  max_replicas // unit, unit)
        if needed is not None and hold == "requests":
            _check_loaded(prober, target_rate, needed, lo / (replicas // unit), unit)
        if needed is None:
            notes.append(f"{max_replicas} replicas do not serve {target_rate:g} req/s within "
                         f"the SLO (raise max_replicas, or the SLO cannot be met at any size)")
        elif needed // unit * (hi / (replicas // unit)) < target_rate:
            # more than linear: n copies serving more than n times the rate one copy misses
            # at is a transient, a probe too short for a steady load (one burst is refused by
            # _check_loaded above)
            short_probe = True
            one = "copy" if unit > 1 else "replica"
            notes.append(f"{needed} replica(s) meet the SLO at {target_rate:g} req/s, more "
                         f"than {needed // unit} x the {hi / (replicas // unit):.3g} req/s one "
                         f"{one} misses at: a probe too short to load them steadily (each "
                         f"{one} gets a share of its requests, arriving within a short time); "
                         f"raise "
                         f"workload.num_requests (or workload.duration) for a steady-state "
                         f"answer")

    if probes is not None:
        probes.close()
    return CapacityResult(
        scenario=s.name, policy=s.policy, target_attainment=s.slo.attainment, max_rate=lo,
        first_failing_rate=hi, tolerance=tolerance, seeds=prober.seeds, replicas=replicas,
        tensor_parallel_size=s.engine.tensor_parallel_size, spread=spread,
        probes=prober.table(),
        target_rate=target_rate, replicas_needed=needed,
        slo={k: v for k, v in s.slo.to_dict().items() if k != "attainment"}, notes=notes,
        data_parallel_size=s.engine.data_parallel_size,
        pipeline_parallel_size=s.engine.pipeline_parallel_size, hold=hold,
        short_probe=short_probe, burst_max_rate=burst, inputs=tuple(_run_inputs(s)))


def _run_inputs(s: Scenario) -> list[Path]:
    from simserve.runner import run_inputs      # (imported late, as run is: runner loads late)
    return run_inputs(s)


def _check_loaded(prober: _Prober, rate: float, replicas: int, per_unit: float,
                  unit: int) -> None:
    """Refuse a replica count whose probes at ``rate`` are one burst: with every seed, all
    requests arrived before the median one finished (the rule ``_check_duration`` applies to
    a held duration), so no replica ever held a load and the count answers nothing (50
    requests at 1000 req/s "needed" 45 replicas of a 10 req/s engine). A probe that outlasts
    its median request but still passes more than linearly keeps its answer, with a note."""
    row = _one_burst(prober, rate, replicas)
    if row is None:
        return
    e2el = row["median_e2el_ms"]
    need = _outlasting(rate, e2el)
    one = "copy" if unit > 1 else "replica"
    fix = (_more_requests(prober, need, "", row["num_requests"]) + ", or give a lower target"
           if need <= MAX_REQUESTS else
           f"outlasting one request at this rate takes over {MAX_REQUESTS:,} requests, a "
           f"run's most: give a lower target")
    raise ConfigError(
        "target_rate",
        f"{rate:g} req/s is one burst for a probe of {row['num_requests']:,} requests: they "
        f"arrive within {_span(row['arrival_span_s'] * 1000)}, less than the {_span(e2el)} "
        f"the median request lasted on {replicas} replica(s), so no replica ever held a load "
        f"and the {replicas} replica(s) it passes mean nothing; {fix} (one {one} serves "
        f"{per_unit:.3g} req/s)")


def _one_burst(prober: _Prober, rate: float, replicas: int) -> dict | None:
    """The first seed's probe at (``rate``, ``replicas``) if, with every seed, all requests
    arrived before the median one finished (the probe is one burst, not a load), else None."""
    rows = [prober.cache[(rate, replicas, seed)] for seed in prober.seeds]
    if all(r["median_e2el_ms"] is not None and r["arrival_span_s"] < r["median_e2el_ms"] / 1000
           for r in rows):
        return rows[0]
    return None


def _span(ms: float) -> str:
    """A time in ms, or in s from a second on (2.56 s, not 2.56e+03 ms)."""
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1000:.3g} s"


def _outlasting(rate: float, e2el_ms: float) -> int:
    """The fewest requests whose arrivals at ``rate`` outlast one request of ``e2el_ms``."""
    return math.floor(rate * e2el_ms / 1000) + 2      # (n - 1) / rate > one median request


def _more_requests(prober: _Prober, need: int, at: str, have: int) -> str:
    """The advice for a probe of ``have`` requests, too short: ``need`` outlast one (``at``:
    at that rate), asked of the workload: more synthetic requests, or a longer trace (whose
    rows ``num_requests`` only caps)."""
    why = f"the fewest that outlast one request{' ' + at if at else ''}"
    if prober.base.workload.trace is not None:
        return (f"replay a trace of at least {need:,} requests, {why} (this one gives "
                f"{have:,}; workload.num_requests only caps a trace's rows)")
    return f"raise workload.num_requests to at least {need:,}, {why} (many times that for a " \
           f"steady state)"


def _burst_max_rate(prober: _Prober, rate: float, replicas: int,
                    target_rate: float | None, notes: list[str]) -> bool:
    """Whether the max rate found passed only in probes that are one burst (``_check_loaded``'s
    rule): every request arrived before the median one ended, so no queue could build and any
    rate up to all-at-once would pass as well; the probe size, not the deployment, set the
    answer. Searched for alone, the max rate is the answer and is refused, as a burst replica
    count is; with ``target_rate`` the answer is the replica count (checked on its own), and
    the max rate, only where its search started, stands with a note. Holding the duration,
    ``_check_duration`` has refused such a probe already."""
    row = _one_burst(prober, rate, replicas)
    if row is None:
        return False
    e2el = row["median_e2el_ms"]
    need = _outlasting(rate, e2el)
    fix = (_more_requests(prober, need, "at that rate", row["num_requests"])
           if need <= MAX_REQUESTS else
           f"outlasting one request at that rate takes over {MAX_REQUESTS:,} requests, a run's "
           f"most: tighten the SLO")
    burst = (f"{rate:.3g} req/s, the highest rate found to meet the SLO, is one burst for a "
             f"probe of {row['num_requests']:,} requests: they arrive within "
             f"{_span(row['arrival_span_s'] * 1000)}, less than the {_span(e2el)} the median "
             f"request lasted, so no queue ever built")
    if target_rate is None:
        raise ConfigError("workload.num_requests", f"{burst} and the rate means nothing; {fix}")
    notes.append(f"max rate: {burst}: it is bounded by the probe size, not a rate the "
                 f"deployment sustains (the replica count is checked on its own); {fix}")
    return True


def _bracket(prober: _Prober, rate: float, replicas: int, workload) -> tuple[float, float]:
    """(passing rate, failing rate) a factor 2 apart, probing the first seed only."""
    if prober.passes(rate, replicas, "bracket", all_seeds=False):
        for _ in range(MAX_STEPS):
            if not prober.passes(rate * 2, replicas, "bracket", all_seeds=False):
                return rate, rate * 2
            rate *= 2
        n = _num_requests(workload)
        if n is None:            # holding the duration: the probe held rate × duration
            raise SimserveError(
                f"capacity: SLO attainment still meets the target at {rate:.3g} req/s, with "
                f"{rate * workload.arrival.duration_s:.3g} requests a probe; lengthen "
                f"workload.duration or tighten the SLO")
        raise SimserveError(
            f"capacity: SLO attainment still meets the target at {rate:.3g} req/s, where the "
            f"{n} requests arrive almost at once; raise workload.num_requests or tighten the SLO")
    duration = workload.arrival.duration_s if workload.arrival is not None else None
    for _ in range(MAX_STEPS):
        n = _num_requests(workload)
        if isinstance(n, int) and (n - 1) / (rate / 2) > MAX_SECONDS:
            break                     # slower still would not fit a run's clock
        if duration is not None and rate / 2 * duration < 1:
            break                     # a timed probe slower still would hold one request
        if prober.passes(rate / 2, replicas, "bracket", all_seeds=False):
            return rate / 2, rate
        rate /= 2
    raise SloUnreachable(
        f"capacity: SLO attainment is below the target even at {rate:.3g} req/s, where "
        f"requests rarely overlap; the SLO cannot be met by this deployment (check the limits "
        f"against one request's latency)", prober.table())


def _num_requests(workload) -> int | str | None:
    if workload.trace is not None:
        return workload.trace.num_requests or "trace's"
    return workload.arrival.num_requests


def _fewest_replicas(prober: _Prober, rate: float, per_unit: float,
                     max_units: int, unit: int = 1) -> int | None:
    """The smallest replica count whose run at ``rate`` meets the target (integer bisection
    between a failing and a passing count; 0 replicas fails by definition). The count moves in
    whole copies of ``unit`` replicas (a disaggregated cluster's groups); ``per_unit`` is the
    rate one copy serves, ``max_units`` the most copies tried."""
    if max_units < 1:
        return None

    def passes(units: int) -> bool:
        return prober.passes(rate, units * unit, "replicas")

    guess = min(max(1, math.ceil(rate / per_unit)), max_units)
    if passes(guess):
        # the guess is usually right: check one fewer before bisecting below it
        if guess == 1 or not passes(guess - 1):
            return guess * unit
        lo, hi = 0, guess - 1
    else:
        lo, hi = guess, None
        while hi is None:
            if lo >= max_units:
                return None
            n = min(lo * 2, max_units)
            if passes(n):
                hi = n
            else:
                lo = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi * unit

