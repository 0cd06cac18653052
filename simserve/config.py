"""Scenario schema: YAML → validated, frozen config, one small dataclass per concern.

Every error names the field (``engine.max_num_seqs: must be >= 1, got 0``) or the file and line
(for YAML syntax errors). ``--set a.b=value`` overrides are applied to the raw mapping before
validation, so they are checked exactly like the file.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simserve import limits, safeyaml
from simserve.cards import (KV_CACHE_DTYPES, QUANTIZATIONS, HardwareSpec, ModelCard,
                            load_hardware, load_model, serving_card)
from simserve.cluster import ClusterConfig
from simserve.cluster.spec import ReplicaSpec
from simserve.errors import ConfigError, DataError
from simserve.fields import Fields
from simserve.kv.capacity import kv_block_bytes, kv_capacity_blocks, stage_block_bytes
from simserve.limits import MAX_COUNT, MAX_INT64, MAX_SECONDS, MAX_TOKENS, SWAP_SPACE_GB_MAX
from simserve.metrics.slo import SloConfig
from simserve.paths import folder_name
from simserve.sched import describe, policy_names
from simserve.sched.batch import SchedulerLimits
from simserve.sched.params import params_to_dict, read_params
from simserve.sched.spec import SpeculativeConfig
from simserve.workload.config import WorkloadConfig

ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput")

PREEMPTION_MODES = ("recompute", "swap")
DEFAULT_PERCENTILES = (50, 90, 99)
LATENCY_MODELS = ("roofline", "profile", "constant", "linear")
ROOFLINE_EFFICIENCY = ("curves", "constant")
_LATENCY_FIELDS = {"roofline": ("step_overhead_ms", "per_output_token_ms", "efficiency",
                                "flops_efficiency", "bandwidth_efficiency", "frontend_delay_ms"),
                   "profile": ("path", "step_overhead_ms", "per_output_token_ms"),
                   "constant": ("step_ms",),
                   "linear": ("base_ms", "per_token_ms", "per_seq_ms")}


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's engine knobs, with vLLM's names and meanings (``vllm serve --help``)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None   # None: 8192 when chunking, else ≥ max_model_len
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None           # direct override, as vLLM resolves it
    enable_chunked_prefill: bool | None = None  # None: the policy's own behaviour
    long_prefill_token_threshold: int = 0
    preemption_mode: str = "recompute"
    swap_space_gb: float = 4.0
    max_model_len: int | None = None            # None: the model card's max_position_embeddings
    tensor_parallel_size: int = 1
    # stages a replica's layers are split over, each on its own tensor_parallel_size ranks; up
    # to this many micro-batches in flight (vLLM's batch queue; engine/pipeline.py)
    pipeline_parallel_size: int = 1
    enable_prefix_caching: bool = False         # vLLM's flag (its default is on; here off)
    # vLLM v1 (>= 0.2x; on by default): admit a waiting request only when KV blocks for its whole
    # sequence so far are free, not just for its first chunk (vllm_v1, priority, vllm_native)
    scheduler_reserve_full_isl: bool = True
    # #18: precision and expert parallelism, vLLM 0.32's names (docs/models.md)
    quantization: str | None = None             # None: the checkpoint's own (the card's)
    kv_cache_dtype: str = "auto"                # auto: the model dtype; fp8 halves KV bytes
    enable_expert_parallel: bool = False        # experts split over the TP ranks, not sharded
    # vLLM's DP + EP: attention data parallel over DP ranks (each its own scheduler and KV),
    # experts split over TP × DP ranks, tokens moved by all2all_backend
    data_parallel_size: int = 1
    all2all_backend: str = "allgather_reducescatter"
    # simserve's own: mean / max routed load over EP ranks (1 = uniform; SGLang's definition)
    expert_balancedness: float = 1.0
    # vLLM's speculative_config (sched/spec.py), None: no speculation
    speculative_config: SpeculativeConfig | None = None
    # vLLM's KV offloading to host memory (kv/offload.py): GiB over all TP ranks, None: off
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    # vLLM's --async-scheduling (on by default on GPUs in vLLM 0.32): the next step is
    # scheduled while this one runs, one step ahead of the model's outputs (engine/loops.py,
    # sched/core.py ``launch``/``deliver``; docs/scenario.md#engine). Off: vLLM's
    # synchronous engine step, as before
    async_scheduling: bool = False

    @classmethod
    def from_fields(cls, f: Fields) -> EngineConfig:
        cfg = cls(
            max_num_seqs=f.int("max_num_seqs", 256, min=1, max=MAX_COUNT),
            max_num_batched_tokens=f.int("max_num_batched_tokens", None, min=1, max=MAX_TOKENS),
            block_size=f.int("block_size", 16, min=1, max=MAX_TOKENS),
            gpu_memory_utilization=f.float("gpu_memory_utilization", 0.9, positive=True, max=1.0),
            num_gpu_blocks=f.int("num_gpu_blocks", None, min=1, max=MAX_COUNT),
            enable_chunked_prefill=f.bool("enable_chunked_prefill", None),
            long_prefill_token_threshold=f.int("long_prefill_token_threshold", 0, min=0,
                                               max=MAX_TOKENS),
            preemption_mode=f.str("preemption_mode", "recompute", choices=PREEMPTION_MODES),
            swap_space_gb=f.float("swap_space_gb", 4.0, min=0.0, max=SWAP_SPACE_GB_MAX),
            max_model_len=f.int("max_model_len", None, min=1, max=MAX_TOKENS),
            tensor_parallel_size=f.int("tensor_parallel_size", 1, min=1, max=MAX_COUNT),
            pipeline_parallel_size=f.int("pipeline_parallel_size", 1, min=1, max=MAX_COUNT),
            enable_prefix_caching=f.bool("enable_prefix_caching", False),
            scheduler_reserve_full_isl=f.bool("scheduler_reserve_full_isl", True),
            quantization=f.str("quantization", None, choices=QUANTIZATIONS),
            kv_cache_dtype=f.str("kv_cache_dtype", "auto", choices=tuple(KV_CACHE_DTYPES)),
            enable_expert_parallel=f.bool("enable_expert_parallel", False),
            data_parallel_size=f.int("data_parallel_size", 1, min=1, max=MAX_COUNT),
            all2all_backend=f.str("all2all_backend", "allgather_reducescatter",
                                  choices=ALL2ALL_BACKENDS),
            expert_balancedness=f.float("expert_balancedness", 1.0, positive=True, max=1.0),
            speculative_config=SpeculativeConfig.from_fields(f.section("speculative_config"))
            if f.has("speculative_config") else f.any("speculative_config", None),
            kv_offloading_size=f.float("kv_offloading_size", None, positive=True,
                                       max=SWAP_SPACE_GB_MAX),
            kv_offloading_backend=f.str("kv_offloading_backend", "native",
                                        choices=("native", "lmcache")),
            async_scheduling=f.bool("async_scheduling", False),
        )
        f.done()
        return cfg


_ENGINE_OPTIONAL = {"pipeline_parallel_size": 1, "quantization": None, "kv_cache_dtype": "auto",
                    "enable_expert_parallel": False, "expert_balancedness": 1.0,
                    "data_parallel_size": 1, "all2all_backend": "allgather_reducescatter",
                    "speculative_config": None, "kv_offloading_size": None,
                    "async_scheduling": False,
                    "kv_offloading_backend": "native"}


@dataclass(frozen=True)
class LatencyConfig:
    """Which step-latency model prices the StepPlans, and its parameters."""

    model: str = "roofline"
    path: str | None = None                     # profile: the profile file (JSON)
    step_overhead_ms: float | None = None       # roofline/profile: per-step CPU/scheduling cost
    # roofline/profile: the engine's CPU cost per sequence sampled in a step (added to the step)
    per_output_token_ms: float | None = None    # (None: 0, and left out of the resolved file)
    flops_efficiency: float | None = None       # roofline: achieved fraction of peak FLOP/s
    bandwidth_efficiency: float | None = None   # roofline: achieved fraction of peak bandwidth
    efficiency: str | None = None               # roofline: "curves" | "constant" (None: curves
                                                # if the hardware has a set and no constant given)
    # roofline: a constant per-request delay outside the engine (the HTTP server's hand-off
    # and the stream back, as a calibrated profile's frontend_delay_s): TTFT and E2EL grow by it
    frontend_delay_ms: float | None = None
    step_ms: float | None = None                # constant
    base_ms: float = 0.0                        # linear: base + per token + per sequence
    per_token_ms: float = 0.0
    per_seq_ms: float = 0.0

    @classmethod
    def from_fields(cls, f: Fields) -> LatencyConfig:
        model = f.str("model", "roofline", choices=LATENCY_MODELS)
        if model == "roofline":
            cfg = cls(model,
                      step_overhead_ms=f.float("step_overhead_ms", None, min=0.0),
                      per_output_token_ms=f.float("per_output_token_ms", None, min=0.0,
                                                  max=MAX_SECONDS * 1000.0),
                      efficiency=f.str("efficiency", None, choices=ROOFLINE_EFFICIENCY),
                      flops_efficiency=f.float("flops_efficiency", None, positive=True, max=1.0),
                      bandwidth_efficiency=f.float("bandwidth_efficiency", None, positive=True,
                                                   max=1.0),
                      frontend_delay_ms=f.float("frontend_delay_ms", None, min=0.0,
                                                max=MAX_SECONDS * 1000.0))
            if cfg.efficiency == "curves":
                for key in ("flops_efficiency", "bandwidth_efficiency"):
                    if getattr(cfg, key) is not None:
                        raise ConfigError(f.where(key), "a constant efficiency applies only "
                                                        "with efficiency: constant")
        elif model == "profile":
            path = f.str("path")
            if isinstance(path, str) and not path.strip():
                # "" is the scenario's own folder: "cannot read: Is a directory" named no field
                raise ConfigError(f.where("path"), "expected a profile file or a shipped "
                                                   "profile's name, got an empty string")
            cfg = cls(model, path=path,
                      step_overhead_ms=f.float("step_overhead_ms", 0.0, min=0.0),
                      per_output_token_ms=f.float("per_output_token_ms", None, min=0.0,
                                                  max=MAX_SECONDS * 1000.0))
        elif model == "constant":
            cfg = cls(model, step_ms=f.float("step_ms", positive=True))
        else:
            cfg = cls(model, base_ms=f.float("base_ms", 0.0, min=0.0),
                      per_token_ms=f.float("per_token_ms", 0.0, min=0.0),
                      per_seq_ms=f.float("per_seq_ms", 0.0, min=0.0))
        f.done()
        return cfg


@dataclass(frozen=True)
class Scenario:
    name: str
    model: ModelCard
    hardware: HardwareSpec
    engine: EngineConfig
    policy: str
    workload: WorkloadConfig
    slo: SloConfig
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = 0
    output_dir: str | None = None
    base_dir: Path = field(default=Path("."), compare=False)
    policy_params: Any = None                   # the policy's knobs (sched.params), if any
    overrides: tuple[str, ...] = field(default=(), compare=False)   # --set FIELD=VALUE applied
    # the latency percentiles reported (vllm bench serve --metric-percentiles)
    metric_percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    # the mapping this scenario was validated from (a sweep varies its fields); None for one
    # changed with replace()
    source: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    # the file it was loaded from (a scenario or compare file), if any: kept from being
    # overwritten by the results (``Result.save``)
    path: Path | None = field(default=None, compare=False, repr=False)
    # the replica it describes, resolved once when it is built (cluster/spec.py)
    replica: ReplicaSpec = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_consistency(self)
        object.__setattr__(self, "replica", resolve_replica(self))
        check_context(self)
        _check_budget(self)

    def __repr__(self) -> str:
        """One line (the dataclass's ran to thousands of characters in a notebook): what
        runs on what, and where the rest is."""
        return (f"<Scenario {self.name}: {self.model.name} on {self.hardware.name}, policy "
                f"{self.policy}, seed {self.seed}; .engine, .workload, .slo, .latency, "
                f".cluster>")

    # -- resolved engine values (what vLLM would compute at start-up) ------------------------
    @property
    def max_model_len(self) -> int:
        return self.replica.max_model_len

    @property
    def chunked_prefill(self) -> bool:
        return self.replica.limits.enable_chunked_prefill

    @property
    def max_num_batched_tokens(self) -> int:
        return self.replica.limits.max_num_batched_tokens

    def replace(self, **changes: Any) -> Scenario:
        """A changed copy, validated and resolved again (without a ``source`` mapping unless
        one is given: it no longer says what the scenario is). A field is given as its object
        or as a scenario file writes it, and checked as the file's is: ``seed=3``,
        ``model="Qwen2.5-7B"``, ``policy="sarathi"`` (its knobs then at their defaults unless
        ``policy_params`` is given too), ``workload={...}`` (a section given as a mapping
        replaces the whole section)."""
        changes = _checked_changes(self, changes)
        changes.setdefault("source", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as plain data (written next to the results)."""
        engine = dataclasses.asdict(self.engine)
        for key, default in _ENGINE_OPTIONAL.items():    # written only when set
            if engine[key] == default:
                del engine[key]
        if self.engine.speculative_config is not None:
            engine["speculative_config"] = self.engine.speculative_config.to_dict()
        engine.update(max_model_len=self.max_model_len,
                      max_num_batched_tokens=self.max_num_batched_tokens,
                      enable_chunked_prefill=self.chunked_prefill)
        # only the fields of the chosen model (the others would not parse back)
        latency = {k: v for k, v in dataclasses.asdict(self.latency).items()
                   if v is not None and k in ("model", *_LATENCY_FIELDS[self.latency.model])}
        out: dict[str, Any] = {
            "name": self.name,
            "seed": self.seed,
            "model": self.model.to_dict(),
            "hardware": self.hardware.to_dict(),
            "engine": engine,
            "scheduler": {"policy": self.policy, **params_to_dict(self.policy_params)},
            "latency": latency,
            "cluster": self.cluster.to_dict(),
            "workload": self.workload.to_dict(),
            "slo": self.slo.to_dict(),
        }
        if self.output_dir is not None:
            out["output_dir"] = self.output_dir
        if self.metric_percentiles != DEFAULT_PERCENTILES:
            out["metric_percentiles"] = list(self.metric_percentiles)
        return out


def _checked_changes(s: Scenario, changes: dict[str, Any]) -> dict[str, Any]:
    """``Scenario.replace``'s changes, each checked (and read, if given as a file writes it)
    as ``parse_scenario`` checks the field; a ConfigError naming it otherwise."""
    names = [f.name for f in dataclasses.fields(Scenario) if f.init]
    for key in changes:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            raise ConfigError(key, "not a Scenario field" + (
                f" (did you mean {close[0]}?)" if close else f"; fields: {', '.join(names)}"))
    out = dict(changes)
    f = Fields(changes, "")
    if "name" in changes:
        out["name"] = f.str("name")
    if "seed" in changes:
        # (past int64 too, as Python's ints go: a capacity search's seeds are seed + k)
        seed = changes["seed"]
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ConfigError("seed", f"expected an integer >= 0, got {seed!r}")
        out["seed"] = int(seed)
    engine = out["engine"] = _section(changes, "engine", EngineConfig, s.engine)
    if "model" in changes and not isinstance(changes["model"], ModelCard):
        out["model"] = serving_card(load_model(f.any("model"), "model"), engine.quantization,
                                    engine.kv_cache_dtype)
    elif "model" in changes:
        out["model"] = changes["model"]
    elif "engine" in changes:       # the card as the new engine serves it, as a file's is
        out["model"] = serving_card(s.model, engine.quantization, engine.kv_cache_dtype)
    if "hardware" in changes:
        out["hardware"] = load_hardware(f.any("hardware"), "hardware")
    if "policy" in changes:
        out["policy"] = f.str("policy", choices=policy_names())
        params_type = describe(out["policy"]).params_type
        if "policy_params" not in changes and out["policy"] != s.policy:
            # (a new policy's knobs at their defaults; the same policy keeps its own)
            out["policy_params"] = (read_params(params_type, Fields({}, "scheduler"))
                                    if params_type is not None else None)
    params_type = describe(out.get("policy", s.policy)).params_type
    params = out.get("policy_params", s.policy_params)
    if "policy_params" in changes and not (
            params is None if params_type is None else isinstance(params, params_type)):
        wanted = params_type.__name__ if params_type is not None else "None"
        raise ConfigError("policy_params", f"expected {wanted} for policy "
                                           f"{out.get('policy', s.policy)!r}, got "
                                           f"{type(params).__name__}")
    out["workload"] = _section(changes, "workload", WorkloadConfig, s.workload)
    out["slo"] = _section(changes, "slo", SloConfig, s.slo)
    out["latency"] = _section(changes, "latency", LatencyConfig, s.latency)
    if "cluster" in changes and not isinstance(changes["cluster"], ClusterConfig):
        raise ConfigError("cluster", f"expected a ClusterConfig, got "
                                     f"{type(changes['cluster']).__name__} (set a cluster's "
                                     f"fields in the scenario file or with overrides)")
    if "output_dir" in changes:
        out["output_dir"] = f.str("output_dir", None)
    if "base_dir" in changes:
        if not isinstance(changes["base_dir"], (str, os.PathLike)):
            raise ConfigError("base_dir", f"expected a path, got {changes['base_dir']!r}")
        out["base_dir"] = Path(changes["base_dir"])
    if "metric_percentiles" in changes:
        value = changes["metric_percentiles"]
        out["metric_percentiles"] = _percentiles(Fields(
            {"metric_percentiles": list(value) if isinstance(value, (tuple, list)) else value},
            ""))
    if "overrides" in changes:
        out["overrides"] = tuple(check_overrides(list(changes["overrides"]) if isinstance(
            changes["overrides"], tuple) else changes["overrides"]))
    if "path" in changes and not isinstance(changes["path"], (str, os.PathLike, type(None))):
        raise ConfigError("path", f"expected a path or None, got {changes['path']!r}")
    if changes.get("path") is not None:
        out["path"] = Path(changes["path"])
    if "source" in changes and not isinstance(changes["source"], (dict, type(None))):
        raise ConfigError("source", f"expected a mapping or None, got "
                                    f"{type(changes['source']).__name__}")
    return out


def _section(changes: dict[str, Any], key: str, cls: Any, current: Any) -> Any:
    """A section of ``Scenario.replace``'s changes: its object, or a mapping read as the
    scenario file's section is; ``current`` if not changed."""
    if key not in changes:
        return current
    value = changes[key]
    if isinstance(value, cls):
        return value
    if value is None:                   # (as an empty section in a file: its defaults)
        value = {}
    if isinstance(value, Mapping):
        return cls.from_fields(Fields(value, key))
    raise ConfigError(key, f"expected a {cls.__name__} or a mapping of its fields, got "
                           f"{type(value).__name__}")


# every top-level field parse_scenario reads (checked first: a misspelt `workloads:` is unknown,
# not a missing `workload:`)
SCENARIO_FIELDS = ("name", "seed", "model", "hardware", "engine", "scheduler", "workload", "slo",
                   "latency", "cluster", "output_dir", "metric_percentiles", "plan")


def parse_scenario(raw: Any, base_dir: Path = Path("."), name: str = "scenario") -> Scenario:
    """Validate a scenario mapping (already parsed from YAML) into a frozen Scenario."""
    f = Fields(raw, "")
    f.only(SCENARIO_FIELDS)
    scenario_name = f.str("name", name)
    seed = f.int("seed", 0, min=0, max=MAX_INT64)
    model = load_model(f.any("model"), "model")
    hardware = load_hardware(f.any("hardware"), "hardware")
    engine = EngineConfig.from_fields(f.section("engine"))
    model = serving_card(model, engine.quantization, engine.kv_cache_dtype)
    sched = f.section("scheduler")
    policy = sched.str("policy", "vllm_v1", choices=policy_names())
    params_type = describe(policy).params_type
    policy_params = read_params(params_type, sched) if params_type is not None else None
    ignored = getattr(policy_params, "ignored", None)
    bad = ignored() if ignored is not None else None   # a knob the policy would not read
    if bad is not None:
        raise ConfigError(f"scheduler.{bad[0]}", bad[1])
    _other_policys_knob(sched.raw, policy, params_type)
    sched.done()
    workload = WorkloadConfig.from_fields(Fields(f.any("workload"), "workload"))
    slo = SloConfig.from_fields(f.section("slo"))
    latency = LatencyConfig.from_fields(f.section("latency"))
    cluster = ClusterConfig.from_fields(   # groups are parsed as whole scenarios (cluster.py)
        f.section("cluster"), raw, lambda merged, group: parse_scenario(
            {**merged, "name": f"{scenario_name}/{group}"}, base_dir, name))
    output_dir = f.str("output_dir", None)
    percentiles = _percentiles(f)
    f.any("plan", None)       # `simserve plan`'s search space (plan/space.py reads it)
    f.done()
    return Scenario(scenario_name, model, hardware, engine, policy, workload, slo, latency,
                    cluster, seed, output_dir, base_dir, policy_params,
                    metric_percentiles=percentiles, source=copy.deepcopy(raw))


def _check_engine_policy(s: Scenario) -> None:
    """A policy that runs an installed engine's scheduler: the engine must be importable, and
    the scenario must ask only for what that scheduler does."""
    from simserve.sched.vllm_native import check_available
    check_available()
    if s.engine.preemption_mode == "swap":
        raise ConfigError("engine.preemption_mode", "vllm_native: vLLM v1 preempts by recompute "
                                                    "only; remove preemption_mode: swap")
    if s.cluster.disaggregated:
        raise ConfigError("cluster.groups", "vllm_native: disaggregated prefill/decode replicas "
                                            "are not supported; use vllm_v1")


def _other_policys_knob(raw: Mapping[str, Any], policy: str, params_type: type | None) -> None:
    """A ``scheduler`` key that is not this policy's knob but another's (``waiting_served_ratio``
    on vllm_v1) is named with the policies that read it."""
    own = {"policy"} | ({fd.name for fd in dataclasses.fields(params_type)}
                        if params_type is not None else set())
    for key in raw:
        if key in own:
            continue
        owners = [name for name in policy_names()
                  if (t := describe(name).params_type) is not None
                  and key in {fd.name for fd in dataclasses.fields(t)}]
        if owners == ["vllm_native"] and key == "scheduling_policy":
            raise ConfigError(f"scheduler.{key}", "a knob of policy vllm_native (vLLM's own "
                              "scheduler, vLLM installed); simserve's model of vLLM's priority "
                              "scheduling is scheduler.policy: priority")
        if owners:
            raise ConfigError(f"scheduler.{key}",
                              f"a knob of policy {' and '.join(owners)}, not of {policy} "
                              f"(scheduler.policy: {owners[0]} to use it)")


def _percentiles(f: Fields) -> tuple[float, ...]:
    """``metric_percentiles: [25, 50, 99]`` (vLLM's --metric-percentiles), each in (0, 100]."""
    raw = f.any("metric_percentiles", None)
    if raw is None:
        return DEFAULT_PERCENTILES
    if not isinstance(raw, list) or not 1 <= len(raw) <= 20:
        raise ConfigError(f.where("metric_percentiles"), "expected a list of 1 to 20 "
                                                          "percentiles, e.g. [25, 50, 99]")
    values = []
    for i, p in enumerate(raw):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 100:
            raise ConfigError(f"{f.where('metric_percentiles')}[{i}]",
                              f"expected a number in (0, 100], got {p!r}")
        values.append(int(p) if float(p).is_integer() else float(p))
    if len(set(values)) != len(values):
        raise ConfigError(f.where("metric_percentiles"), f"percentiles repeat: {raw}")
    return tuple(sorted(values))


def _check_consistency(s: Scenario) -> None:
    """What must hold before the scenario's replica can be resolved."""
    cls = describe(s.policy)
    if cls.engine:
        _check_engine_policy(s)
    if s.engine.num_gpu_blocks is not None and s.engine.num_gpu_blocks <= cls.reserved_blocks:
        raise ConfigError("engine.num_gpu_blocks",
                          f"must be >= {cls.reserved_blocks + 1} with policy {s.policy!r}: "
                          f"vLLM's block pool keeps {cls.reserved_blocks} back (its null block)")
    if s.engine.enable_prefix_caching:
        if not cls.prefix_caching:
            names = [n for n in policy_names() if describe(n).prefix_caching]
            raise ConfigError("engine.enable_prefix_caching",
                              f"policy {s.policy!r} does not model prefix caching; use one of: "
                              f"{', '.join(names)}")
        if s.engine.preemption_mode == "swap":
            raise ConfigError("engine.enable_prefix_caching",
                              "prefix caching preempts by recompute only (as vLLM v1); "
                              "remove engine.preemption_mode: swap")
    if cls.chunked is not None and s.engine.enable_chunked_prefill not in (None, cls.chunked):
        verb = "always chunks" if cls.chunked else "never chunks"
        raise ConfigError("engine.enable_chunked_prefill",
                          f"policy {s.policy!r} {verb} prefills; remove the field or pick a "
                          f"policy that {'does not' if cls.chunked else 'does'}")
    if s.model.num_heads % s.engine.tensor_parallel_size or \
            s.model.num_kv_heads % s.engine.tensor_parallel_size and \
            s.engine.tensor_parallel_size % s.model.num_kv_heads:
        raise ConfigError("engine.tensor_parallel_size",
                          f"{s.engine.tensor_parallel_size} does not divide the model's "
                          f"{s.model.num_heads} attention heads / {s.model.num_kv_heads} KV heads")
    if s.engine.pipeline_parallel_size > 1:
        _check_pipeline(s)
    if s.engine.speculative_config is not None:
        if not cls.speculates:
            able = [n for n in policy_names() if describe(n).speculates]
            raise ConfigError("engine.speculative_config",
                              f"policy {s.policy!r} does not model speculative decoding; use "
                              f"one of: {', '.join(able)}")
        if s.engine.preemption_mode == "swap":
            raise ConfigError("engine.speculative_config", "speculative decoding preempts by "
                                                           "recompute only (as vLLM v1)")
    if s.engine.kv_offloading_size is not None:
        if s.engine.kv_offloading_backend != "native":
            raise ConfigError("engine.kv_offloading_backend",
                              "lmcache is not modelled (its capacity comes from the LMCache "
                              "server); use native")
        if not s.engine.enable_prefix_caching:
            raise ConfigError("engine.kv_offloading_size",
                              "KV offloading serves prefix hits from host memory: it needs "
                              "engine.enable_prefix_caching (as vLLM's connector)")
    if s.engine.async_scheduling:
        _check_async(s)
    from simserve.kv.capacity import check_expert_parallel
    if s.engine.data_parallel_size > 1:
        if not s.engine.enable_expert_parallel:
            raise ConfigError("engine.data_parallel_size",
                              "simserve models data parallelism as vLLM's DP + EP (attention "
                              "per DP rank, experts split): set enable_expert_parallel; for "
                              "independent copies use cluster.replicas")
        if s.latency.model == "profile":
            raise ConfigError("engine.data_parallel_size",
                              "a measured profile does not price DP + EP's all-to-all; use "
                              "latency.model: roofline")
    if s.engine.enable_expert_parallel:
        check_expert_parallel(s.model, max(2, expert_parallel_size(s)))


def _check_pipeline(s: Scenario) -> None:
    """What pipeline parallelism (engine/pipeline.py) is built for: a policy whose queues the
    engine can hold micro-batches out of, a stage per layer at most, a colocated cluster
    without failures or replica groups, a latency model with per-layer costs. (A client
    concurrency gate works with it: the pipelined loop steps, as a gate needs.)"""
    pp, field = s.engine.pipeline_parallel_size, "engine.pipeline_parallel_size"
    if not describe(s.policy).pipelines:
        able = [n for n in policy_names() if describe(n).pipelines]
        raise ConfigError(field, f"policy {s.policy!r} does not model pipeline parallelism; "
                                 f"use one of: {', '.join(able)}")
    if pp > s.model.num_layers:
        raise ConfigError(field, f"{pp} stages for {s.model.name}'s {s.model.num_layers} "
                                 "layers: at most one stage per layer")
    if s.latency.model in ("constant", "linear"):
        raise ConfigError(field, f"latency.model {s.latency.model!r} has no per-layer costs "
                                 "to split over stages; use roofline or profile")
    if s.engine.data_parallel_size > 1 or s.engine.speculative_config is not None \
            or s.engine.kv_offloading_size is not None:
        raise ConfigError(field, "not modelled together with data_parallel_size, "
                                 "speculative_config or kv_offloading_size")
    c = s.cluster
    if c.disaggregated or (c.faults is not None and c.faults.enabled) or c.groups:
        raise ConfigError(field, "pipeline parallelism runs on colocated replicas without "
                                 "failures or replica groups")
    straddles = _straddling_replica(s.engine.tensor_parallel_size * pp,
                                    s.hardware.devices_per_node, c.replicas)
    if straddles is not None:
        i, first = straddles
        raise ConfigError(field, f"replica {i}'s {s.engine.tensor_parallel_size} × {pp} "
                                 f"devices would start at device {first}, inside a node of "
                                 f"{s.hardware.devices_per_node}, and reach into the next: its "
                                 "stages' sends are priced as if it started a node; use a "
                                 "tensor × pipeline size that tiles the nodes, or one replica")


def _straddling_replica(size: int, per_node: int, replicas: int) -> tuple[int, int] | None:
    """The first replica (and its first device) whose ``size`` devices, replicas packed one
    after another, start inside a node and run past its end; None if there is none. The
    pipeline's sends are priced by where each stage starts relative to its replica's first
    device (latency/pipeline.py), which holds when a replica starts a node or fits in one."""
    for i in range(1, min(replicas, per_node + 1)):   # the offsets repeat within per_node
        offset = i * size % per_node
        if offset and offset + size > per_node:
            return i, i * size
    return None


ASYNC_POLICIES = ("vllm_v1", "priority", "vllm_native")


def async_allowed(s: Scenario) -> bool:
    """Whether ``s`` could run with ``engine.async_scheduling`` on (what a synchronous run's
    trust note advises)."""
    try:
        _check_async(s)
    except ConfigError:
        return False
    return True


def _check_async(s: Scenario) -> None:
    """What ``engine.async_scheduling`` models (vLLM v1's AsyncScheduler), and what it does
    not yet: one clear error for the rest."""
    where = "engine.async_scheduling"
    if s.policy not in ASYNC_POLICIES:
        raise ConfigError(where, f"models vLLM v1's AsyncScheduler; policy {s.policy!r} has "
                                 f"none (use one of: {', '.join(ASYNC_POLICIES)})")
    if s.engine.speculative_config is not None:
        raise ConfigError(where, "with speculative decoding is not modelled (draft "
                                 "placeholders); remove engine.speculative_config")
    if s.engine.kv_offloading_size is not None:
        raise ConfigError(where, "with KV offloading is not modelled; remove "
                                 "engine.kv_offloading_size")
    if s.engine.preemption_mode == "swap":
        raise ConfigError(where, "preempts by recompute only (as vLLM v1); remove "
                                 "engine.preemption_mode: swap")
    if s.cluster.disaggregated:
        raise ConfigError(where, "with disaggregated prefill/decode is not modelled")
    if s.cluster.faults is not None and s.cluster.faults.enabled:
        raise ConfigError(where, "with failure injection is not modelled; remove "
                                 "cluster.faults")


# the policies that model vLLM's own scheduler, whose engine arguments vLLM checks at start-up
VLLM_POLICIES = ("vllm_v1", "vllm_v0", "priority", "vllm_native")


def _check_budget(s: Scenario) -> None:
    seqs = s.engine.max_num_seqs
    if s.policy in VLLM_POLICIES and s.max_num_batched_tokens < seqs \
            and s.engine.max_num_batched_tokens is None:
        # the budget is vLLM's default (resolve_replica): the field written is the cap
        raise ConfigError("engine.max_num_seqs",
                          f"{seqs} is more than the token budget {s.max_num_batched_tokens} "
                          f"(vLLM's default when engine.max_num_batched_tokens is not given); "
                          f"vLLM refuses this: set engine.max_num_batched_tokens to at least "
                          f"{seqs}, or engine.max_num_seqs lower")
    if s.policy in VLLM_POLICIES and s.max_num_batched_tokens < seqs:
        # vLLM refuses this at start-up (SchedulerConfig: max_num_batched_tokens must be >=
        # max_num_seqs): a step could never feed one token to each sequence it runs
        raise ConfigError("engine.max_num_batched_tokens",
                          f"{s.max_num_batched_tokens} is smaller than engine.max_num_seqs "
                          f"{seqs}; vLLM refuses this: it must be at least max_num_seqs (or "
                          f"set engine.max_num_seqs lower)")
    if not s.chunked_prefill and s.max_num_batched_tokens < s.max_model_len:
        # vLLM refuses this too: without chunking a prompt longer than the budget never runs
        raise ConfigError("engine.max_num_batched_tokens",
                          f"{s.max_num_batched_tokens} is smaller than max_model_len "
                          f"{s.max_model_len}; without chunked prefill it must be at least "
                          f"max_model_len (or set engine.max_model_len lower)")


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file; every problem (encoding, syntax, nesting, aliases, duplicate keys)
    becomes one message with file and line (simserve/safeyaml.py)."""
    return safeyaml.load(path)


def set_field(raw: dict, key: str, value: Any) -> None:
    """Set a dotted field (``engine.max_num_seqs``) in a scenario mapping, creating sections."""
    parts = key.strip().split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif isinstance(child, str) and part in ("model", "hardware"):
            # `--set model.max_position_embeddings=...` on a named card: override that card
            child = node[part] = {"card" if part == "model" else "spec": child}
        elif not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), f"is not a section, cannot set {key}")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: Any, overrides: list[str]) -> Any:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a scenario mapping."""
    if not isinstance(raw, dict):
        raise ConfigError("scenario", "the scenario file must be a mapping of sections")
    given: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", f"expected FIELD=VALUE, got {item!r}")
        key = key.strip()
        if key in given:          # (as a key given twice in a YAML mapping is refused)
            raise ConfigError(f"--set {key}", f"given twice ({given[key]!r}, then {item!r}): "
                                              f"give it once")
        given[key] = item
        set_field(raw, key, safeyaml.parse_value(text, f"--set {key}"))
    return raw


def given_fields(fixed: Mapping[str, Any] | None,
                 overrides: Sequence[str] | None) -> list[tuple[str, str]]:
    """The dotted fields that a sweep's ``set:`` entries and ``--set`` overrides give, each
    with where it was given (``set.KEY``, ``--set KEY``). A mapping value gives each of its
    leaves too: ``--set engine={max_num_seqs: 64}`` sets ``engine.max_num_seqs``."""
    out: list[tuple[str, str]] = []

    def leaves(where: str, key: str, value: Any) -> None:
        out.append((where, key))
        if isinstance(value, dict):
            for k, v in value.items():
                leaves(where, f"{key}.{k}", v)

    for k, v in (fixed or {}).items():
        leaves(f"set.{k}", str(k).strip(), v)
    for item in overrides or []:
        key, _, text = item.partition("=")
        key = key.strip()
        leaves(f"--set {key}", key, safeyaml.parse_value(text, f"--set {key}"))
    return out


def _load_raw(path: Path) -> dict:
    raw = load_yaml(path)
    if raw is None:
        raise DataError(path, "the scenario file is empty")
    if not isinstance(raw, dict):
        raise DataError(path, "a scenario must be a YAML mapping (model:, hardware:, ...)")
    return raw


def file_kind(path: str | Path) -> str:
    """``"sweep"`` (base:/scenario: with grid:/zip:), ``"compare"`` (a compare: section) or
    ``"scenario"``; DataError if the file is not a YAML mapping."""
    path = Path(path)
    raw = _load_raw(path)
    if _is_sweep(raw):
        return "sweep"
    return "compare" if "compare" in raw else "scenario"


def _is_sweep(raw: dict) -> bool:
    return "grid" in raw or "zip" in raw or ("base" in raw and "model" not in raw)


def _refuse_sweep(path: Path, raw: dict) -> None:
    """A sweep file given where a scenario belongs: say what it is and which command runs it
    (rather than the first scenario field it lacks)."""
    if _is_sweep(raw):
        raise ConfigError(str(path), "is a sweep file (base:/scenario: with grid:/zip:), not a "
                                     f"scenario: run it with `simserve sweep {path}`")


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Load one scenario. A file with a ``compare:`` section needs :func:`load_variants`."""
    path = _file_path(path, overrides)
    raw = _load_raw(path)
    _refuse_sweep(path, raw)
    if "compare" in raw:
        raise ConfigError("compare", f"{path} defines several variants; run it with "
                                     "`simserve run` or load it with load_variants()")
    raw = apply_overrides(raw, overrides or [])
    s = parse_scenario(raw, base_dir=path.parent, name=path.stem)
    return s.replace(overrides=tuple(overrides or ()), source=s.source, path=path)


def _file_path(path: Any, overrides: Any) -> Path:
    """The file argument of :func:`load_scenario` and :func:`load_variants` (and their
    ``overrides``' type) checked: a ConfigError for what is not a path, such as the YAML text
    itself or a mapping, rather than an error from the file system."""
    if overrides is not None and not isinstance(overrides, (list, tuple)):
        check_overrides(overrides)            # (raises: a lone string, ...)
    if isinstance(path, str) and "\n" in path:
        raise ConfigError("path", "is YAML text, not a file's path: give the file's path, or "
                                  "the parsed mapping (yaml.safe_load) to simserve.run()")
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", f"expected the path of a scenario file, got "
                                  f"{type(path).__name__}" + (
                                      "; simserve.run() and compare() take a Scenario or a "
                                      "mapping too" if isinstance(path, (Scenario, Mapping))
                                      else ""))
    return Path(path)


def check_overrides(overrides: Any) -> list[str]:
    """``overrides`` of the Python API as a list of ``FIELD=VALUE`` strings: a lone string (each
    of its characters would be one override) or an item that is not a string is a ConfigError."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, (list, tuple)):
        raise ConfigError("overrides", f"expected a list of FIELD=VALUE strings, got "
                                       f"{type(overrides).__name__} {overrides!r:.60}")
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError("overrides", f"expected FIELD=VALUE strings, got "
                                           f"{type(item).__name__} {item!r:.60}")
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():   # (named here: "--set" would name the CLI's flag)
            raise ConfigError("overrides", f"expected FIELD=VALUE, got {item!r:.60}")
    return list(overrides)


def as_scenario(scenario: Any, overrides: Any = None) -> Scenario:
    """What the Python API takes as a scenario: a Scenario, a scenario mapping (as parsed from
    YAML; relative paths from the current directory) or the path of a scenario file, with
    ``overrides`` applied to the mapping or file. Anything else is a ConfigError naming what
    was given (not a TypeError from deep inside)."""
    applied = check_overrides(overrides)
    if isinstance(scenario, Scenario):
        if applied:        # a resolved Scenario has no mapping left to set fields in
            raise ConfigError("overrides", "apply to a scenario file or mapping, not to a "
                                           "Scenario; use Scenario.replace(...) instead")
        return scenario
    if isinstance(scenario, Mapping):
        raw = apply_overrides(copy.deepcopy(dict(scenario)), applied)
        if "compare" in raw:
            raise ConfigError("compare", "a scenario with compare: defines several variants; "
                                         "run its file with simserve.compare()")
        if _is_sweep(raw):
            raise ConfigError("scenario", "is a sweep (base:/scenario: with grid:/zip:), not a "
                                          "scenario: run it with simserve.sweep()")
        s = parse_scenario(raw, base_dir=Path("."))
        return s.replace(overrides=tuple(applied), source=s.source)
    if isinstance(scenario, (str, os.PathLike)):
        return load_scenario(scenario, applied)
    raise ConfigError("scenario", f"expected a Scenario, a scenario mapping or the path of a "
                                  f"scenario file, got {type(scenario).__name__} "
                                  f"{scenario!r:.60}")


def load_variants(path: str | Path,
                  overrides: list[str] | None = None) -> list[tuple[str, Scenario]]:
    """Load a scenario file as labelled variants.

    A plain scenario is one variant labelled with its name. A ``compare:`` section makes
    several, each the base scenario (after ``overrides``) with some fields set. Two forms::

        compare:                                  # one field, several values
          scheduler.policy: [vllm_v0, vllm_v1]
        compare:                                  # several fields per variant
          - {label: v0, scheduler.policy: vllm_v0}
          - {label: sarathi-512, scheduler.policy: sarathi, engine.max_num_batched_tokens: 512}
    """
    path = _file_path(path, overrides)
    raw = _load_raw(path)
    _refuse_sweep(path, raw)
    # (overrides first, compare: too: --set compare=null runs the base scenario alone, and
    # --set 'compare=[{label: a, ...}]' replaces the variants)
    raw = apply_overrides(raw, overrides or [])
    compare = raw.pop("compare", None)
    applied = tuple(overrides or ())
    if compare is None:
        s = parse_scenario(raw, base_dir=path.parent, name=path.stem)
        s = s.replace(overrides=applied, source=s.source, path=path)
        return [(s.name, s)]
    variants = []
    base = raw.get("name", path.stem)
    for label, fields in _variant_fields(compare):
        _refuse_overridden(label, fields, overrides or [])
        variant = copy.deepcopy(raw)
        for key, value in fields.items():
            set_field(variant, key, value)
        try:
            s = parse_scenario(variant, base_dir=path.parent, name=path.stem)
        except ConfigError as e:
            raise ConfigError(e.field, f"{e.message} (in compare variant {label!r})") from None
        variants.append((label, s.replace(name=f"{base}-{label}", overrides=applied,
                                          source=variant, path=path)))
    labels = [label for label, _ in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError("compare", f"variant labels must be unique, got {labels}")
    folders = [folder_name(label) for label in labels]   # each variant's folder under --out
    if len(set(folders)) != len(folders):
        raise ConfigError("compare", f"variant labels must differ in more than punctuation "
                                     f"(they name folders: {folders})")
    return variants


def value_label(value: Any) -> str:
    """A variant's label (and so its folder name) from a field's value: an inline card (a
    mapping with a ``name``, as a model or hardware card has) by its name, another mapping or
    list by its items, anything else as written."""
    if isinstance(value, dict):
        if isinstance(value.get("name"), str) and value["name"]:
            return value["name"]
        return ",".join(f"{k}={value_label(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(value_label(v) for v in value)
    return str(value)


def _refuse_overridden(label: str, fields: dict[str, Any], overrides: list[str]) -> None:
    """A ``--set`` field that a compare variant also sets would be replaced by the variant's
    value while the run's outputs say the override was applied: refuse it. A variant setting a
    section replaces every override inside it; an override of a section loses only what the
    variant sets inside it, if the override's mapping gives it."""
    for item in overrides:
        key, _, text = item.partition("=")
        key = key.strip()
        for name in fields:
            f = str(name).strip()
            lost = key == f or key.startswith(f + ".")
            if f.startswith(key + "."):
                node: Any = safeyaml.parse_value(text, f"--set {key}")
                for part in f[len(key) + 1:].split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                lost = node is not None
            if lost:
                raise ConfigError(f"--set {key}", f"compare variant {label!r} sets {f} "
                                                  "itself, so the override would not apply; "
                                                  "remove it from --set or from compare:")


def _variant_fields(compare: Any) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(compare, dict) and len(compare) == 1:
        (key, values), = compare.items()
        if not isinstance(values, list) or not values:
            raise ConfigError(f"compare.{key}", "expected a non-empty list of values")
        return [(value_label(v), {key: v}) for v in values]
    if isinstance(compare, list) and compare:
        out = []
        for i, item in enumerate(compare):
            if not isinstance(item, dict) or not item:
                raise ConfigError(f"compare[{i}]", "expected a mapping of FIELD: VALUE")
            item = dict(item)
            label = item.pop("label", None)
            if label is None:
                label = "-".join(value_label(v) for v in item.values())
            out.append((str(label), item))
        return out
    raise ConfigError("compare", "expected {FIELD: [values]} or a list of {FIELD: VALUE} "
                                 "mappings")


def expert_parallel_size(s: Scenario) -> int:
    """vLLM 0.32: with ``enable_expert_parallel`` the experts are split over all TP (× DP)
    ranks of a replica; without it, 1 (experts TP-sharded)."""
    e = s.engine
    return e.tensor_parallel_size * e.data_parallel_size if e.enable_expert_parallel else 1


def resolve_replica(s: Scenario) -> ReplicaSpec:
    """The replica a (validated) scenario describes (cluster/spec.py). A KV cache that does not
    fit is recorded, not raised: a sweep reports it as that point's error when its replicas are
    built."""
    facts = describe(s.policy)
    e = s.engine
    max_model_len = e.max_model_len or s.model.max_position_embeddings
    chunked = facts.chunked if facts.chunked is not None else \
        (True if e.enable_chunked_prefill is None else e.enable_chunked_prefill)
    # vLLM's defaults: a fixed chunk budget with chunked prefill, else room for any prompt
    budget = e.max_num_batched_tokens if e.max_num_batched_tokens is not None else \
        (8192 if chunked else max(max_model_len, 2048))
    limits = SchedulerLimits(max_num_seqs=e.max_num_seqs, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked,
                             long_prefill_token_threshold=e.long_prefill_token_threshold,
                             preemption_mode=e.preemption_mode,
                             max_model_len=max_model_len,
                             reserve_full_sequence=e.scheduler_reserve_full_isl,
                             speculative_config=e.speculative_config,
                             async_scheduling=e.async_scheduling,
                             pipeline_parallel_size=e.pipeline_parallel_size)
    tp, pp = e.tensor_parallel_size, e.pipeline_parallel_size
    block_bytes = model_block_bytes = kv_block_bytes(s.model, e.block_size, tp)
    if pp > 1:    # a rank holds its stage's layers' K and V: the largest stage's share
        block_bytes = max(stage_block_bytes(s.model, e.block_size, tp, pp))
    # an EAGLE / MTP / draft-model drafter keeps its own layers' KV in the same blocks and
    # its weights on every rank (latency/spec.py says which card prices it)
    drafter = None
    if e.speculative_config is not None:
        from simserve.latency.spec import drafter_card, drafter_weight_bytes
        drafter = drafter_card(s.model, e.speculative_config)
    extra_weights = 0.0
    if drafter is not None:
        block_bytes += kv_block_bytes(drafter, e.block_size, tp)
        assert e.speculative_config is not None      # a drafter comes from it
        extra_weights = drafter_weight_bytes(drafter, e.speculative_config, tp)
    blocks, error, error_field = e.num_gpu_blocks, "", "engine.gpu_memory_utilization"
    if blocks is None:
        try:
            blocks = kv_capacity_blocks(s.model, s.hardware, block_size=e.block_size,
                                        gpu_memory_utilization=e.gpu_memory_utilization,
                                        tensor_parallel_size=tp, max_num_batched_tokens=budget,
                                        expert_parallel_size=tp * e.data_parallel_size
                                        if e.enable_expert_parallel else 1,
                                        # the model's own block unless a drafter adds
                                        block_bytes=block_bytes if drafter else None,
                                        extra_weight_bytes=extra_weights,
                                        pipeline_parallel_size=pp)
        except ConfigError as err:
            blocks, error, error_field = 0, err.message, err.field
    host = math.floor(e.swap_space_gb * 2**30 / block_bytes) if e.preemption_mode == "swap" \
        else 0
    if not error and blocks <= facts.reserved_blocks:
        error = ("no memory is left for the KV cache after the weights; raise it, use more "
                 "tensor parallelism, or set engine.num_gpu_blocks")
    offload = 0
    if e.kv_offloading_size is not None:
        from simserve.kv.offload import host_blocks
        offload = host_blocks(e.kv_offloading_size, tp, block_bytes)
    return ReplicaSpec(s.policy, s.policy_params, limits, max_model_len, e.block_size, blocks,
                       facts.reserved_blocks, host, block_bytes, e.enable_prefix_caching, tp,
                       error, offload, model_block_bytes, error_field)


def check_context(s: Scenario) -> None:
    """``engine.max_model_len`` within the model's positions; a static batch's tokens within
    what a step can count (static batching is the one policy whose step may pass the budget:
    a whole batch of whole prompts)."""
    m, e = s.model, s.engine
    if s.policy == "static" and e.max_num_seqs * s.max_model_len > limits.MAX_COUNT:
        raise ConfigError("engine.max_num_seqs",
                          f"a static batch of {e.max_num_seqs} prompts of up to "
                          f"{s.max_model_len} tokens could hold more than the "
                          f"{limits.MAX_COUNT:,} tokens a step can count; lower it or "
                          "engine.max_model_len")
    if e.max_model_len is not None and e.max_model_len > m.max_position_embeddings:
        # vLLM refuses this too (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set)
        raise ConfigError("engine.max_model_len",
                          f"{e.max_model_len} is larger than {m.name}'s "
                          f"max_position_embeddings ({m.max_position_embeddings}); the model "
                          "has no positions past it (override model.max_position_embeddings "
                          "if you mean to)")
