"""Is the deployment a scenario describes possible at all? Checked before anything runs.

A scenario can be valid field by field and still describe something that cannot exist or
cannot be simulated: weights larger than the device, a KV cache that does not fit beside them,
a context longer than the model's positions, a step that would take longer than the age of the
universe. Each check raises one :class:`ConfigError` naming the field to change; the bounds come
from :mod:`simserve.limits`.

(A plain contradiction between two fields is checked on every parsed scenario:
``config.check_context``.) :func:`check` (memory, cluster, step times) builds the latency
model and sizes the KV cache, so it runs where a run starts (a sweep point that cannot run gets
its message in the ``error`` column) and in ``simserve validate``.
"""

from __future__ import annotations

import math

from simserve import limits
from simserve.errors import ConfigError
from simserve.kv.capacity import check_weights_fit

GB = 1e9


def check(s) -> None:
    """Every check of this module on a scenario and each of its replica groups (ConfigError on
    the first that fails, its field prefixed with the group's path)."""
    for i, g in enumerate(_groups(s)):
        try:
            check_memory(g.scenario)
            check_one_request_fits(g.scenario)
            check_step_times(g.scenario)
        except ConfigError as e:
            if not s.cluster.groups:
                raise
            raise ConfigError(f"cluster.groups[{i}].{e.field}", e.message) from None
    check_cluster(s)


def _groups(s):
    from simserve.cluster import groups_of
    return [g for g in groups_of(s) if g.scenario is not None]


def check_memory(s) -> None:
    """The weights, and a KV cache given as ``engine.num_gpu_blocks``, fit on the device; a
    cache sized from memory has no more blocks than a replica can count."""
    m, hw, e = s.model, s.hardware, s.engine
    tp = e.tensor_parallel_size
    weights = m.weight_bytes_per_rank(tp, tp * e.data_parallel_size
                                      if e.enable_expert_parallel else 1)
    if e.pipeline_parallel_size > 1:    # the heaviest stage's ranks
        from simserve.kv.capacity import stage_weight_bytes
        weights = max(stage_weight_bytes(m, tp, 1, e.pipeline_parallel_size))
    # weights alone past the device: no gpu_memory_utilization helps, so say so first
    check_weights_fit(m, hw, weights, tp, e.pipeline_parallel_size)
    if e.num_gpu_blocks is not None:
        # a KV cache set directly skips vLLM's memory arithmetic, not physics: the weights and
        # the blocks must fit in the device's memory (gpu_memory_utilization aside)
        kv = e.num_gpu_blocks * (s.replica.model_block_bytes if e.pipeline_parallel_size == 1
                                 else s.replica.kv_block_bytes)
        if weights + kv > hw.mem_bytes:
            raise ConfigError("engine.num_gpu_blocks",
                              f"{e.num_gpu_blocks} blocks take {kv / GB:.3g} GB per device; "
                              f"with the weights ({weights / GB:.3g} GB) that is more than "
                              f"the {hw.mem_bytes / GB:.3g} GB of {hw.name}")
    else:
        s.replica.check_kv()
        blocks = s.replica.num_gpu_blocks
        if blocks > limits.MAX_COUNT:
            raise ConfigError("engine.num_gpu_blocks",
                              f"the device's memory holds {blocks:,} KV blocks, more than the "
                              f"{limits.MAX_COUNT:,} a replica can count; give "
                              "engine.num_gpu_blocks or a larger engine.block_size")


def check_one_request_fits(s) -> None:
    """A KV cache sized from the device's memory holds at least one request of
    ``max_model_len`` tokens, or the deployment is refused as vLLM refuses to start one
    (``check_enough_kv_cache_memory`` in vllm/v1/core/kv_cache_utils.py: "To serve at least one
    request with the models's max seq len ... Try increasing `gpu_memory_utilization` or
    decreasing `max_model_len`"). A cache given as ``engine.num_gpu_blocks`` is not checked:
    vLLM applies its ``num_gpu_blocks_override`` after this check."""
    e = s.engine
    if e.num_gpu_blocks is not None:
        return
    s.replica.check_kv()
    blocks, size = s.replica.num_gpu_blocks, e.block_size
    need = -(-s.max_model_len // size)
    if blocks >= need:
        return
    tokens = blocks * size
    parallel = f"tensor_parallel_size {e.tensor_parallel_size}" + (
        f", pipeline_parallel_size {e.pipeline_parallel_size}"
        if e.pipeline_parallel_size > 1 else "")
    raise ConfigError("engine.max_model_len",
                      f"{s.model.name} on {s.hardware.name} at {parallel} and "
                      f"gpu_memory_utilization {e.gpu_memory_utilization:g} leaves a KV cache "
                      f"of {tokens:,} tokens ({blocks:,} blocks of {size}), less than one "
                      f"request of max_model_len {s.max_model_len:,} needs: vLLM refuses to "
                      f"start such an engine. Lower engine.max_model_len to at most "
                      f"{tokens:,}, or raise engine.gpu_memory_utilization or "
                      "engine.tensor_parallel_size")


def check_cluster(s) -> None:
    """A prefix cache keeps one entry per block: bound the blocks of every replica together."""
    total = 0
    for g in _groups(s):
        if g.scenario.engine.enable_prefix_caching:
            g.scenario.replica.check_kv()
            total += (g.replicas * g.scenario.engine.data_parallel_size
                      * g.scenario.replica.num_gpu_blocks)
    if total > limits.MAX_PREFIX_CACHE_BLOCKS:
        raise ConfigError("engine.enable_prefix_caching",
                          f"the prefix caches of all replicas would hold {total:,} blocks, "
                          f"more than the {limits.MAX_PREFIX_CACHE_BLOCKS:,} a run keeps in "
                          "memory; give engine.num_gpu_blocks, a larger engine.block_size or "
                          "fewer replicas")


def check_step_times(s) -> None:
    """Price the largest prefill step and the longest decode step with the scenario's latency
    model: both must be finite and at most ``limits.MAX_STEP_S``; otherwise requests would
    "finish" at time inf (a peak_flops of 1e-300, a per-token cost of 1e300 ms)."""
    from simserve.engine.build import build_latency
    from simserve.sched.plan import StepPlan
    model = build_latency(s)
    tokens = min(s.max_num_batched_tokens, s.max_model_len)
    plans = {
        f"a prefill of {tokens} tokens": StepPlan((0,), (tokens,), (tokens,), (0,), (), 1),
        f"one decode at context {s.max_model_len - 1}": StepPlan(
            (0,), (1,), (), (), (s.max_model_len - 1,), 1),
    }
    for what, plan in plans.items():
        t = model.step_time(plan)
        if not (math.isfinite(t) and 0 <= t <= limits.MAX_STEP_S):
            roofline = s.latency.model == "roofline"
            hint = ("hardware.peak_flops, hardware.mem_bandwidth and latency.step_overhead_ms"
                    if roofline else "the latency section")
            raise ConfigError("hardware" if roofline else "latency",
                              f"one engine step ({what}) would take {t:.3g} s with the "
                              f"{model.label} model, more than {limits.MAX_STEP_S:g} s: check "
                              f"{hint}")
