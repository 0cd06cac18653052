"""From a validated scenario to the engine's objects: the latency model, the replicas (each
built from its resolved ``ReplicaSpec``: cluster/spec.py), the routers, the KV transfer
pricing and the fault schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simserve.cluster import GroupConfig, groups_of
from simserve.cluster.faults import FaultSchedule
from simserve.cluster.routing import make_router
from simserve.engine.replica import Replica
from simserve.errors import ConfigError
from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.latency.base import LatencyModel, Pricing
from simserve.sched import POLICIES, Scheduler

if TYPE_CHECKING:
    from simserve.config import Scenario
    from simserve.latency.efficiency import EfficiencyCurves


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


def scenario_curves(s: Scenario) -> EfficiencyCurves | None:
    """The efficiency curve set the scenario's roofline prices with (None: not a roofline, or
    constant efficiencies)."""
    if s.latency.model != "roofline" or not roofline_uses_curves(s):
        return None
    from simserve.latency.efficiency import load_curves
    return load_curves(s.hardware.efficiency or "")


def build_latency(s: Scenario) -> LatencyModel:
    """The scenario's step-latency model, plus the drafter's cost with speculative decoding
    (latency/spec.py), split over pipeline stages with pipeline parallelism
    (latency/pipeline.py)."""
    base = _base_latency(s)
    if s.engine.pipeline_parallel_size > 1:   # (config refuses it with speculation)
        from simserve.latency.pipeline import PipelineLatency
        return PipelineLatency(base, s.model, s.hardware,
                               pipeline_parallel_size=s.engine.pipeline_parallel_size,
                               tensor_parallel_size=s.engine.tensor_parallel_size)
    spec = s.engine.speculative_config
    if spec is None:
        return base
    from simserve.latency.spec import SpeculativeLatency
    lat = s.latency
    kwargs = {k: getattr(lat, k) for k in ("flops_efficiency", "bandwidth_efficiency")
              if lat.model == "roofline" and getattr(lat, k) is not None}
    if roofline_uses_curves(s):
        # the drafter is priced as the target's roofline would be: by the curves where the
        # hardware names them and no constant efficiency is given
        from simserve.latency.efficiency import load_curves
        kwargs["curves"] = load_curves(s.hardware.efficiency)
    return SpeculativeLatency(base, spec, s.model, s.hardware,
                              tensor_parallel_size=s.engine.tensor_parallel_size,
                              block_size=s.engine.block_size, **kwargs)


def _base_latency(s: Scenario) -> LatencyModel:
    from simserve.latency.roofline import ConstantLatency, LinearLatency, RooflineModel
    lat = s.latency
    if lat.model == "profile":
        from simserve.latency.profile import ProfileLatency, find_profile
        assert lat.path is not None         # config requires it for a profile
        path = find_profile(lat.path, s.base_dir, "latency.path")
        tp = s.engine.tensor_parallel_size
        model = ProfileLatency.from_file(path, s.model,
                                        step_overhead_s=(lat.step_overhead_ms or 0.0) / 1000.0,
                                        per_output_token_s=(lat.per_output_token_ms
                                                            or 0.0) / 1000.0,
                                        host_link_bandwidth=s.hardware.host_link_bandwidth,
                                        # a swapped block is the scenario's, not the profile's
                                        swap_block_bytes=s.replica.model_block_bytes,
                                        tensor_parallel_size=tp, allreduce_s=RooflineModel(
                                            s.model, s.hardware, tensor_parallel_size=tp,
                                        ).allreduce_s if tp > 1 else None,
                                        **_moe_options(s))
        from simserve.latency.profile import other_device
        prov = model.profile["provenance"]
        why = other_device(prov["device"], prov["device_name"], s.hardware)
        if why:
            model.notes.append(why)
        return model
    if lat.model == "constant":
        assert lat.step_ms is not None      # config requires it for a constant model
        return ConstantLatency(lat.step_ms / 1000.0)
    if lat.model == "linear":
        return LinearLatency(lat.base_ms / 1000.0, lat.per_token_ms / 1000.0,
                             lat.per_seq_ms / 1000.0)
    kwargs: dict[str, Any] = {}
    frontend_s = 0.0
    if roofline_uses_curves(s):
        from simserve.latency.efficiency import load_curves
        curves = kwargs["curves"] = load_curves(s.hardware.efficiency)
        # the engine's CPU terms fitted with the curve set, unless the scenario gives its own
        if curves.step_overhead_s is not None:
            kwargs["step_overhead_s"] = curves.step_overhead_s
        if curves.per_output_token_s is not None:
            kwargs["per_output_token_s"] = curves.per_output_token_s
        frontend_s = curves.frontend_delay_s or 0.0
    if lat.step_overhead_ms is not None:
        kwargs["step_overhead_s"] = lat.step_overhead_ms / 1000.0
    if lat.per_output_token_ms is not None:
        kwargs["per_output_token_s"] = lat.per_output_token_ms / 1000.0
    if lat.frontend_delay_ms is not None:
        frontend_s = lat.frontend_delay_ms / 1000.0
    if lat.flops_efficiency is not None:
        kwargs["flops_efficiency"] = lat.flops_efficiency
    if lat.bandwidth_efficiency is not None:
        kwargs["bandwidth_efficiency"] = lat.bandwidth_efficiency
    if frontend_s:   # a per-request front-end delay, applied by runner.collect
        kwargs["frontend_delay_s"] = frontend_s
    kwargs.update(_moe_options(s))
    return RooflineModel(s.model, s.hardware, tensor_parallel_size=s.engine.tensor_parallel_size,
                         block_size=s.engine.block_size,
                         swap_block_bytes=s.replica.model_block_bytes, **kwargs)


def _moe_options(s: Scenario) -> dict[str, Any]:
    """Expert parallelism and routing skew, for a card with experts (#18)."""
    if not s.model.is_moe:
        return {}
    out: dict[str, Any] = {"enable_expert_parallel": s.engine.enable_expert_parallel,
           "expert_balancedness": s.engine.expert_balancedness}
    if s.engine.data_parallel_size > 1:     # DP + EP (roofline only: config refuses profiles)
        out.update(data_parallel_size=s.engine.data_parallel_size,
                   all2all_backend=s.engine.all2all_backend)
    return out


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
    spec = s.replica
    spec.check_kv()
    latency = latency or build_latency(s)
    pricing = Pricing.of(latency)      # what the model offers, asked once for its replicas
    policy = POLICIES[spec.policy]

    def kv() -> BlockManager:
        if spec.num_offload_blocks and g.role != "decode":   # a host tier behind the cache
            from simserve.kv.offload import OffloadingBlockManager
            return OffloadingBlockManager(spec.usable_blocks, spec.block_size,
                                          spec.num_offload_blocks,
                                          source_block_size=s.workload.hash_block_tokens)
        if spec.prefix_caching and g.role != "decode":   # decode replicas get KV by transfer,
            return PrefixBlockManager(spec.usable_blocks, spec.block_size,    # not from cache
                                      source_block_size=s.workload.hash_block_tokens)
        return BlockManager(spec.usable_blocks, spec.block_size, spec.num_host_blocks)

    def factory() -> Scheduler:   # also a failed replica's fresh start
        return policy(spec.limits, kv(), spec.params, s.seed)

    # vLLM's DP + EP: each DP rank is an engine of its own (scheduler, KV), behind the router
    ranks = g.replicas * s.engine.data_parallel_size
    return [Replica(first + i, factory(), latency, spec.max_model_len, group=g.name,
                    role=g.role, factory=factory, depth=s.engine.pipeline_parallel_size,
                    priced=pricing)
            for i in range(ranks)]


def engine_options(s: Scenario, replicas: list[Replica]) -> dict[str, Any]:
    """The keyword arguments of ``engine.simulate`` for the scenario's cluster: routers (one
    per pool, each with its own seeded stream), the KV transfer pricing, the fault schedule."""
    c = s.cluster
    out: dict[str, Any] = {"router": make_router(c.router, s.seed, pool=0)}
    if c.disaggregated:
        # K and V of one token on one rank, per replica: every rank moves its own heads'
        # share over its own link, so the side with fewer ranks sets the time
        per_rank = [g.scenario.replica.kv_bytes_per_token for g in groups_of(s)
                    for _ in range(g.replicas * g.scenario.engine.data_parallel_size)]
        link = c.kv_transfer
        assert link is not None             # config requires it for a disaggregated cluster
        out["decode_router"] = make_router(c.router, s.seed, pool=1)
        out["transfer_s"] = lambda tokens, src, dst: link.seconds(
            tokens * max(per_rank[src.index], per_rank[dst.index]))
    if c.faults is not None and c.faults.enabled:
        out.update(faults=FaultSchedule(c.faults, len(replicas), s.seed),
                   on_failure=c.faults.on_failure, max_retries=c.faults.max_retries)
    return out
