"""The Python API: ``simserve.run(scenario) -> Result`` with pandas DataFrames.

Builds replicas (block manager + policy + latency model) from a scenario, runs the engine, and
turns what the recorder saw into tables. Writing files is ``Result.save``'s job alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from simserve.config import Scenario, load_scenario, load_variants, num_host_blocks, \
    num_kv_blocks
from simserve.engine import STEP_COLUMNS, Recorder, Replica, least_outstanding, round_robin, \
    simulate
from simserve.errors import ConfigError, SimserveError
from simserve.kv.blocks import BlockManager
from simserve.latency.base import LatencyModel
from simserve.metrics.summary import format_summary, summarize
from simserve.sched import POLICIES, SchedulerLimits
from simserve.workload import build_workload

REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "num_prompt_tokens", "num_output_tokens", "status",
    "reject_reason", "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "ttft_s", "e2el_s", "tpot_s",
)


@dataclass
class Result:
    """One simulated run: per-request and per-step tables, token times and the summary."""

    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    token_times: list[np.ndarray]
    summary: dict
    latency_label: str = ""
    warnings: list[str] = field(default_factory=list)

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
        (out / "scenario.yaml").write_text(
            yaml.safe_dump(self.scenario.to_dict(), sort_keys=False))
        self.requests.to_csv(out / "requests.csv", index=False, float_format="%.9g")
        self.steps.to_csv(out / "steps.csv", index=False, float_format="%.9g")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, sort_keys=True) + "\n")
        if tokens:
            self.tokens().to_csv(out / "tokens.csv", index=False, float_format="%.9g")
        return out


def build_latency(s: Scenario) -> LatencyModel:
    from simserve.latency.roofline import ConstantLatency, LinearLatency, RooflineModel
    lat = s.latency
    if lat.model == "profile":
        from simserve.latency.profile import ProfileLatency
        path = Path(lat.path)
        if not path.is_absolute():
            path = s.base_dir / path
        if not path.exists():
            raise ConfigError("latency.path", f"profile file not found: {path}")
        return ProfileLatency.from_file(path, s.model,
                                        step_overhead_s=(lat.step_overhead_ms or 0.0) / 1000.0,
                                        host_link_bandwidth=s.hardware.host_link_bandwidth)
    if lat.model == "constant":
        return ConstantLatency(lat.step_ms / 1000.0)
    if lat.model == "linear":
        return LinearLatency(lat.base_ms / 1000.0, lat.per_token_ms / 1000.0,
                             lat.per_seq_ms / 1000.0)
    kwargs = {}
    if lat.step_overhead_ms is not None:
        kwargs["step_overhead_s"] = lat.step_overhead_ms / 1000.0
    if lat.flops_efficiency is not None:
        kwargs["flops_efficiency"] = lat.flops_efficiency
    if lat.bandwidth_efficiency is not None:
        kwargs["bandwidth_efficiency"] = lat.bandwidth_efficiency
    return RooflineModel(s.model, s.hardware, tensor_parallel_size=s.engine.tensor_parallel_size,
                         block_size=s.engine.block_size, **kwargs)


def build_replicas(s: Scenario, latency: LatencyModel | None = None) -> list[Replica]:
    limits = SchedulerLimits(
        max_num_seqs=s.engine.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        enable_chunked_prefill=s.chunked_prefill,
        long_prefill_token_threshold=s.engine.long_prefill_token_threshold,
        preemption_mode=s.engine.preemption_mode,
    )
    blocks = num_kv_blocks(s)
    if blocks < 1:
        raise ConfigError("engine.gpu_memory_utilization",
                          "no memory is left for the KV cache after the weights; raise it, "
                          "use more tensor parallelism, or set engine.num_gpu_blocks")
    host = num_host_blocks(s)
    latency = latency or build_latency(s)
    policy = POLICIES[s.policy]
    return [Replica(i, policy(limits, BlockManager(blocks, s.engine.block_size, host)), latency,
                    s.max_model_len)
            for i in range(s.cluster.replicas)]


def run(scenario: Scenario | str | Path, *, latency: LatencyModel | None = None,
        overrides: list[str] | None = None, fast_forward: bool = True) -> Result:
    """Simulate a scenario (a Scenario, or a path to its YAML) and summarise it.

    ``fast_forward=False`` steps one iteration per event; the results are the same (the
    equivalence tests check it), only slower.
    """
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    specs = build_workload(s.workload, s.seed, s.base_dir)
    replicas = build_replicas(s, latency)
    router = round_robin() if s.cluster.router == "round_robin" else least_outstanding
    rec = simulate(specs, replicas, router, fast_forward=fast_forward)
    result = collect(s, rec)
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


def collect(s: Scenario, rec: Recorder) -> Result:
    steps = steps_frame(rec)
    rows = []
    token_times = []
    for req in sorted(rec.requests, key=lambda r: r.id):
        finished = req.status.value == "finished"
        times = _token_times(req) if finished else np.empty(0)
        arrival = req.spec.arrival_s
        first = times[0] if finished else math.nan
        finish = req.finish_s if finished else math.nan
        ttft = first - arrival
        e2el = finish - arrival
        out = req.num_output_tokens
        tpot = (e2el - ttft) / (out - 1) if finished and out > 1 else math.nan
        rows.append((req.id, req.replica, arrival, req.num_prompt_tokens, out, req.status.value,
                     req.reject_reason,
                     req.first_scheduled_s if req.first_scheduled_s is not None else math.nan,
                     first, finish, req.num_preemptions, ttft, e2el, tpot))
        token_times.append(times)
    requests = pd.DataFrame.from_records(rows, columns=REQUEST_COLUMNS)
    summary = summarize(requests, token_times, steps, s.slo)
    return Result(s, requests, steps, token_times, summary)


def _token_times(req) -> np.ndarray:
    ends = np.frombuffer(req.step_ends, dtype=np.float64)
    if len(req.token_runs) == 1:
        first, stop = req.token_runs[0]
        return ends[first:stop].copy()
    return np.concatenate([ends[first:stop] for first, stop in req.token_runs])


def steps_frame(rec: Recorder) -> pd.DataFrame:
    """The per-step table, ordered by start time then replica, numbered from 0."""
    cols = {c: np.frombuffer(rec.steps[c], dtype=np.float64 if t == "d" else np.int64)
            for c, t in STEP_COLUMNS.items()}
    order = np.lexsort((cols["replica"], cols["start_s"]))
    frame = pd.DataFrame({"step": np.arange(len(order), dtype=np.int64)})
    for c, values in cols.items():
        frame[c] = values[order]
    return frame
