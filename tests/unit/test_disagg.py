"""Disaggregated prefill/decode: transfer timing by hand, what the client sees, decode admission
waiting for KV blocks, and the invariants (conservation, KV returned, fast-forward equal to
stepping) under random disaggregated clusters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simserve
from simserve.runner import compare
from simserve.cards import load_model
from simserve.cluster import LINKS, TransferConfig
from simserve.config import parse_scenario
from simserve.sched import Status
from tests.unit.test_cluster import (ROUTER_NAMES, assert_same_runs, check_accounting, online_itl,
                                pooled_itl, run_cluster)
from tests.property.test_properties import scenarios

TINY = load_model("tiny-llama-45m")
# K and V of one token, all layers: 2 x 4 layers x 8 KV heads x 64 x 2 bytes (tiny-llama-45m)
BYTES_PER_TOKEN = TINY.kv_bytes_per_token


def disagg_raw(workload, prefill=None, decode=None, link=None, tp=1):
    return {
        "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
                   "num_gpu_blocks": 64, "max_model_len": 512, "tensor_parallel_size": tp},
        "scheduler": {"policy": "vllm_v1"},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": workload,
        "cluster": {"router": "round_robin", "groups": [
            {"name": "prefill", "role": "prefill", "replicas": 1, **(prefill or {})},
            {"name": "decode", "role": "decode", "replicas": 1, **(decode or {})}],
            "kv_transfer": link or {"link": "nvlink"}},
    }


def two_requests(path):
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,3\n0.012,20,1\n")
    return {"trace": str(path), "format": "csv"}


def test_hand_computed_handoff(tmp_path):
    # A (t=0, prompt 10, 3 tokens) and B (t=12 ms, prompt 20, 1 token); every step 10 ms.
    # The link moves A's 10 tokens of KV (10 x 8192 B) in 5 ms: bandwidth 81920 B / 5 ms.
    #   prefill replica: 0-10 ms A's prompt -> token 1 sampled at 10 ms; KV leaves
    #                    12-22 ms B's prompt -> B's only token at 22 ms: B ends here
    #   transfer:        A's KV lands on the decode replica at 15 ms: token 1 reaches the client
    #   decode replica:  15-25 ms token 2, 25-35 ms token 3
    # A: TTFT 15 ms, E2EL 35 ms, TPOT (35 - 15) / 2 = 10 ms; ITL gaps 10, 10.
    # B: TTFT = E2EL = 10 ms (nothing to hand off).
    assert BYTES_PER_TOKEN == 2 * 4 * 8 * 64 * 2 == 8192
    link = {"bandwidth": 10 * BYTES_PER_TOKEN / 0.005, "latency_us": 0}
    s = parse_scenario(disagg_raw(two_requests(tmp_path / "t.csv"), link=link))
    r = simserve.run(s, record_tokens=True)
    a, b = r.requests.iloc[0], r.requests.iloc[1]
    assert a["ttft_s"] == pytest.approx(0.015) and a["e2el_s"] == pytest.approx(0.035)
    assert a["tpot_s"] == pytest.approx(0.010)
    assert a["replica"] == 1 and b["replica"] == 0           # where each request ended
    assert b["ttft_s"] == pytest.approx(0.010) and b["e2el_s"] == pytest.approx(0.010)
    assert r.token_times[0] == pytest.approx([0.015, 0.025, 0.035])
    assert r.summary["mean_itl_ms"] == pytest.approx(10) and r.summary["num_kv_transfers"] == 1
    assert r.summary["mean_kv_transfer_ms"] == pytest.approx(5)
    steps = r.steps
    pre, dec = steps[steps["replica"] == 0], steps[steps["replica"] == 1]
    assert list(pre["start_s"]) == pytest.approx([0.0, 0.012])
    # B's step holds its 2 blocks and A's 1 block, still on the prefill replica until 15 ms
    assert list(pre["kv_blocks_used"]) == [1, 3]
    assert list(dec["start_s"]) == pytest.approx([0.015, 0.025])
    assert list(dec["num_decode_seqs"]) == [1, 1] and list(dec["num_prefill_tokens"]) == [0, 0]
    assert r.summary["completed"] == 2


def test_transfer_time_presets_and_tensor_parallel_shares():
    assert TransferConfig("infiniband").seconds(1e9) == pytest.approx(1e9 / 50e9 + 10e-6)
    assert TransferConfig("pcie", latency_us=2).seconds(64e9) == pytest.approx(1 + 2e-6)
    assert TransferConfig(bandwidth=1e9, latency_us=0).seconds(5e8) == 0.5
    assert set(LINKS) == {"nvlink", "infiniband", "pcie"}
    # each rank sends its heads' share over its own link: TP 2 halves the bytes per link
    burst = {"arrival": "burst", "num_requests": 1, "prompt": {"dist": "fixed", "value": 9},
             "output": {"dist": "fixed", "value": 2}}
    one = parse_scenario(disagg_raw(burst))
    two = parse_scenario(disagg_raw(burst, tp=2))
    assert one.replica.kv_bytes_per_token == BYTES_PER_TOKEN
    assert two.replica.kv_bytes_per_token == BYTES_PER_TOKEN // 2


def test_slower_link_delays_the_first_token_only(tmp_path):
    wl = two_requests(tmp_path / "t.csv")
    fast = simserve.run(parse_scenario(disagg_raw(wl, link={"link": "nvlink"}))).requests
    slow = simserve.run(parse_scenario(disagg_raw(
        wl, link={"bandwidth": 10 * BYTES_PER_TOKEN / 0.1, "latency_us": 0}))).requests
    # A's KV takes 100 ms instead of ~5 us (NVLink latency): TTFT grows by the difference,
    # TPOT does not
    assert slow["ttft_s"][0] - fast["ttft_s"][0] == pytest.approx(0.1, abs=1e-5)
    assert slow["tpot_s"][0] == pytest.approx(fast["tpot_s"][0])


def test_decode_admission_waits_for_kv_blocks(tmp_path):
    # decode replica has 2 usable blocks (32 tokens; num_gpu_blocks 3 less vLLM's null block);
    # A and B both have 17-token prompts and 3 outputs (20 tokens, 2 blocks each): B lands
    # while A holds both blocks and waits for A to finish.
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,17,3\n0.0,17,3\n")
    s = parse_scenario(disagg_raw({"trace": str(path), "format": "csv"},
                                  decode={"engine": {"num_gpu_blocks": 3}}))
    r = simserve.run(s, record_tokens=True)
    # both prompts in one prefill step (0-10 ms); both land at ~10 ms; A decodes 10-20, 20-30;
    # B is admitted only at 30 ms: tokens at 40, 50
    ta, tb = r.token_times
    assert ta[1:] == pytest.approx([0.020, 0.030], abs=1e-5)
    assert tb[1:] == pytest.approx([0.040, 0.050], abs=1e-5)
    assert ta[0] == tb[0] == pytest.approx(0.010, abs=1e-5)   # both first tokens at landing
    assert r.summary["total_preemptions"] == 0


def test_disaggregated_scenario_file_runs():
    results = compare("scenarios/disaggregated.yaml",
                               overrides=["workload.num_requests=200"])
    roles = {"colocated-v0": ["mixed"] * 4, "colocated-chunked": ["mixed"] * 4,
             "disaggregated-1p3d": ["prefill"] + ["decode"] * 3,
             "disaggregated-2p2d": ["prefill"] * 2 + ["decode"] * 2}
    assert sorted(results) == sorted(roles)
    for label, r in results.items():
        # four GPUs in every variant, each in its role and each kept busy
        assert [row["role"] for row in r.summary["per_replica"]] == roles[label], label
        assert all(row["busy_s"] > 0 for row in r.summary["per_replica"]), label
        assert r.summary["completed"] == 200
        # a split variant hands each request's KV over once (a one-token request, finished
        # by its prefill, stays); colocated variants hand nothing over
        handed = int((r.requests["num_output_tokens"] > 1).sum())
        assert r.summary.get("num_kv_transfers") == (handed if "disagg" in label else None)


@st.composite
def disagg_cases(draw):
    case = draw(scenarios())
    roles = ["prefill"] * draw(st.integers(1, 2)) + ["decode"] * draw(st.integers(1, 2))
    return case, roles, draw(st.sampled_from(ROUTER_NAMES))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disagg_cases())
def test_disaggregated_conserves_and_fast_forward_equals_stepping(c):
    case, roles, router = c
    fast, replicas = run_cluster(case, roles, router, fast_forward=True)
    check_accounting(fast, replicas, case[6])
    finished = [r for r in fast.requests if r.status is Status.FINISHED]
    handed = [r for r in finished if r.num_output_tokens > 1]
    assert len(fast.transfer_s) == len(handed)
    assert all(r.replica >= roles.index("decode") for r in handed)
    assert np.array_equal(pooled_itl(fast), online_itl(fast, replicas))
    slow, _ = run_cluster(case, roles, router, fast_forward=False)
    assert_same_runs(fast, slow)
