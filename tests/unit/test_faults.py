"""Failures: a hand-stepped failure pinning the accounting (steps lost and kept, retries,
failed requests, SLO misses), requests held while no replica is up, seeded MTBF failures, and
conservation plus fast-forward equal to stepping under random failures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simserve
from simserve.config import parse_scenario
from simserve.cluster.faults import FaultConfig, FaultEvent, FaultSchedule
from simserve.sched import Status
from tests.unit.test_cluster import (ROUTER_NAMES, assert_same_runs, check_accounting, online_itl,
                                pooled_itl, run_cluster)
from tests.property.test_properties import scenarios


def faults_raw(replicas=2, **faults):
    return {
        "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
                   "num_gpu_blocks": 64, "max_model_len": 512},
        "scheduler": {"policy": "vllm_v1"},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": {"arrival": "burst", "num_requests": 4,
                     "prompt": {"dist": "fixed", "value": 10},
                     "output": {"dist": "fixed", "value": 5}},
        "slo": {"ttft_ms": 1000},
        "cluster": {"replicas": replicas, "router": "round_robin", "faults": faults},
    }


def test_a_failure_also_evacuates_fastserve_paused_jobs():
    # FastServe, one sequence per step, quantum 1: the two requests alternate, so at any step
    # boundary one of them is paused (KV held, not running). Replica 0 of one fails at 25 ms:
    # the paused job must be retried with the running one, not lost with the replica.
    raw = faults_raw(replicas=1, events=[{"replica": 0, "at_s": 0.025, "restart_s": 0.05}])
    raw["engine"]["max_num_seqs"] = 1
    raw["scheduler"] = {"policy": "fastserve", "num_queues": 2, "quantum_unit": "iterations",
                        "base_quantum": 1}
    raw["workload"]["num_requests"] = 2
    sm = simserve.run(parse_scenario(raw)).summary
    assert sm["completed"] == 2 and sm["num_failed"] == 0 and sm["num_rejected"] == 0
    assert sm["num_retried_requests"] == 2


def test_failure_with_retry_by_hand():
    # 4 requests at t=0 (prompt 10, 5 tokens), round robin: replica 0 serves 0 and 2, replica 1
    # serves 1 and 3; every step 10 ms. Replica 0 fails at 25 ms (back at 125 ms):
    #   replica 0: 0-10 prefill (token 1), 10-20 decode (token 2) stand; 20-30 is lost
    #   requests 0 and 2 keep their 2 streamed tokens and go to replica 1 (the only one up),
    #   which recomputes prompt + 2 tokens (12 each) in its step at 30 ms:
    #   replica 1: tokens of 1, 3 at 10, 20, 30, 40, 50; of 0, 2 at 40 (token 3), 50, 60
    s = parse_scenario(faults_raw(events=[{"replica": 0, "at_s": 0.025, "restart_s": 0.1}]))
    r = simserve.run(s, record_tokens=True)
    sm = r.summary
    assert sm["completed"] == 4 and sm["num_failed"] == 0
    assert sm["num_retries"] == 2 and sm["num_retried_requests"] == 2
    assert sm["num_replica_failures"] == 1
    assert r.token_times[0] == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.06])
    assert r.token_times[1] == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert list(r.requests["replica"]) == [1, 1, 1, 1]
    assert r.requests["ttft_s"][0] == pytest.approx(0.01)       # its first token was streamed
    steps = r.steps
    assert list(steps[steps["replica"] == 0]["start_s"]) == pytest.approx([0.0, 0.01])
    one = steps[steps["replica"] == 1]
    assert list(one["num_prefill_tokens"]) == [20, 0, 0, 24, 0, 0]
    # ITL: 0 and 2 have gaps 10, 20 (across the failure), 10, 10; 1 and 3 four gaps of 10
    assert sm["mean_itl_ms"] == pytest.approx((2 * 50 + 2 * 40) / 16)
    assert sm["slo_attainment"] == 1.0


def test_failure_with_fail_policy_counts_misses():
    s = parse_scenario(faults_raw(on_failure="fail",
                                  events=[{"replica": 0, "at_s": 0.025, "restart_s": 0.1}]))
    r = simserve.run(s)
    sm = r.summary
    assert sm["completed"] == 2 and sm["num_failed"] == 2 and sm["num_retries"] == 0
    assert sm["failed_by_reason"] == {"replica_failure": 2}
    assert list(r.requests["status"]) == ["failed", "finished", "failed", "finished"]
    assert sm["num_good"] == 2 and sm["slo_attainment"] == 0.5   # failed requests are misses
    # retry with no retries left fails them too, with another reason
    s = parse_scenario(faults_raw(max_retries=0,
                                  events=[{"replica": 0, "at_s": 0.025, "restart_s": 0.1}]))
    assert simserve.run(s).summary["failed_by_reason"] == {"retries_exhausted": 2}


def test_requests_wait_for_a_restart_when_no_replica_is_up():
    # one replica, fails at 25 ms, back at 125 ms: all 4 requests wait, then recompute 12
    # tokens each in one step (125-135 ms: token 3) and decode tokens 4, 5 at 145, 155 ms
    s = parse_scenario(faults_raw(replicas=1,
                                  events=[{"replica": 0, "at_s": 0.025, "restart_s": 0.1}]))
    r = simserve.run(s, record_tokens=True)
    assert r.summary["completed"] == 4 and r.summary["num_retries"] == 4
    assert r.token_times[0] == pytest.approx([0.01, 0.02, 0.135, 0.145, 0.155])
    # a failure while the replica is down, or after everything finished, changes nothing
    s = parse_scenario(faults_raw(replicas=1, events=[
        {"replica": 0, "at_s": 0.025, "restart_s": 0.1}, {"replica": 0, "at_s": 0.05},
        {"replica": 0, "at_s": 5.0}]))
    again = simserve.run(s, record_tokens=True)
    assert list(again.token_times[0]) == list(r.token_times[0])
    assert again.summary["num_replica_failures"] == 1


def test_a_token_in_transit_is_lost_with_the_transfer(tmp_path):
    # disaggregated, every step 10 ms, the link takes 50 ms for A's 10 tokens of KV. A (prompt
    # 10, 2 tokens): prefill 0-10 ms samples token 1, in transit until 60 ms; the prefill
    # replica fails at 30 ms (back at 40): the transfer is lost, token 1 never reached the
    # client. A is retried when the replica is back: prefill 40-50 ms, lands at 100 ms (token 1),
    # decodes token 2 at 110 ms.
    from tests.unit.test_disagg import BYTES_PER_TOKEN, disagg_raw
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,2\n")
    raw = disagg_raw({"trace": str(path), "format": "csv"},
                     link={"bandwidth": 10 * BYTES_PER_TOKEN / 0.05, "latency_us": 0})
    raw["cluster"]["faults"] = {"events": [{"replica": 0, "at_s": 0.03, "restart_s": 0.01}]}
    r = simserve.run(parse_scenario(raw), record_tokens=True)
    assert r.token_times[0] == pytest.approx([0.1, 0.11])
    assert r.summary["num_retries"] == 1 and r.summary["num_kv_transfers"] == 2
    assert r.requests["ttft_s"][0] == pytest.approx(0.1)


def test_mtbf_failures_are_seeded_per_replica():
    cfg = FaultConfig(mtbf_s=10.0, restart_s=1.0)
    a, b = FaultSchedule(cfg, 3, seed=1), FaultSchedule(cfg, 3, seed=1)
    assert a.initial() == b.initial()
    assert a.initial() != FaultSchedule(cfg, 3, seed=2).initial()
    assert sorted(i for _, i, _ in a.initial()) == [0, 1, 2]
    # each replica draws from its own stream: replica 0's times do not depend on replica 2's
    a, c = FaultSchedule(cfg, 3, seed=1), FaultSchedule(cfg, 3, seed=1)
    a.initial()
    t0 = [a.next_random(0, 0.0) for _ in range(3)]
    c.initial()
    c.next_random(2, 0.0)
    assert [c.next_random(0, 0.0) for _ in range(3)] == t0
    explicit = FaultSchedule(FaultConfig(events=(FaultEvent(1, 3.0, 2.0),)), 2)
    assert explicit.initial() == [(3.0, 1, 2.0)] and explicit.next_random(1, 5.0) is None
    s = parse_scenario(faults_raw(mtbf_s=0.02, restart_s=0.01))
    runs = [simserve.run(s).requests for _ in range(2)]
    assert runs[0].equals(runs[1])


@st.composite
def fault_cases(draw):
    case = draw(scenarios())
    if draw(st.booleans()):
        roles = ["mixed"] * draw(st.integers(1, 3))
    else:
        roles = ["prefill"] * draw(st.integers(1, 2)) + ["decode"] * draw(st.integers(1, 2))
    n = len(roles)
    events = tuple(FaultEvent(draw(st.integers(0, n - 1)), draw(st.floats(0, 1.5)),
                              draw(st.one_of(st.none(), st.floats(1e-3, 0.3))))
                   for _ in range(draw(st.integers(0, 4))))
    mtbf = draw(st.one_of(st.none(), st.floats(0.05, 1.0)))
    cfg = FaultConfig(on_failure=draw(st.sampled_from(["retry", "fail"])),
                      max_retries=draw(st.integers(0, 3)),
                      restart_s=draw(st.floats(1e-3, 0.2)), mtbf_s=mtbf,
                      events=tuple(sorted(events, key=lambda e: (e.at_s, e.replica))))
    return case, roles, draw(st.sampled_from(ROUTER_NAMES)), cfg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_cases())
def test_failures_conserve_and_fast_forward_equals_stepping(c):
    case, roles, router, cfg = c
    fast, replicas = run_cluster(case, roles, router, faults=cfg, fast_forward=True)
    check_accounting(fast, replicas, case[6])
    failed = [r for r in fast.requests if r.status is Status.FAILED]
    if cfg.on_failure == "fail" or cfg.max_retries == 0:
        assert not fast.retries
    assert all(n <= cfg.max_retries for n in fast.retries.values())
    assert len(failed) <= sum(1 for _ in fast.failures) * len(case[6])
    if not failed:   # a failed request's streamed gaps stay in the online sample (documented)
        assert np.array_equal(pooled_itl(fast), online_itl(fast, replicas))
    slow, _ = run_cluster(case, roles, router, faults=cfg, fast_forward=False)
    assert_same_runs(fast, slow)
