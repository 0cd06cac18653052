"""The Python API: ``simserve.run(scenario) -> Result`` with pandas DataFrames.

Builds replicas (block manager + policy + latency model) from a scenario, runs the engine, and
turns what the recorder saw into tables. Writing files is ``Result.save``'s job alone.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
from contextlib import contextmanager
from itertools import chain
from operator import attrgetter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from simserve.config import Scenario, load_scenario, load_variants, num_host_blocks, \
    num_kv_blocks
from simserve import deployment
from simserve.cluster import GroupConfig, cluster_summary, engine_options, groups_of
from simserve.engine import STEP_COLUMNS, Recorder, Replica, simulate
from simserve.errors import ConfigError, SimserveError
from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.latency.base import LatencyModel
from simserve.metrics.slo import SloConfig
from simserve.paths import rebase_paths
from simserve.metrics.summary import WeightedSample, format_summary, grouped_levels, summarize
from simserve.sched import POLICIES, SchedulerLimits
from simserve.sched.request import Status
from simserve.workload import build_workload

REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "num_prompt_tokens", "num_output_tokens", "status",
    "reject_reason", "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "ttft_s", "e2el_s", "tpot_s", "priority", "class", "num_cached_tokens",
)


@dataclass
class Result:
    """One simulated run: per-request and per-step tables, token times and the summary."""

    scenario: Scenario
    requests: pd.DataFrame
    _steps: pd.DataFrame | None
    summary: dict
    latency_label: str = ""
    warnings: list[str] = field(default_factory=list)
    _recorder: Recorder | None = field(default=None, repr=False)
    _runs: list | None = field(default=None, repr=False)   # (runs, step ends, delay) per row
    _token_times: list | None = field(default=None, repr=False)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine iteration (built on first use: a long run has millions)."""
        if self._steps is None:
            self._steps = steps_frame(self._recorder)
        return self._steps

    @property
    def num_steps(self) -> int:
        """Engine iterations simulated, all replicas together (``len(steps)``, without
        building the table)."""
        if self._steps is not None or self._recorder is None:
            return len(self.steps)
        return sum(len(log.steps["start_s"]) for log in self._recorder.replicas.values())

    @property
    def has_token_times(self) -> bool:
        return self._runs is not None

    @property
    def token_times(self) -> list[np.ndarray]:
        """Every output token's time, one array per row of ``requests`` (empty if rejected).
        Recorded only when asked for: ``run(..., record_tokens=True)``."""
        if self._runs is None:
            raise SimserveError("token times were not recorded; run with record_tokens=True "
                                "(CLI: --tokens)")
        if self._token_times is None:
            out = []
            for runs, ends, delay in self._runs:
                if not runs:
                    out.append(np.empty(0))
                    continue
                e = np.frombuffer(ends, dtype=np.float64)
                times = np.concatenate([e[a:b] for a, b in runs])
                out.append(times + delay if delay else times)
            self._token_times = out
        return self._token_times

    def table(self) -> str:
        """The printed summary (``vllm bench serve`` layout)."""
        title = f"simserve: {self.scenario.name} ({self.scenario.policy})"
        return format_summary(self.summary, title=title)

    def tokens(self) -> pd.DataFrame:
        """Every output token: ``request_id``, ``token_index`` (0-based), ``time_s``."""
        ids = self.requests["request_id"].to_numpy()
        counts = [len(t) for t in self.token_times]
        return pd.DataFrame({
            "request_id": np.repeat(ids, counts),
            "token_index": np.concatenate([np.arange(c) for c in counts]) if counts else [],
            "time_s": np.concatenate(self.token_times) if counts else [],
        })

    def save(self, out_dir: str | Path, *, tokens: bool = False) -> Path:
        """Write scenario.yaml, requests.csv, steps.csv, summary.json (and tokens.csv when
        asked); the same scenario and seed give byte-identical files."""
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SimserveError(f"{out}: cannot create output directory ({e.strerror})") from None
        (out / "scenario.yaml").write_text(scenario_yaml(self.scenario, out))
        self.requests.to_csv(out / "requests.csv", index=False, float_format="%.9g")
        self.steps.to_csv(out / "steps.csv", index=False, float_format="%.9g")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        if tokens and self.has_token_times:
            self.tokens().to_csv(out / "tokens.csv", index=False, float_format="%.9g")
        return out


def scenario_yaml(s: Scenario, out: Path) -> str:
    """The resolved scenario as written to ``out``: its file paths relative to ``out`` (so it
    reruns from there), and the ``--set`` overrides that made it named in a header comment."""
    header = "".join(f"# --set {o}\n" for o in s.overrides)
    if header:
        header = "# resolved with these overrides (already applied below):\n" + header
    return header + yaml.safe_dump(rebase_paths(s.to_dict(), s.base_dir, out), sort_keys=False)


def roofline_uses_curves(s: Scenario) -> bool:
    """Whether the scenario's roofline prices operations with efficiency curves: asked for
    (``latency.efficiency: curves``), or by default when the hardware names a curve set and no
    constant efficiency is given."""
    lat = s.latency
    if lat.efficiency == "curves" and not s.hardware.efficiency:
        raise ConfigError("latency.efficiency", f"hardware {s.hardware.name!r} names no "
                                                "efficiency curves (hardware.efficiency); "
                                                "use efficiency: constant")
    if lat.efficiency is not None:
        return lat.efficiency == "curves"
    return bool(s.hardware.efficiency) and lat.flops_efficiency is None \
        and lat.bandwidth_efficiency is None


def build_latency(s: Scenario) -> LatencyModel:
    from simserve.latency.roofline import ConstantLatency, LinearLatency, RooflineModel
    lat = s.latency
    if lat.model == "profile":
        from simserve.latency.profile import ProfileLatency, list_profiles, resolve_profile_path
        path = resolve_profile_path(lat.path, s.base_dir)
        if path is None:
            raise ConfigError("latency.path", f"profile file not found: {s.base_dir / lat.path}"
                                              f", nor a shipped profile of that name (shipped: "
                                              f"{', '.join(list_profiles()) or 'none'})")
        tp = s.engine.tensor_parallel_size
        return ProfileLatency.from_file(path, s.model,
                                        step_overhead_s=(lat.step_overhead_ms or 0.0) / 1000.0,
                                        host_link_bandwidth=s.hardware.host_link_bandwidth,
                                        tensor_parallel_size=tp, allreduce_s=RooflineModel(
                                            s.model, s.hardware, tensor_parallel_size=tp,
                                        ).allreduce_s if tp > 1 else None)
    if lat.model == "constant":
        return ConstantLatency(lat.step_ms / 1000.0)
    if lat.model == "linear":
        return LinearLatency(lat.base_ms / 1000.0, lat.per_token_ms / 1000.0,
                             lat.per_seq_ms / 1000.0)
    kwargs = {}
    if roofline_uses_curves(s):
        from simserve.latency.efficiency import load_curves
        kwargs["curves"] = load_curves(s.hardware.efficiency)
    if lat.step_overhead_ms is not None:
        kwargs["step_overhead_s"] = lat.step_overhead_ms / 1000.0
    if lat.flops_efficiency is not None:
        kwargs["flops_efficiency"] = lat.flops_efficiency
    if lat.bandwidth_efficiency is not None:
        kwargs["bandwidth_efficiency"] = lat.bandwidth_efficiency
    return RooflineModel(s.model, s.hardware, tensor_parallel_size=s.engine.tensor_parallel_size,
                         block_size=s.engine.block_size, **kwargs)


def build_replicas(s: Scenario, latency: LatencyModel | None = None) -> list[Replica]:
    """Every replica of the scenario's cluster, group after group (``cluster.groups_of``)."""
    replicas: list[Replica] = []
    for i, g in enumerate(groups_of(s)):
        try:
            replicas += _group_replicas(g.scenario, g, len(replicas), latency)
        except ConfigError as e:
            if not s.cluster.groups:
                raise
            raise ConfigError(f"cluster.groups[{i}].{e.field}", e.message) from None
    return replicas


def _group_replicas(s: Scenario, g: GroupConfig, first: int,
                    latency: LatencyModel | None) -> list[Replica]:
    limits = SchedulerLimits(
        max_num_seqs=s.engine.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        enable_chunked_prefill=s.chunked_prefill,
        long_prefill_token_threshold=s.engine.long_prefill_token_threshold,
        preemption_mode=s.engine.preemption_mode,
        max_model_len=s.max_model_len,
        reserve_full_sequence=s.engine.scheduler_reserve_full_isl,
    )
    policy = POLICIES[s.policy]
    blocks = num_kv_blocks(s) - policy.reserved_blocks
    if blocks < 1:
        raise ConfigError("engine.gpu_memory_utilization",
                          "no memory is left for the KV cache after the weights; raise it, "
                          "use more tensor parallelism, or set engine.num_gpu_blocks")
    host = num_host_blocks(s)
    latency = latency or build_latency(s)

    def kv() -> BlockManager:
        if s.engine.enable_prefix_caching and g.role != "decode":   # decode replicas get KV
            return PrefixBlockManager(blocks, s.engine.block_size,  # by transfer, not cache
                                      source_block_size=s.workload.hash_block_tokens)
        return BlockManager(blocks, s.engine.block_size, host)

    def factory():   # also a failed replica's fresh start
        return policy(limits, kv(), s.policy_params, s.seed)

    return [Replica(first + i, factory(), latency, s.max_model_len, group=g.name, role=g.role,
                    factory=factory) for i in range(g.replicas)]


def class_slos(s: Scenario) -> dict[str, SloConfig]:
    """Each request class's SLO: its own limits, the scenario's where it gives none."""
    out = {}
    for c in s.workload.classes:
        own = {k: getattr(c, k) for k in ("ttft_ms", "tpot_ms", "e2el_ms")}
        out[c.name] = dataclasses.replace(
            s.slo, **{k: v for k, v in own.items() if v is not None})
    return out


def run(scenario: Scenario | str | Path, *, latency: LatencyModel | None = None,
        overrides: list[str] | None = None, fast_forward: bool = True,
        record_tokens: bool = False) -> Result:
    """Simulate a scenario (a Scenario, or a path to its YAML) and summarise it.

    ``fast_forward=False`` steps one iteration per event; the results are the same (the
    equivalence tests check it), only slower. ``record_tokens=True`` keeps every output
    token's time (``Result.token_times``, ``tokens.csv``); the summary never needs them.
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    with _no_cyclic_gc():
        return _run(s, latency, fast_forward, record_tokens)


@contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector: a run allocates millions of long-lived objects and
    holds no reference cycles worth collecting, so repeated full GC passes only cost time.
    Reference counting still frees everything as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run(s: Scenario, latency: LatencyModel | None, fast_forward: bool,
         record_tokens: bool) -> Result:
    if latency is None:        # a model passed in is the caller's to vouch for
        deployment.check(s)
    specs = build_workload(s.workload, s.seed, s.base_dir)
    replicas = build_replicas(s, latency)
    for replica in replicas:
        replica.scheduler.record_tokens = record_tokens
    rec = simulate(specs, replicas, fast_forward=fast_forward,
                   max_concurrency=s.workload.max_concurrency, **engine_options(s, replicas))
    result = collect(s, rec, replicas)
    latency_models = {id(r.latency): r.latency for r in replicas}.values()
    result.latency_label = replicas[0].latency.label
    result.warnings = [w for m in latency_models for w in getattr(m, "warnings", list)()]
    result.summary["latency_model"] = result.latency_label
    result.summary["warnings"] = result.warnings
    return result


def compare(path: str | Path, overrides: list[str] | None = None) -> dict[str, Result]:
    """Run every variant of a scenario file (see ``config.load_variants``), keyed by label."""
    return {label: run(s) for label, s in load_variants(path, overrides)}


COMPARISON_METRICS = {
    "completed": "completed", "rejected": "num_rejected",
    "req/s": "request_throughput", "out tok/s": "output_throughput",
    "TTFT p50 ms": "median_ttft_ms", "TTFT p99 ms": "p99_ttft_ms",
    "TPOT p50 ms": "median_tpot_ms", "TPOT p99 ms": "p99_tpot_ms",
    "E2EL p50 ms": "median_e2el_ms", "preemptions": "total_preemptions",
    "goodput req/s": "request_goodput", "SLO attainment": "slo_attainment",
}


def comparison_table(results: dict[str, Result]) -> pd.DataFrame:
    """One row per variant, the headline metrics as columns."""
    rows = {label: {col: r.summary.get(key) for col, key in COMPARISON_METRICS.items()}
            for label, r in results.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def coinciding(results: dict[str, Result]) -> list[list[str]]:
    """Groups of labels whose runs scheduled every step identically (the same steps table and
    the same request times): policies that coincide at these knobs, whose curves hide each
    other in a figure."""
    groups: dict[tuple, list[str]] = {}
    for label, r in results.items():
        key = (int(pd.util.hash_pandas_object(r.steps.drop(columns="step"), index=False).sum()),
               int(pd.util.hash_pandas_object(r.requests[["first_token_s", "finish_s"]],
                                              index=False).sum()))
        groups.setdefault(key, []).append(label)
    return [g for g in groups.values() if len(g) > 1]


def frontend_delays(replicas: list[Replica]) -> dict[int, float]:
    """Each replica's front-end delay in seconds (a calibrated profile's ``frontend_delay_s``;
    0 for every other latency model)."""
    return {r.index: float(getattr(r.latency, "frontend_delay_s", 0.0) or 0.0)
            for r in replicas}


def collect(s: Scenario, rec: Recorder, replicas: list[Replica]) -> Result:
    reqs = sorted(rec.requests, key=lambda r: r.id)
    n = len(reqs)

    def column(values, dtype=np.float64) -> np.ndarray:   # no intermediate Python list
        return np.fromiter(values, dtype=dtype, count=n)

    def attr(name: str, dtype=np.int64) -> np.ndarray:   # an attribute, read at C speed
        return column(map(attrgetter(name), reqs), dtype)

    finished = column((r.status is Status.FINISHED for r in reqs), bool)
    nan = math.nan
    first = column(r.first_token_s if r.status is Status.FINISHED else nan for r in reqs)
    finish = column(r.finish_s if r.status is Status.FINISHED else nan for r in reqs)
    arrival = attr("spec.arrival_s", np.float64)
    replica_of = attr("replica")
    delays = frontend_delays(replicas)
    if any(delays.values()):
        # a front-end delay h (calibrated, docs/fidelity.md): the request reaches the engine
        # h after the client sends it, so the engine's clock runs h behind the client's. Every
        # engine time (tokens, finishes, steps) moves onto the client's clock, as a real
        # server is measured; arrivals are the client's send times already.
        for r in replicas:
            if r.index in rec.replicas:
                rec.replicas[r.index].offset = delays[r.index]
        shift = np.array([delays.get(int(i), 0.0) for i in range(int(replica_of.max()) + 1)]
                         if n else [0.0])[replica_of]
        first, finish = first + shift, finish + shift
    out = attr("num_output_tokens")
    ttft, e2el = first - arrival, finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(finished & (out > 1), (e2el - ttft) / (out - 1), nan)
    requests = pd.DataFrame({
        "request_id": attr("id"),
        "replica": replica_of,
        "arrival_s": arrival,
        "num_prompt_tokens": attr("num_prompt_tokens"),
        "num_output_tokens": out,
        "status": [r.status.value for r in reqs],
        "reject_reason": [r.reject_reason for r in reqs],
        "first_scheduled_s": column(nan if r.first_scheduled_s is None else r.first_scheduled_s
                                    for r in reqs),
        "first_token_s": first,
        "finish_s": finish,
        "num_preemptions": attr("num_preemptions"),
        "ttft_s": ttft, "e2el_s": e2el, "tpot_s": tpot,
        "priority": attr("spec.priority"),
        "class": [r.spec.klass for r in reqs],
        "num_cached_tokens": attr("num_cached_tokens"),
    }, columns=list(REQUEST_COLUMNS))
    logs = [rec.replicas[i] for i in sorted(rec.replicas)]

    def levels(t0: float, t1: float) -> dict:
        groups = [{**log.step_arrays(), **log.group_columns()} for log in logs]
        return grouped_levels(groups, t0, t1)

    summary = summarize(requests, None, None, s.slo, percentiles=s.metric_percentiles,
                        itl=itl_sample(rec, replicas),
                        class_slos=class_slos(s) if any(r.spec.klass for r in reqs) else None,
                        prefix_caching=s.engine.enable_prefix_caching, levels=levels)
    summary.update(cluster_summary(rec, replicas, requests))
    if any(delays.values()):
        summary["frontend_delay_ms"] = 1000.0 * max(delays.values())
    runs = None
    if all(r.scheduler.record_tokens for r in replicas):
        runs = [(r.token_runs, r.step_ends, delays.get(r.replica, 0.0)) if ok else ([], None, 0.0)
                for r, ok in zip(reqs, finished)]
    return Result(s, requests, None, summary, _recorder=rec, _runs=runs)


CHUNK = 1 << 20   # steps processed at a time after a run: bounds the memory of long runs


def itl_sample(rec: Recorder, replicas: list[Replica]) -> WeightedSample:
    """Every inter-token gap, as the schedulers gathered them: gap g of a replica (between its
    steps g and g + 1) with its multiplicity, plus the gaps that spanned skipped steps.
    Streamed in chunks of steps, regenerated for each pass (see WeightedSample)."""
    sources = []
    for replica in replicas:
        sched, log = replica.scheduler, rec.replicas.get(replica.index)
        n = sched.num_steps if log is not None else 0
        sources.append((np.frombuffer(sched.itl_diff, dtype=np.int32),
                        np.frombuffer(log.steps["start_s"], dtype=np.float64) if n else None,
                        np.frombuffer(log.steps["duration_s"], dtype=np.float64) if n else None,
                        n, np.frombuffer(sched.itl_extra, dtype=np.float64)))

    def chunks():
        for diff, start, duration, n, extra in sources:
            carry = 0
            for a in range(0, max(n - 1, 0), CHUNK):   # gaps a .. b-1 need step ends a .. b
                b = min(a + CHUNK, n - 1)
                w = np.cumsum(diff[a:b], dtype=np.int64) + carry
                carry = int(w[-1])
                ends = start[a:b + 1] + duration[a:b + 1]
                keep = w > 0
                yield np.diff(ends)[keep], w[keep]
            yield extra, np.ones(len(extra), dtype=np.int64)

    return WeightedSample(chunks=chunks)


def steps_frame(rec: Recorder) -> pd.DataFrame:
    """The per-step table, ordered by start time then replica, numbered from 0."""
    cols = rec.columns()
    start, replica = cols["start_s"], cols["replica"]
    in_order = bool(np.all((start[1:] > start[:-1]) | (
        (start[1:] == start[:-1]) & (replica[1:] >= replica[:-1]))))
    if not in_order:   # several replicas record their steps interleaved
        order = np.lexsort((replica, start))
        cols = {c: v[order] for c, v in cols.items()}
    return pd.DataFrame({"step": np.arange(len(start), dtype=np.int64), **cols}, copy=False)
