"""Golden tests: hand-computed metrics of tiny runs, and pinned metrics of small scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simserve
from simserve.config import parse_scenario

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden"


def tiny_scenario(policy: str, **workload) -> simserve.Scenario:
    raw = {
        "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
                   "num_gpu_blocks": 64, "max_model_len": 512},
        "scheduler": {"policy": policy},
        "latency": {"model": "constant", "step_ms": 10},
        "workload": {"arrival": "burst", "num_requests": 2,
                     "prompt": {"dist": "fixed", "value": 10},
                     "output": {"dist": "fixed", "value": 3}, **workload},
        "slo": {"ttft_ms": 15, "tpot_ms": 10},
    }
    return parse_scenario(raw)


@pytest.mark.parametrize("policy", ["static", "orca", "vllm_v0", "vllm_v1", "sarathi"])
def test_hand_computed_burst(policy):
    # Two requests at t=0, prompt 10, output 3, every step 10 ms.
    # step 1 (0-10 ms): both prompts (20 tokens) -> token 1 of each at 10 ms
    # step 2 (10-20 ms): both decode -> token 2 at 20 ms; step 3 -> token 3 at 30 ms
    # TTFT = 10 ms, E2EL = 30 ms, TPOT = (30 - 10) / 2 = 10 ms, ITL = 10 ms (4 gaps)
    # duration = 30 ms -> 2 / 0.03 = 66.67 req/s; 6 / 0.03 = 200 output tok/s
    r = simserve.run(tiny_scenario(policy))
    s = r.summary
    assert s["completed"] == 2 and s["num_steps"] == 3
    assert s["mean_ttft_ms"] == pytest.approx(10)
    assert s["mean_tpot_ms"] == pytest.approx(10)
    assert s["mean_itl_ms"] == pytest.approx(10)
    assert s["mean_e2el_ms"] == pytest.approx(30)
    assert s["duration_s"] == pytest.approx(0.03)
    assert s["request_throughput"] == pytest.approx(2 / 0.03)
    assert s["output_throughput"] == pytest.approx(6 / 0.03)
    assert s["total_token_throughput"] == pytest.approx(26 / 0.03)
    # both meet TTFT <= 15 ms and TPOT <= 10 ms
    assert s["slo_attainment"] == 1.0 and s["request_goodput"] == pytest.approx(2 / 0.03)
    assert list(r.steps["num_prefill_tokens"]) == [20, 0, 0]
    assert list(r.steps["num_decode_seqs"]) == [0, 2, 2]


def test_hand_computed_queueing_with_one_seq():
    # max_num_seqs 1: B waits for A. A: steps 1-3 (tokens at 10, 20, 30 ms).
    # B: prefill in step 4 (token 1 at 40 ms), tokens at 50, 60 ms.
    # TTFT: A 10, B 40 -> mean 25 ms; E2EL: 30, 60 -> mean 45; TPOT 10 for both.
    # SLO TTFT <= 15 ms: only A meets it -> attainment 0.5, goodput 1 / 0.06 s
    s = tiny_scenario("vllm_v1").replace(
        engine=tiny_scenario("vllm_v1").engine.__class__(
            max_num_seqs=1, max_num_batched_tokens=512, block_size=16, num_gpu_blocks=64,
            max_model_len=512))
    out = simserve.run(s).summary
    assert out["mean_ttft_ms"] == pytest.approx(25)
    assert out["mean_e2el_ms"] == pytest.approx(45)
    assert out["mean_tpot_ms"] == pytest.approx(10)
    assert out["slo_attainment"] == 0.5
    assert out["request_goodput"] == pytest.approx(1 / 0.06)


def test_rejections_are_counted_not_dropped():
    s = tiny_scenario("vllm_v1", prompt={"dist": "fixed", "value": 600})
    r = simserve.run(s)
    assert r.summary["num_rejected"] == 2 and r.summary["completed"] == 0
    assert r.summary["rejected_by_reason"] == {"exceeds_max_model_len": 2}
    # KV capacity: 64 blocks x 16 = 1024 tokens; max_model_len raised so only KV rejects
    s = tiny_scenario("vllm_v1", prompt={"dist": "fixed", "value": 1100})
    s = s.replace(engine=s.engine.__class__(max_num_seqs=8, max_num_batched_tokens=512,
                                            block_size=16, num_gpu_blocks=64, max_model_len=2048))
    r = simserve.run(s)
    assert r.summary["rejected_by_reason"] == {"exceeds_kv_capacity": 2}
    assert list(r.requests["status"]) == ["rejected", "rejected"]


GOLDEN_KEYS = ("completed", "num_rejected", "duration_s", "request_throughput",
               "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
               "mean_itl_ms", "mean_e2el_ms", "total_preemptions", "num_steps",
               "mean_kv_utilization", "slo_attainment")


def golden_run(policy: str) -> dict:
    r = simserve.run(DATA / "tiny.yaml", overrides=[f"scheduler.policy={policy}"])
    return {k: r.summary[k] for k in GOLDEN_KEYS}


@pytest.mark.parametrize("policy", ["vllm_v1", "sarathi", "vllm_v0", "orca", "static"])
def test_pinned_metrics(policy):
    """Pinned outputs of tests/data/tiny.yaml; regenerate with `python -m tests.golden.test_golden`
    only after a deliberate, explained change of behaviour."""
    expected = json.loads((GOLDEN / f"tiny_{policy}.json").read_text())
    got = golden_run(policy)
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-9, abs=1e-12), k


def test_same_seed_byte_identical(tmp_path):
    for d in ("a", "b"):
        simserve.run(DATA / "tiny.yaml").save(tmp_path / d)
    for name in ("scenario.yaml", "requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other = simserve.run(DATA / "tiny.yaml", overrides=["seed=8"]).save(tmp_path / "c")
    assert (other / "requests.csv").read_bytes() != (tmp_path / "a" / "requests.csv").read_bytes()


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for p in ("vllm_v1", "sarathi", "vllm_v0", "orca", "static"):
        (GOLDEN / f"tiny_{p}.json").write_text(json.dumps(golden_run(p), indent=2) + "\n")
        print("wrote", GOLDEN / f"tiny_{p}.json")
