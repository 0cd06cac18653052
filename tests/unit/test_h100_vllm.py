"""The step-time model fitted to measured vLLM runs on H100 (h100-vllm): its engine terms, their
precedence under a scenario's own, the error band a run carries, and the fitted set's file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import simserve
from simserve.config import parse_scenario
from simserve.engine.build import build_latency, scenario_curves
from simserve.errors import DataError
from simserve.latency.efficiency import EFFICIENCY_DIR, load_curves, parse_curves
from simserve.latency.trust import latency_trust, outside, trust_lines
from simserve.sched.plan import StepPlan


def scenario(**over):
    raw = {"name": "h", "model": "Llama-3.1-8B", "hardware": "H100-SXM",
           "engine": {"max_model_len": 2048},
           "scheduler": {"policy": "vllm_v1"}, "latency": {"model": "roofline"},
           "workload": {"rate": 2, "num_requests": 20,
                        "prompt": {"dist": "fixed", "value": 300},
                        "output": {"dist": "fixed", "value": 20}}}
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_scenario(raw)


def test_h100_and_h200_default_to_the_fitted_set_with_its_provenance():
    for hw in ("H100-SXM", "H200"):
        curves = scenario_curves(scenario(hardware=hw))
        assert curves is not None and curves.name == "h100-vllm"
    raw = json.loads((EFFICIENCY_DIR / "h100-vllm.json").read_text())
    assert "ESTIMATE" in raw["source"] and "fit_h100_vllm.py" in raw["source"]
    assert set(raw["expected_error_pct"]) >= {"ttft_mean", "e2e_mean", "itl_mean"}


def test_the_sets_engine_terms_are_the_rooflines_defaults_and_the_scenario_wins():
    curves = load_curves("h100-vllm")
    model = build_latency(scenario())
    assert model.step_overhead_s == curves.step_overhead_s
    assert model.per_output_token_s == curves.per_output_token_s
    assert model.frontend_delay_s == curves.frontend_delay_s
    own = build_latency(scenario(latency={"step_overhead_ms": 3.0, "per_output_token_ms": 0.0,
                                          "frontend_delay_ms": 0.0}))
    assert own.step_overhead_s == 3e-3 and own.per_output_token_s == 0.0
    assert own.frontend_delay_s == 0.0
    # a lone decode differs by exactly the two CPU terms
    plan = StepPlan((0,), (1,), (), (), (100,), 1)
    diff = model.step_time(plan) - own.step_time(plan)
    assert math.isclose(diff, curves.step_overhead_s - 3e-3 + curves.per_output_token_s,
                        abs_tol=1e-12)
    # constant efficiencies: none of the set's terms
    const = build_latency(scenario(latency={"efficiency": "constant"}))
    assert const.frontend_delay_s == 0.0 and const.step_overhead_s == 2e-3


def test_a_run_carries_its_error_band_and_says_when_it_leaves_the_corpus():
    # an 8B model, TP 1, 2k context, async scheduling as vLLM's default: inside
    res = simserve.run(scenario(engine={"max_model_len": 2048, "async_scheduling": True}))
    trust = res.summary["latency_trust"]
    curves = load_curves("h100-vllm")
    assert trust["expected_error_pct"] == curves.expected_error_pct
    assert trust["outside_corpus"] == []
    assert any("Expected error" in line for line in trust_lines(trust))
    # synchronous scheduling (simserve's default): the runs had async on
    sync_trust = simserve.run(scenario()).summary["latency_trust"]
    sync = sync_trust["outside_corpus"]
    assert len(sync) == 1 and sync[0].startswith("async_scheduling off")
    # ... and the band is said to be async scheduling's, where it is shown
    assert any("This run is synchronous" in line for line in trust_lines(sync_trust))
    assert trust_lines(sync_trust)[0].startswith("Expected error of the h100-vllm step-time "
                                                 "model with async scheduling, as the median")
    assert not any("This run is synchronous" in line for line in trust_lines(trust))
    assert not any("±" in line for line in trust_lines(trust) + trust_lines(sync_trust))
    # said once: not again among the ways the run leaves the corpus
    assert len(trust_lines(sync_trust)) == 2
    assert not any("async_scheduling off" in line for line in trust_lines(sync_trust))
    far = scenario(hardware="H200", scheduler={"policy": "sarathi"},
                   engine={"tensor_parallel_size": 8, "max_model_len": 32768})
    words = " ".join(outside(far, curves.corpus))
    for needle in ("H200", "sarathi", "tensor_parallel_size 8", "max_model_len 32,768"):
        assert needle in words
    # a fitted term replaced by the scenario: the band is not for it
    mine = scenario(engine={"max_model_len": 2048, "async_scheduling": True},
                    latency={"step_overhead_ms": 5})
    assert outside(mine, curves.corpus) == [
        "latency.step_overhead_ms set: the band is for the fitted set's own terms, not for "
        "these"]
    # an MoE model the corpus's MoE runs were not: its MoE layers' cost is Scout's
    other = parse_scenario({**scenario().to_dict(), "model": "Qwen3-30B-A3B",
                            "engine": {"max_model_len": 2048, "async_scheduling": True}})
    assert [w for w in outside(other, curves.corpus) if w.startswith("MoE model")] == [
        "MoE model Qwen3-30B-A3B: the cost of an MoE layer was learnt from "
        "Llama-4-Scout-17B-16E-FP8 alone"]
    # disaggregated prefill/decode: said so, and no advice to turn on what it cannot have
    split = scenario(cluster={"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                                         {"name": "d", "role": "decode", "replicas": 1}],
                              "kv_transfer": {"link": "nvlink"}})
    words = outside(split, curves.corpus)
    assert "disaggregated prefill/decode: the runs served on single engines" in words
    assert not any(w.startswith("async_scheduling") for w in words)
    # max_model_len unset: the card's own (Llama-3.1-8B: 131,072 positions); without the
    # workload's longest request, what the scenario allows is judged
    unset = parse_scenario({**scenario().to_dict(), "engine": {}})
    assert "max_model_len 131,072" in " ".join(outside(unset, curves.corpus))
    # with it (a run's), the longest request, as long as max_model_len lets it run
    assert not any("tokens" in w for w in outside(unset, curves.corpus, longest=2000))
    assert ("requests of up to 5,000 tokens: the runs' requests held at most 2,482 (longer "
            "contexts are extrapolated)") in outside(unset, curves.corpus, longest=5000)
    assert "requests of up to 32,768 tokens" in " ".join(outside(far, curves.corpus, 10**6))
    assert not any("tokens" in w for w in outside(mine, curves.corpus, longest=10**6))
    # a run judges its own requests: 320 tokens each here, inside whatever max_model_len
    roomy = scenario(engine={"max_model_len": 32768, "async_scheduling": True})
    assert simserve.run(roomy).summary["latency_trust"]["outside_corpus"] == []
    # a model priced any other way carries no band: nothing measured judges it
    assert latency_trust(scenario(latency={"efficiency": "constant"}),
                         scenario_curves(scenario(latency={"efficiency": "constant"}))) is None
    assert "latency_trust" not in simserve.run(scenario(
        hardware="A100-80GB")).summary


def test_a_sets_fixed_device_time_per_step_is_device_time_not_cpu_time():
    """pointwise.step_s: in every non-empty step's time, never in its CPU part (what async
    scheduling hides), and a bad value names its key."""
    raw = json.loads((EFFICIENCY_DIR / "h100-vllm.json").read_text())
    with_step = parse_curves({**raw, "pointwise": {**raw["pointwise"], "step_s": 0.004}}, "a")
    without = parse_curves({**raw, "pointwise": {**raw["pointwise"], "step_s": 0.0}}, "b")
    from simserve.latency.roofline import RooflineModel
    s = scenario()
    a, b = (RooflineModel(s.model, s.hardware, curves=c) for c in (with_step, without))
    for plan in (StepPlan((0,), (1,), (), (), (100,), 1),
                 StepPlan((0,), (1,), (300,), (0,), (), 1)):
        assert math.isclose(a.step_time(plan) - b.step_time(plan), 0.004, abs_tol=1e-12)
        assert a.cpu_s(plan) == b.cpu_s(plan)
    with pytest.raises(DataError, match="pointwise.step_s"):
        parse_curves({**raw, "pointwise": {**raw["pointwise"], "step_s": -1}}, "c")


@pytest.mark.parametrize("engine, error", [
    ({"step_overhead_s": -1}, "engine.step_overhead_s"),
    ({"step_overhead_s": True}, "engine.step_overhead_s"),
    ({"frontend": 0.1}, "engine: expected"),
    ("x", "engine: expected"),
])
def test_malformed_engine_terms_name_the_key(engine, error):
    raw = json.loads((EFFICIENCY_DIR / "h100.json").read_text())
    raw["engine"] = engine
    with pytest.raises(DataError, match=error):
        parse_curves(raw, "x.json")


def test_a_run_without_a_measured_error_says_so(capsys, tmp_path):
    # only runs on the fitted set said how far to trust them; an L40S roofline (a spec-sheet
    # estimate) or a kernel profile said nothing, and the L40S label lacked "estimate"
    from simserve.cli import main
    from simserve.latency.trust import no_band_line
    quick = ["--set", "workload.num_requests=20", "--no-report"]
    quickstart = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
    assert main(["run", str(quickstart), "--set", "hardware=L40S", *quick, "--out",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[latency: roofline (L40S spec; estimate)]" in out
    assert "No measured error for this step-time model: an estimate from the hardware's spec " \
           "sheet" in out and "Expected error" not in out
    assert no_band_line("profile (Llama-3.1-8B on NVIDIA H100 80GB HBM3, bf16)").startswith(
        "No measured error for this step-time model: kernel times")
    assert no_band_line("linear (5 ms + ...)") == ""
    assert "calibrated against one live server" in no_band_line(
        "profile (Llama-3.1-8B on NVIDIA H100 80GB HBM3, bf16, calibrated)")


def test_the_sync_note_advises_async_only_where_the_scenario_allows_it():
    from simserve.config import async_allowed
    from simserve.latency.trust import run_trust_lines
    s = scenario()
    summary = simserve.run(s).summary
    assert async_allowed(s)
    assert run_trust_lines(summary, True)[1].endswith(
        "set engine.async_scheduling: true for the band above.")
    # swap preemption cannot run asynchronously: the advice would be refused
    swap = scenario(engine={"preemption_mode": "swap"})
    assert not async_allowed(swap)
    assert "async_scheduling: true" not in run_trust_lines(summary, False)[1]
