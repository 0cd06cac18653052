"""Clusters: routers on hand-stepped cases, replica groups in the scenario, per-replica metrics,
tensor-parallel costs, and the cluster-wide invariants (conservation, KV returned, fast-forward
equal to stepping) under random scenarios. ``run_cluster`` is shared with test_disagg and
test_faults."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simserve
from simserve.cards import load_hardware, load_model
from simserve.config import parse_scenario
from simserve.engine import Replica, simulate
from simserve.errors import ConfigError
from simserve.cluster.faults import FaultSchedule
from simserve.kv.blocks import BlockManager
from simserve.kv.capacity import kv_block_bytes, kv_capacity_blocks
from simserve.kv.prefix import PrefixBlockManager
from simserve.latency import ConstantLatency
from simserve.latency.profile import ProfileLatency
from simserve.latency.roofline import RooflineModel
from simserve.cluster.routing import (jsq_tokens, least_kv, least_outstanding, make_router,
                              prefix_aware)
from simserve.metrics.recorder import itl_sample
from simserve.runner import compare
from simserve.sched import POLICIES, SchedulerLimits, Status
from simserve.sched.plan import StepPlan
from simserve.workload.spec import RequestSpec
from tests.helpers import make_request, make_scheduler
from tests.property.test_properties import ToyLatency, _by_replica, scenarios

TERMINAL = (Status.FINISHED, Status.REJECTED, Status.FAILED)


# -- building and checking clusters by hand ------------------------------------------------------

def make_replicas(policy, limits, block_size, num_blocks, host_blocks, max_model_len, roles,
                  params=None, prefix=False, latency=None):
    replicas = []
    for i, role in enumerate(roles):
        def factory(role=role):
            blocks = PrefixBlockManager(num_blocks, block_size, source_block_size=8) \
                if prefix and role != "decode" else BlockManager(num_blocks, block_size,
                                                                 host_blocks)
            sched = POLICIES[policy](limits, blocks, params, 3)
            sched.record_tokens = True
            return sched
        replicas.append(Replica(i, factory(), latency or ToyLatency(), max_model_len, role=role,
                                factory=factory))
    return replicas


def toy_transfer(tokens, src, dst):
    return 1e-3 + 2e-5 * tokens


def run_cluster(case, roles, router="round_robin", faults=None, fast_forward=True,
                latency=None, seed=0):
    policy, limits, block_size, num_blocks, host_blocks, max_model_len, specs, _, params, \
        prefix = case
    replicas = make_replicas(policy, limits, block_size, num_blocks, host_blocks, max_model_len,
                             roles, params, prefix, latency)
    disagg = "decode" in roles
    kw = {}
    if disagg:
        kw.update(decode_router=make_router(router, seed, 1), transfer_s=toy_transfer)
    if faults is not None:
        kw.update(faults=FaultSchedule(faults, len(roles), seed), on_failure=faults.on_failure,
                  max_retries=faults.max_retries)
    rec = simulate(specs, replicas, make_router(router, seed, 0), fast_forward=fast_forward,
                   **kw)
    return rec, replicas


def check_accounting(rec, replicas, specs):
    """Conservation, each token once at non-decreasing times, every KV block returned."""
    assert sorted(r.id for r in rec.requests) == [s.request_id for s in specs]
    for req in rec.requests:
        assert req.status in TERMINAL, (req.id, req.status)
        if req.status is Status.FINISHED:
            times = req.token_times
            assert len(times) == req.num_output_tokens == req.num_generated
            assert np.all(np.diff(times) >= 0)
            assert times[0] == req.first_token_s and times[-1] == req.finish_s
            assert req.spec.arrival_s <= req.first_scheduled_s < times[0]
        elif req.status is Status.FAILED:
            assert req.reject_reason in ("replica_failure", "retries_exhausted")
    for r in replicas:
        assert r.blocks.num_used == 0 and r.blocks.num_host_free == r.blocks.num_host_blocks
        assert not r.scheduler.has_work and not r.inbox


def assert_same_runs(fast, slow):
    assert _by_replica(fast) == _by_replica(slow)
    assert fast.retries == slow.retries and fast.transfer_s == slow.transfer_s
    assert fast.failures == slow.failures
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert (a.id, a.status, a.reject_reason, a.replica) == (b.id, b.status, b.reject_reason,
                                                                b.replica)
        assert a.num_preemptions == b.num_preemptions
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.first_token_s == b.first_token_s
        if a.status is Status.FINISHED:
            assert a.token_times == b.token_times


def pooled_itl(rec):
    gaps = [np.diff(r.token_times) for r in rec.requests if r.status is Status.FINISHED]
    return np.sort(np.concatenate(gaps)) if gaps else np.empty(0)


def online_itl(rec, replicas):
    sample = itl_sample(rec)
    v = np.concatenate([np.repeat(v, w) for v, w in sample._chunks() if len(v)] or [[]])
    return np.sort(v)


# -- routers on hand-stepped cases ---------------------------------------------------------------

def replicas_of(*scheds):
    return [Replica(i, s, ToyLatency(), 10_000) for i, s in enumerate(scheds)]


def test_round_robin_cycles_and_random_is_seeded():
    reps = replicas_of(*(make_scheduler("vllm_v1") for _ in range(3)))
    rr = make_router("round_robin")
    assert [rr(None, reps).index for _ in range(5)] == [0, 1, 2, 0, 1]
    a = [make_router("random", seed=7)(None, reps).index for _ in range(1)]
    r1, r2, r3 = (make_router("random", seed=s) for s in (7, 7, 8))
    seq1 = [r1(None, reps).index for _ in range(20)]
    assert seq1 == [r2(None, reps).index for _ in range(20)] and a[0] == seq1[0]
    assert seq1 != [r3(None, reps).index for _ in range(20)]
    assert set(seq1) == {0, 1, 2}
    # its own stream per pool: the prefill and decode pools do not share draws
    assert seq1 != [make_router("random", seed=7, pool=1)(None, reps).index for _ in range(20)]


@pytest.mark.parametrize("name", ["round_robin", "random"])
def test_routing_ahead_is_routing_one_by_one(name):
    # ``ahead(n, k)``: the replicas the next n calls would pick, the router's state moved on
    # as far (a run routed before it starts takes the same replicas as one routed as it goes)
    reps = replicas_of(*(make_scheduler("vllm_v1") for _ in range(3)))
    one, many = make_router(name, seed=3), make_router(name, seed=3)
    calls = [one(None, reps).index for _ in range(50)]
    assert many.ahead(20, 3) + many.ahead(30, 3) == calls
    assert [one(None, reps).index for _ in range(5)] == [many(None, reps).index for _ in range(5)]
    assert set(calls) == {0, 1, 2}


def test_least_outstanding_and_least_kv_and_jsq_tokens():
    a, b = make_scheduler("vllm_v1", num_blocks=100), make_scheduler("vllm_v1", num_blocks=10)
    reps = replicas_of(a, b)
    assert least_outstanding(None, reps).index == 0          # tie: lowest index
    reps[0].num_outstanding = 2
    assert least_outstanding(None, reps).index == 1
    # KV: A holds 20 of 100 blocks (20 %), B 3 of 10 (30 %) -> A, despite more requests
    a.blocks.allocate(1, 80)     # 20 blocks of 4 tokens
    b.blocks.allocate(2, 12)     # 3 blocks
    assert least_kv(None, reps).index == 0
    # tokens of work left: A has a 100-token prompt waiting with 10 output tokens (110);
    # B a 30-token prompt with 50 outputs (80), 20 of its prompt computed -> 60
    a.add(make_request(1, 100, 10))
    rb = make_request(2, 30, 50)
    rb.num_computed_tokens = 20
    b.add(rb)
    assert jsq_tokens(None, reps).index == 1
    b.add(make_request(3, 60, 1))        # B: 60 + 61 = 121 > 110
    assert jsq_tokens(None, reps).index == 0


def test_prefix_aware_routes_to_the_cached_prefix():
    limits = SchedulerLimits(8, 512, True)
    scheds = [POLICIES["vllm_v1"](limits, PrefixBlockManager(64, 4, source_block_size=8))
              for _ in range(3)]
    reps = replicas_of(*scheds)
    # replica 2 served a request whose 32-token prompt has hash ids (5, 6, 7, 8)
    old = make_request(0, 32, 2)
    old = type(old)(RequestSpec(0, 0.0, 32, 2, (5, 6, 7, 8)))
    scheds[2].add(old)
    plan = scheds[2].schedule()
    scheds[2].complete(plan, 0.1)
    new = type(old)(RequestSpec(1, 1.0, 40, 2, (5, 6, 7, 9, 1)))
    # 24 tokens (ids 5, 6, 7) cached on replica 2, none elsewhere
    assert [prefix_aware.__globals__["prefix_hit_tokens"](r, new) for r in reps] == [0, 0, 24]
    reps[2].num_outstanding = 5
    assert prefix_aware(new, reps).index == 2
    # the probe left no trace: admitting it on replica 2 still finds the same prefix
    scheds[2].add(new)
    scheds[2].schedule()
    assert new.num_cached_tokens == 24
    # no hit anywhere (other content): least outstanding decides
    other = type(old)(RequestSpec(2, 1.0, 40, 2, (1, 2, 3, 4, 5)))
    reps[0].num_outstanding = 1
    assert prefix_aware(other, reps).index == 1
    # without prefix caching every replica hits 0: least outstanding
    plain = replicas_of(make_scheduler("vllm_v1"), make_scheduler("vllm_v1"))
    plain[0].num_outstanding = 3
    assert prefix_aware(new, plain).index == 1


# -- the scenario's cluster section --------------------------------------------------------------

def base_raw(**cluster):
    return {
        "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
                   "num_gpu_blocks": 64, "max_model_len": 512},
        "scheduler": {"policy": "vllm_v1"},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": {"arrival": "burst", "num_requests": 4,
                     "prompt": {"dist": "fixed", "value": 10},
                     "output": {"dist": "fixed", "value": 3}},
        "cluster": cluster,
    }


def test_groups_override_sections_and_round_trip():
    raw = base_raw(router="least_kv", groups=[
        {"name": "big", "replicas": 2, "hardware": "H200",
         "engine": {"num_gpu_blocks": 128}},
        {"name": "small", "replicas": 1, "scheduler": {"policy": "sarathi"},
         "latency": {"step_ms": 20}}])
    s = parse_scenario(raw)
    big, small = s.cluster.groups
    assert s.cluster.replicas == 3
    assert big.scenario.hardware.name == "H200" and big.scenario.engine.num_gpu_blocks == 128
    assert big.scenario.engine.max_num_seqs == 8                 # the rest from the top level
    assert small.scenario.policy == "sarathi" and small.scenario.latency.step_ms == 20
    assert small.scenario.hardware.name == "H100-SXM"
    again = parse_scenario(s.to_dict())
    assert again.cluster == s.cluster
    r = simserve.run(s)
    assert list(r.requests["replica"]) == [0, 1, 2, 0]           # least_kv: all empty at t=0
    rows = {row["replica"]: row for row in r.summary["per_replica"]}
    assert rows[2]["group"] == "small" and rows[0]["group"] == "big"
    # replica 2 is twice as slow: 3 steps of 20 ms; the others 3 steps of 10 ms
    assert rows[2]["busy_s"] == pytest.approx(0.06) and rows[1]["busy_s"] == pytest.approx(0.03)


@pytest.mark.parametrize("cluster, field", [
    ({"groups": [{"name": "a", "engine": {"max_num_seqz": 3}}]},
     "cluster.groups[0].engine.max_num_seqz"),
    ({"groups": [{"name": "a"}, {"name": "b", "scheduler": {"policy": "nope"}}]},
     "cluster.groups[1].scheduler.policy"),
    ({"groups": [{"name": "a", "replicas": 0}]}, "cluster.groups[0].replicas"),
    ({"groups": [{"name": "a", "model": "Llama-3.1-8B"}]}, "cluster.groups[0].model"),
    ({"groups": [{"name": "a"}, {"name": "a"}]}, "cluster.groups[1].name"),
    ({"replicas": 2, "groups": [{"name": "a"}]}, "cluster.replicas"),
    ({"groups": [{"name": "a", "role": "prefill"}]}, "cluster.groups"),
    ({"kv_transfer": {"link": "nvlink"}}, "cluster.kv_transfer"),
    ({"groups": [{"role": "prefill"}, {"role": "decode"}], "kv_transfer": {"link": "x"}},
     "cluster.kv_transfer.link"),
    ({"router": "fastest"}, "cluster.router"),
    ({"faults": {"events": [{"replica": 3, "at_s": 1}]}}, "cluster.faults.events[0].replica"),
    ({"faults": {"on_failure": "ignore"}}, "cluster.faults.on_failure"),
])
def test_cluster_errors_name_the_field(cluster, field):
    with pytest.raises(ConfigError) as e:
        parse_scenario(base_raw(**cluster))
    assert e.value.field == field


def test_capacity_style_replace_still_works():
    import dataclasses
    s = parse_scenario(base_raw(replicas=2))
    s3 = s.replace(cluster=dataclasses.replace(s.cluster, replicas=3))
    assert len(simserve.run(s3).summary["per_replica"]) == 3
    grouped = parse_scenario(base_raw(groups=[{"name": "a", "replicas": 2}]))
    with pytest.raises(ConfigError):
        dataclasses.replace(grouped.cluster, replicas=3)


def test_per_replica_table_and_imbalance_by_hand():
    # round robin, 4 equal requests in a burst over 2 replicas: 2 each, equal busy time
    s = parse_scenario(base_raw(replicas=2))
    sm = simserve.run(s).summary
    assert [row["completed"] for row in sm["per_replica"]] == [2, 2]
    assert sm["load_imbalance_completed"] == 1.0 and sm["cv_completed"] == 0.0
    assert sm["load_imbalance_busy"] == pytest.approx(1.0)
    # 3 replicas: completed 2, 1, 1 -> max/mean = 2 / (4/3) = 1.5; cv = std/mean
    sm = simserve.run(parse_scenario(base_raw(replicas=3))).summary
    assert [row["completed"] for row in sm["per_replica"]] == [2, 1, 1]
    assert sm["load_imbalance_completed"] == pytest.approx(1.5)
    assert sm["cv_completed"] == pytest.approx(np.std([2, 1, 1]) / (4 / 3))
    # one replica: no per-replica table (the single-replica summary is unchanged)
    assert "per_replica" not in simserve.run(parse_scenario(base_raw())).summary


# -- tensor parallelism --------------------------------------------------------------------------

def test_tp_allreduce_cost_monotone_in_message_size():
    m, hw = load_model("Llama-3.1-70B"), load_hardware("H100-SXM")
    for tp in (2, 4, 8):
        model = RooflineModel(m, hw, tensor_parallel_size=tp)
        costs = [model.allreduce_s(n) for n in (1, 8, 64, 512, 4096, 32768)]
        assert all(b > a for a, b in zip(costs, costs[1:]))
        # ring: 2 all-reduces x L layers x (2 (TP-1)/TP x n h b / link + latency)
        n = 4096
        expect = 2 * m.num_layers * (2 * (tp - 1) / tp * n * m.hidden_size * m.dtype_bytes
                                      / hw.interconnect_bandwidth + 10e-6)
        assert model.allreduce_s(n) == pytest.approx(expect, rel=1e-12)
    # more ranks: a larger share of the message crosses each link
    assert RooflineModel(m, hw, tensor_parallel_size=8).allreduce_s(4096) > \
        RooflineModel(m, hw, tensor_parallel_size=2).allreduce_s(4096)
    assert RooflineModel(m, hw).allreduce_s(4096) == 0.0


def test_tp_splits_compute_and_sums_kv_capacity():
    m, hw = load_model("Llama-3.1-70B"), load_hardware("H100-SXM")
    plan = StepPlan((0,), (2048,), (2048,), (0,), (), 1)
    t2 = RooflineModel(m, hw, tensor_parallel_size=2).breakdown(plan)
    t4 = RooflineModel(m, hw, tensor_parallel_size=4).breakdown(plan)
    assert t4["linear"] == pytest.approx(t2["linear"] / 2, rel=0.01)   # compute bound
    # KV: each rank holds its heads' share of every block; the replica's blocks = one rank's
    blocks = {tp: kv_capacity_blocks(m, hw, block_size=16, gpu_memory_utilization=0.9,
                                     tensor_parallel_size=tp, max_num_batched_tokens=8192)
              for tp in (2, 4, 8)}
    for tp, n in blocks.items():
        free_per_rank = n * kv_block_bytes(m, 16, tp)
        assert free_per_rank <= 0.9 * hw.mem_bytes - m.weight_bytes / tp
    assert blocks[4] > 2 * blocks[2] and blocks[8] > 2 * blocks[4]   # weights shrink too


def test_profile_latency_with_tp_scales_compute_and_adds_allreduce():
    from simserve.latency.profile import ProfileLatency
    from tests.unit.test_profile_latency import TINY, synthetic_profile
    plan = StepPlan((0,), (16,), (16,), (0,), (), 1)
    one = ProfileLatency(synthetic_profile()).breakdown(plan)
    roof = RooflineModel(TINY, load_hardware("H100-SXM"), tensor_parallel_size=2)
    two = ProfileLatency(synthetic_profile(), tensor_parallel_size=2,
                         allreduce_s=roof.allreduce_s)
    parts = two.breakdown(plan)
    for name in ("linear", "attn_prefill", "lm_head"):
        assert parts[name] == pytest.approx(one[name] / 2)
    assert parts["embedding"] == one["embedding"]
    assert parts["allreduce"] == roof.allreduce_s(16) > 0
    assert "TP 2 scaled from TP 1 + roofline all-reduce" in two.label
    # a profile measured at TP 2 is used as measured (all-reduce still added)
    prof = synthetic_profile()
    prof["settings"]["tensor_parallel_size"] = 2
    same = ProfileLatency(prof, tensor_parallel_size=2, allreduce_s=roof.allreduce_s)
    assert same.breakdown(plan)["linear"] == one["linear"] and "scaled" not in same.label


# -- invariants of random clusters ---------------------------------------------------------------

ROUTER_NAMES = ("round_robin", "random", "least_outstanding", "least_kv", "jsq_tokens",
                "prefix_aware")


@st.composite
def cluster_cases(draw):
    case = draw(scenarios())
    n = draw(st.integers(2, 4))
    return case, ["mixed"] * n, draw(st.sampled_from(ROUTER_NAMES))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_cases())
def test_cluster_conserves_and_fast_forward_equals_stepping(c):
    case, roles, router = c
    fast, replicas = run_cluster(case, roles, router, fast_forward=True)
    check_accounting(fast, replicas, case[6])
    assert np.array_equal(pooled_itl(fast), online_itl(fast, replicas))
    slow, _ = run_cluster(case, roles, router, fast_forward=False)
    assert_same_runs(fast, slow)


def test_heterogeneous_cluster_end_to_end_both_ways():
    raw = base_raw(router="jsq_tokens", groups=[
        {"name": "a", "replicas": 2, "scheduler": {"policy": "vllm_v0"}},
        {"name": "b", "replicas": 1, "hardware": "A100-80GB",
         "latency": {"model": "roofline"}, "engine": {"num_gpu_blocks": 32}}])
    raw["workload"] = {"arrival": "poisson", "rate": 50, "num_requests": 120,
                       "prompt": {"dist": "uniform", "low": 8, "high": 300},
                       "output": {"dist": "uniform", "low": 1, "high": 120}}
    s = parse_scenario(raw)
    fast = simserve.run(s)
    slow = simserve.run(s, fast_forward=False)
    assert fast.requests.equals(slow.requests)
    assert fast.steps.equals(slow.steps)
    assert fast.summary["completed"] == 120
    assert sum(row["completed"] for row in fast.summary["per_replica"]) == 120


def shared_prefix_chat(n: int) -> dict:
    """A workload section: ``n`` requests at 40 req/s, 3 system prompts x 2 users."""
    return {"arrival": "poisson", "rate": 40, "num_requests": n,
            "shared_prefix": {"num_unique_system_prompts": 3, "num_users_per_system_prompt": 2,
                              "system_prompt_len": 48, "question_len": 40, "output_len": 60}}


def assert_two_groups_equal_stepping(router: str, engine: dict, policy: str = "vllm_v1"):
    """Two replicas of ``policy`` and one of ``priority`` with fewer KV blocks (``engine``
    for all), 300 requests of a shared-prefix chat that keeps them all busy: fast-forward
    gives the same steps, requests and summary as stepping every replica together."""
    raw = base_raw(router=router, groups=[
        {"name": "a", "replicas": 2},
        {"name": "b", "replicas": 1, "scheduler": {"policy": "priority"},
         "engine": {"num_gpu_blocks": 40}}])
    raw["engine"].update(engine)
    raw["scheduler"]["policy"] = policy
    raw["latency"] = {"model": "roofline"}
    raw["workload"] = shared_prefix_chat(300)
    s = parse_scenario(raw)
    fast = simserve.run(s)
    slow = simserve.run(s, fast_forward=False)
    assert fast.requests.equals(slow.requests)
    assert fast.steps.equals(slow.steps)
    assert fast.summary == slow.summary
    assert fast.summary["completed"] == 300
    assert all(row["completed"] > 50 for row in fast.summary["per_replica"])


@pytest.mark.parametrize("router", ["round_robin", "random"])
@pytest.mark.parametrize("engine", [{}, {"async_scheduling": True},
                                    {"enable_prefix_caching": True}])
def test_clusters_routed_ahead_equal_stepping(router, engine):
    # round_robin and random route by arrival order alone: each replica runs the solo loop
    # over its own arrivals (engine/mode.py), arrivals joining its stretches; the same steps,
    # requests and summary as stepping every replica together. Two groups of different
    # policies and KV sizes; the prompts share prefixes, and the rate keeps them all busy.
    assert_two_groups_equal_stepping(router, engine)


@pytest.mark.parametrize("router, policy, engine", [
    ("least_outstanding", "vllm_v1", {}),
    ("least_outstanding", "vllm_v1", {"enable_prefix_caching": True}),
    ("least_outstanding", "vllm_v1", {"num_gpu_blocks": 24, "max_num_seqs": 3}),
    ("least_outstanding", "sarathi", {"enable_prefix_caching": True, "num_gpu_blocks": 30}),
    ("least_outstanding", "vllm_v0", {}),
    ("least_outstanding", "vllm_v0", {"num_gpu_blocks": 24, "max_num_seqs": 3}),
    ("least_kv", "vllm_v1", {}),
    ("least_kv", "sarathi", {"enable_prefix_caching": True, "num_gpu_blocks": 30}),
    ("least_kv", "vllm_v0", {"num_gpu_blocks": 24, "max_num_seqs": 3}),
    ("jsq_tokens", "vllm_v1", {}),
    ("jsq_tokens", "sarathi", {"enable_prefix_caching": True, "num_gpu_blocks": 30}),
    ("jsq_tokens", "vllm_v0", {}),
    ("jsq_tokens", "vllm_v0", {"num_gpu_blocks": 24, "max_num_seqs": 3}),
    ("least_kv", "vllm_v1", {"enable_prefix_caching": True}),
    ("prefix_aware", "vllm_v1", {"enable_prefix_caching": True}),
    ("prefix_aware", "vllm_v1", {"enable_prefix_caching": True, "num_gpu_blocks": 30}),
    ("prefix_aware", "sarathi", {"enable_prefix_caching": True, "num_gpu_blocks": 30}),
    ("prefix_aware", "vllm_v1", {})])
def test_clusters_behind_counting_routers_equal_stepping(router, policy, engine):
    # least_outstanding reads only the requests a replica holds, least_kv also its KV use,
    # jsq_tokens its tokens of work left, prefix_aware its prefix cache: each replica's
    # stretches run past the arrivals that go elsewhere and past its own finishes (what the
    # router reads of them brought to each arrival's instant: with prefix caching the named
    # blocks' operations replayed up to the step each is at), an arrival routed to a replica
    # cuts its stretch in flight back, and those routed there join it, with their cache hits.
    # The same steps, requests and summary as stepping every replica together; with prefix
    # caching, and with KV pressure (preemptions, steps that wait, cached prefixes evicted)
    assert_two_groups_equal_stepping(router, engine, policy)


@pytest.mark.parametrize("router, async_scheduling", [
    ("least_outstanding", False), ("least_kv", False), ("jsq_tokens", False),
    ("least_outstanding", True), ("least_kv", True), ("jsq_tokens", True)])
def test_a_counting_router_sees_a_step_in_flight_only_once_it_has_ended(router,
                                                                        async_scheduling):
    # every step takes 0.25 s and every arrival is at a multiple of it, so arrivals come at
    # the very instants steps end, finishes among them: the router counts a request that a
    # stretch in flight finished (and the KV blocks or tokens a step frees, takes or computes)
    # only if the step before ended before the arrival, not at the same instant (stepping
    # takes arrivals first), and sends each request where stepping does. With async
    # scheduling (the async counted loop) the instants are those at which outputs are
    # delivered and the next steps scheduled: a request routed to a replica is seen by the
    # step scheduled at or after its arrival, and its stretch in flight is cut back there;
    # the KV use and tokens left the router reads are those after the last step scheduled
    # before the arrival (the frees that come with an output delivered at the arrival's
    # instant not yet)
    rng = np.random.default_rng(7)
    ticks = np.sort(rng.integers(0, 160, 90))
    specs = [RequestSpec(i, 0.25 * int(t), int(rng.integers(5, 60)), int(rng.integers(2, 30)))
             for i, t in enumerate(ticks)]

    def run(fast_forward):
        reps = [Replica(i, make_scheduler("vllm_v1", async_scheduling=async_scheduling),
                        ConstantLatency(0.25), 10_000)
                for i in range(3)]
        for r in reps:
            r.scheduler.record_tokens = True
        rec = simulate(specs, reps, make_router(router), fast_forward=fast_forward)
        return rec, reps

    slow, _ = run(False)
    fast, reps = run(True)
    assert_same_runs(fast, slow)
    check_accounting(fast, reps, specs)
    finishes = {q.finish_s for q in slow.requests}
    assert sum(s.arrival_s in finishes for s in specs) >= 20


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prefix_aware_reads_a_stretch_in_flights_cache_as_of_the_step_it_is_at(
        async_scheduling):
    # prefix caching on 3 replicas with a tight KV cache (cached prefixes evicted all the
    # time), prompts from 4 groups sharing a system prompt; every step takes 0.25 s and every
    # arrival is at a multiple of it, so arrivals come at the very instants steps end and
    # requests finish. prefix_aware asks each replica's cache what the newcomer would hit: a
    # stretch in flight answers as of the step it is at (its blocks' takes, its finished
    # requests' blocks cached on the way, the evictions they caused; not the frees of a step
    # that ends at the arrival's instant), so each request goes where stepping sends it and
    # hits what stepping hits, and the caches end as stepping leaves them. With async
    # scheduling (the async counted loop) as of the step scheduled last before the arrival
    rng = np.random.default_rng(2)
    ticks = np.sort(rng.integers(0, 200, 110))
    specs = []
    for i, t in enumerate(ticks):
        g, u = int(rng.integers(4)), int(rng.integers(3))
        ids = (1000 + g,) * 2 + tuple(100 * (4 * g + u + 1) + b for b in range(2))
        specs.append(RequestSpec(i, 0.25 * int(t), 32, int(rng.integers(2, 40)), ids))

    slow, slow_reps = _prefix_cluster(specs, "prefix_aware", False, async_scheduling)
    fast, reps = _prefix_cluster(specs, "prefix_aware", True, async_scheduling)
    assert_same_runs(fast, slow)
    check_accounting(fast, reps, specs)
    assert [(q.replica, q.num_cached_tokens) for q in fast.requests] == \
        [(q.replica, q.num_cached_tokens) for q in slow.requests]
    for a, b in zip(reps, slow_reps):
        assert a.scheduler.blocks.free_order() == b.scheduler.blocks.free_order()
        assert a.scheduler.blocks.num_evicted == b.scheduler.blocks.num_evicted > 0
    finishes = {q.finish_s for q in slow.requests}
    assert sum(s.arrival_s in finishes for s in specs) >= 20
    assert sum(q.num_cached_tokens > 0 for q in slow.requests) >= 40
    # the cache decides: not where least_outstanding alone would send them
    plain, _ = _prefix_cluster(specs, "least_outstanding", False, async_scheduling)
    assert [q.replica for q in plain.requests] != [q.replica for q in slow.requests]


def _prefix_cluster(specs, router, fast_forward, async_scheduling=False):
    """``specs`` on 3 vLLM v1 replicas with prefix caching (60 blocks of 4 tokens) whose
    every step takes 0.25 s, behind ``router``."""
    reps = []
    for i in range(3):
        sched = POLICIES["vllm_v1"](SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=256,
                                                    enable_chunked_prefill=True,
                                                    async_scheduling=async_scheduling),
                                    PrefixBlockManager(60, 4, source_block_size=8))
        sched.record_tokens = True
        reps.append(Replica(i, sched, ConstantLatency(0.25), 10_000))
    return simulate(specs, reps, make_router(router), fast_forward=fast_forward), reps


def test_async_stretches_take_the_requests_routed_to_them(monkeypatch):
    # async replicas behind least_outstanding (the async counted loop): a request routed to a
    # replica cuts back its stretch in flight to the steps scheduled before it came, joins
    # it at the next (AsyncStretch.rejoin: its times, the CPU free after each step's CPU
    # part, picked up there), and the stretch may be cut back again by the next; a latency
    # with a CPU part (async scheduling overlaps it). The same run as stepping
    from simserve.sched.async_stretch import AsyncStretch
    counts = {"joined": 0, "cut_after_joins": 0}
    rejoin, cut_back = AsyncStretch.rejoin, AsyncStretch.cut_back

    def counted_rejoin(self, *args):
        joined = rejoin(self, *args)
        counts["joined"] += joined
        return joined

    def counted_cut_back(self, keep):
        counts["cut_after_joins"] += bool(self.joins)
        cut_back(self, keep)

    monkeypatch.setattr(AsyncStretch, "rejoin", counted_rejoin)
    monkeypatch.setattr(AsyncStretch, "cut_back", counted_cut_back)
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.004, 300))
    specs = [RequestSpec(i, float(t[i]), int(rng.integers(5, 90)), int(rng.integers(2, 120)))
             for i in range(300)]
    fast, reps = _roofline_cluster(specs, "least_outstanding", True, True, 400, 16)
    slow, _ = _roofline_cluster(specs, "least_outstanding", False, True, 400, 16)
    assert_same_runs(fast, slow)
    check_accounting(fast, reps, specs)
    assert counts["joined"] >= 10 and counts["cut_after_joins"] >= 10


@pytest.mark.parametrize("router, async_scheduling", [
    ("least_outstanding", False), ("jsq_tokens", False), ("least_outstanding", True),
    ("least_kv", True)])
def test_a_stretch_that_no_arrival_cut_back_goes_on(monkeypatch, router, async_scheduling):
    # a counted loop prices a replica's stretch only a couple of arrivals per replica ahead:
    # when none of those came to it and nothing waits, it goes on from its last step to the
    # next such cut (Stretch.extend, AsyncStretch.extend), as it would have been priced with
    # a later cut, instead of being applied and planned again. Here one long request holds
    # replica 0 while short ones come and go on the others (the router sends them there: it
    # holds fewer, uses less KV, has fewer tokens left). The same run as stepping
    from simserve.sched.async_stretch import AsyncStretch
    from simserve.sched.stretch import Stretch
    cls = AsyncStretch if async_scheduling else Stretch
    went_on = []
    extend = cls.extend

    def counted(self, *args):
        more = extend(self, *args)
        went_on.append(more)
        return more

    monkeypatch.setattr(cls, "extend", counted)
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.exponential(0.05, 200))
    specs = [RequestSpec(0, 0.0, 20, 3000)]
    specs += [RequestSpec(i, float(t[i]), int(rng.integers(5, 40)), int(rng.integers(2, 20)))
              for i in range(1, 200)]
    fast, reps = _roofline_cluster(specs, router, True, async_scheduling, 2000, 32)
    n = len(went_on)
    slow, _ = _roofline_cluster(specs, router, False, async_scheduling, 2000, 32)
    assert_same_runs(fast, slow)
    check_accounting(fast, reps, specs)
    assert sum(went_on[:n]) >= 5


def _roofline_cluster(specs, router, fast_forward, async_scheduling, num_blocks, max_num_seqs):
    """``specs`` on 3 vLLM v1 replicas (a 256-token budget, blocks of 4 tokens) priced by a
    roofline with a CPU part, behind ``router``."""
    from tests.property.test_properties import _roofline
    reps = [Replica(i, make_scheduler("vllm_v1", budget=256, num_blocks=num_blocks,
                                      block_size=4, max_num_seqs=max_num_seqs,
                                      async_scheduling=async_scheduling),
                    _roofline(7e-4), 10_000) for i in range(3)]
    for r in reps:
        r.scheduler.record_tokens = True
    return simulate(specs, reps, make_router(router), fast_forward=fast_forward), reps


@pytest.mark.parametrize("router, async_scheduling", [
    ("least_outstanding", False), ("least_kv", False), ("least_outstanding", True),
    ("least_kv", True)])
def test_a_cluster_counts_the_profile_lookups_stepping_counts(router, async_scheduling):
    # a profile counts its lookups past the measured grid (the run's warnings): the steps a
    # stretch priced and then dropped (cut back in flight by an arrival, or past an event;
    # async stretches too) are taken back, so the counts are stepping's
    from tests.unit.test_profile_latency import curved_decode_profile
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(0.02, 200))
    specs = [RequestSpec(i, float(t[i]), int(rng.integers(900, 1200)), int(rng.integers(20, 300)))
             for i in range(200)]
    counts = []
    for fast_forward in (True, False):
        latency = ProfileLatency(curved_decode_profile())
        reps = [Replica(i, make_scheduler("vllm_v1", budget=512, num_blocks=4000,
                                          block_size=16, async_scheduling=async_scheduling),
                        latency, 10_000) for i in range(3)]
        rec = simulate(specs, reps, make_router(router), fast_forward=fast_forward)
        assert all(q.status is Status.FINISHED for q in rec.requests)
        counts.append(dict(latency.extrapolated))
    assert counts[0] == counts[1]
    assert counts[0]["attn_decode"] > 1000


@pytest.mark.parametrize("router, replicas", [("least_outstanding", 1), ("jsq_tokens", 3)])
def test_gaps_of_requests_that_wait_in_a_stretchs_first_step_sum_as_stepping(router, replicas):
    # vllm_v0: in a stretch that starts with a prefill step, running decodes wait in step 0
    # and take their next token at step 1; their gaps since then are listed after the step-0
    # gaps of the others, as stepping lists them, so the ITL mean and deviation (float sums
    # of that list) are the same bits
    raw = {"seed": 0, "model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 512, "max_model_len": 256,
                      "num_gpu_blocks": 40},
           "scheduler": {"policy": "vllm_v0"},
           "latency": {"model": "profile", "path": "tiny-llama-45m_cpu-epyc-2core_bf16_1t"},
           "workload": {"arrival": "burst", "num_requests": 73,
                        "prompt": {"dist": "exponential", "mean": 193, "max": 600},
                        "output": {"dist": "uniform", "low": 101, "high": 206}},
           "cluster": {"router": router, "replicas": replicas}}
    s = parse_scenario(raw)
    fast, slow = simserve.run(s), simserve.run(s, fast_forward=False)
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)
    assert fast.summary == slow.summary


def test_requests_routed_ahead_come_back_in_the_workload_order():
    # specs whose ids do not follow their order (simulate() takes any): the recorder's
    # requests are in the order stepping adds them, the workload's, not by id or by replica
    specs = [RequestSpec(5, 0.0, 20, 5), RequestSpec(2, 0.0, 20, 5), RequestSpec(9, 0.0, 20, 5),
             RequestSpec(1, 0.01, 20, 5), RequestSpec(0, 0.02, 20, 5)]
    ids = []
    for fast_forward in (True, False):
        reps = [Replica(i, make_scheduler("vllm_v1"), ToyLatency(), 10_000) for i in range(3)]
        rec = simulate(specs, reps, make_router("round_robin"), fast_forward=fast_forward)
        ids.append([q.id for q in rec.requests])
    assert ids[0] == ids[1] == [5, 2, 9, 1, 0]


def test_one_replica_behind_a_router_that_reads_its_cache_equals_stepping():
    # one replica takes its arrivals itself: no router is asked (its choice is forced). Before,
    # prefix_aware's probe of the cache ran inside a join's lookup and broke its count
    raw = base_raw(replicas=1, router="prefix_aware")
    raw["engine"]["enable_prefix_caching"] = True
    raw["workload"] = shared_prefix_chat(200)
    s = parse_scenario(raw)
    fast, slow = simserve.run(s), simserve.run(s, fast_forward=False)
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)
    assert fast.summary["completed"] == 200


def test_cluster_scenario_file_runs():
    for label, result in compare("scenarios/cluster_routing.yaml",
                                          overrides=["workload.num_requests=150"]).items():
        sm = result.summary
        assert sm["completed"] + sm["num_rejected"] == 150, label
        assert len(sm["per_replica"]) == 4


def test_scenario_copy_is_unchanged_by_parsing():
    raw = base_raw(groups=[{"name": "a", "engine": {"max_num_seqs": 2}}])
    before = copy.deepcopy(raw)
    parse_scenario(raw)
    assert raw == before
