"""Each replica resolved once: ReplicaSpec from a scenario (cluster/spec.py)."""

from __future__ import annotations

import pytest

import simserve
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.kv.capacity import kv_block_bytes


def raw(**engine):
    return {"model": "Llama-3.1-8B", "hardware": "H100-SXM",
            "engine": {"max_model_len": 4096, **engine},
            "scheduler": {"policy": "vllm_v0"},
            "workload": {"arrival": "poisson", "rate": 1, "num_requests": 1,
                         "prompt": {"dist": "fixed", "value": 10},
                         "output": {"dist": "fixed", "value": 10}}}


def test_a_replica_is_resolved_with_vllms_defaults():
    spec = parse_scenario(raw(block_size=32, preemption_mode="swap", swap_space_gb=1,
                              tensor_parallel_size=2)).replica
    # vLLM v0 never chunks: the budget defaults to max(max_model_len, 2048)
    assert spec.policy == "vllm_v0" and not spec.limits.enable_chunked_prefill
    assert spec.limits.max_num_batched_tokens == 4096 and spec.max_model_len == 4096
    # 32 tokens x K and V x 32 layers x 8 KV heads / 2 ranks x 128 x 2 bytes = 2 MiB
    assert spec.kv_block_bytes == 32 * 2 * 32 * 4 * 128 * 2 == 2**21
    assert spec.kv_bytes_per_token == 2**16
    assert spec.num_host_blocks == 2**30 // 2**21                 # 1 GiB of swap
    assert spec.num_gpu_blocks > 0 and spec.kv_error == ""
    chunked = parse_scenario({**raw(), "scheduler": {"policy": "vllm_v1"}}).replica
    assert chunked.limits.enable_chunked_prefill and chunked.limits.max_num_batched_tokens == 8192


def test_a_changed_scenario_is_resolved_again():
    s = parse_scenario(raw(num_gpu_blocks=100))
    t = s.replace(engine=s.engine.__class__(num_gpu_blocks=7, block_size=8, max_model_len=4096))
    assert t.replica.num_gpu_blocks == 7
    assert t.replica.kv_block_bytes == kv_block_bytes(s.model, 8) and t.source is None
    assert s.replica.num_gpu_blocks == 100 and s.source is not None


def test_no_room_for_the_kv_cache_is_recorded_then_raised_when_built():
    s = parse_scenario(raw(gpu_memory_utilization=0.0001))
    assert s.replica.num_gpu_blocks == 0 and "no room for the KV cache" in s.replica.kv_error
    with pytest.raises(ConfigError, match="^engine.gpu_memory_utilization: no room"):
        simserve.run(s)


def test_a_scenario_changed_with_replace_cannot_be_swept():
    s = parse_scenario(raw(num_gpu_blocks=100)).replace(seed=3)
    with pytest.raises(ConfigError, match="changed with replace"):
        simserve.sweep(s, grid={"workload.rate": [1, 2]}, workers=1)


@pytest.mark.parametrize("key, expected", [
    ("workloads", "workloads: unknown field (did you mean workload?)"),
    ("load", "load: unknown field; known fields here: cluster, engine, hardware, latency, "
             "metric_percentiles, model, name, output_dir, plan, scheduler, seed, slo, "
             "workload"),
])
def test_an_unknown_top_level_field_is_reported_before_a_missing_one(key, expected):
    r = raw()
    r[key] = r.pop("workload")
    with pytest.raises(ConfigError) as e:
        parse_scenario(r)
    assert str(e.value) == expected
