"""Long runs fold their oldest steps (issue #21, memory): the recorder keeps a replica's steps
up to FOLD_STEPS and folds older ones, LEVEL_CHUNK at a time, into their level sums and the ITL
sketch. Here both sizes are made small so that runs of a few thousand steps fold many times."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import simserve
from simserve.cli import main
from simserve.config import load_variants
from simserve.errors import SimserveError
from simserve.metrics import levels, recorder
from simserve.metrics.sketch import REL_ERROR

DATA = Path(__file__).resolve().parents[1] / "data"
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
ITL_PERCENTILES = ("median_itl_ms", "p50_itl_ms", "p90_itl_ms", "p99_itl_ms")


def small_folds(monkeypatch, chunk: int, fold_steps: int | None = None) -> None:
    monkeypatch.setattr(levels, "LEVEL_CHUNK", chunk)
    monkeypatch.setattr(recorder, "FOLD_STEPS", fold_steps or 2 * chunk)


def dumps(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)


def check_itl_close(exact: dict, sketched: dict) -> None:
    """The sketch's ITL against the exact one: percentiles within the stated bound, mean and
    std to rounding; every other key but the levels (summed in other chunks) equal."""
    for key in ITL_PERCENTILES:
        assert abs(sketched[key] - exact[key]) <= REL_ERROR * exact[key], key
    for key in ("mean_itl_ms", "std_itl_ms"):
        assert sketched[key] == pytest.approx(exact[key], rel=1e-12), key


@pytest.mark.parametrize("scenario, chunk, fold_steps", [
    (DATA / "tiny.yaml", 64, 128), (SCENARIOS / "quickstart.yaml", 64, 128),
    (SCENARIOS / "quickstart.yaml", 16, 256)])       # (16, 256): 8 chunks at a time
def test_folded_run_equals_the_kept_one_and_stepping(monkeypatch, scenario, chunk, fold_steps):
    exact = simserve.run(scenario)
    assert exact.has_steps and exact._recorder.itl_sketch is None
    small_folds(monkeypatch, chunk, fold_steps)
    folds: list[int] = []
    real = recorder.StepLog.drop
    monkeypatch.setattr(recorder.StepLog, "drop",
                        lambda self, k, sums: (folds.append(len(sums)), real(self, k, sums)))
    folded = simserve.run(scenario)
    log = folded._recorder.replicas[0]
    assert log.num_folded >= 3 * chunk and len(log.folded) == log.num_folded // chunk
    assert sum(folds) == len(log.folded) and max(folds) >= fold_steps // 2 // chunk - 1
    # at most FOLD_STEPS and the tail no fold may take yet (the last group of steps, those past
    # the latest finish): quickstart on the h100-vllm clock ends with 105 such steps
    assert len(log.steps["start_s"]) <= 2 * fold_steps
    assert folded.num_steps == exact.num_steps == folded.summary["num_steps"]
    # keeping every step (the same sizes: the same sketch and chunks) gives the same bits,
    # and so does stepping one iteration per event (its folds fall at other moments)
    kept = simserve.run(scenario, keep_steps=True)
    assert kept._recorder.replicas[0].num_folded == 0
    assert dumps(folded.summary) == dumps(kept.summary)
    stepped = simserve.run(scenario, fast_forward=False)
    assert dumps(folded.summary) == dumps(stepped.summary)
    pd.testing.assert_frame_equal(folded.requests, exact.requests)
    check_itl_close(exact.summary, folded.summary)
    for key in ("mean_running", "mean_waiting", "mean_kv_utilization", "mean_batched_tokens"):
        assert folded.summary[key] == pytest.approx(exact.summary[key], rel=1e-12), key
    assert folded.summary["max_kv_utilization"] == exact.summary["max_kv_utilization"]
    different = {k for k in exact.summary if exact.summary[k] != folded.summary[k]}
    assert different <= {*ITL_PERCENTILES, "mean_itl_ms", "std_itl_ms", "mean_running",
                         "mean_waiting", "mean_kv_utilization", "mean_batched_tokens"}


def test_levels_of_folded_chunks_are_the_same_bits(monkeypatch):
    """With the level chunk unchanged, folding changes no level at all: a folded chunk's sums
    are the numbers the summary computes from the same steps."""
    scenario = SCENARIOS / "quickstart.yaml"
    monkeypatch.setattr(levels, "LEVEL_CHUNK", 64)
    whole = simserve.run(scenario)           # FOLD_STEPS unchanged: nothing folded
    assert whole._recorder.replicas[0].num_folded == 0
    monkeypatch.setattr(recorder, "FOLD_STEPS", 128)
    folded = simserve.run(scenario)
    assert folded._recorder.replicas[0].num_folded > 0
    for key in ("mean_running", "mean_waiting", "mean_kv_utilization", "max_kv_utilization",
                "mean_batched_tokens", "num_steps", "duration_s", "mean_ttft_ms", "p99_e2el_ms"):
        assert folded.summary[key] == whole.summary[key], key


@pytest.mark.parametrize("path, variant, requests", [
    # a disaggregated pool (KV handoffs: gaps that span replicas): a fifth of the shipped
    # 1,500 requests, folded in chunks a quarter as long, every replica still folds many
    ("disaggregated.yaml", "disaggregated-1p3d", 300),
    # behind the counting routers a replica's stretch in flight is recorded once it is over
    # (an arrival may cut it back, and requests may join it): only completed steps fold
    ("cluster_routing.yaml", "least_outstanding", 400),
    ("cluster_routing.yaml", "least_kv", 400),
    ("cluster_routing.yaml", "jsq_tokens", 400)])
def test_cluster_and_disaggregated_runs_fold_per_replica(monkeypatch, path, variant, requests):
    """Several replicas (per-replica busy time and levels), a disaggregated pool, a front-end
    delay... each replica folds its own steps, and the folded run equals the kept one and
    stepping."""
    variants = dict(load_variants(SCENARIOS / path, [f"workload.num_requests={requests}"]))
    scenario = variants[variant]
    exact = simserve.run(scenario)
    small_folds(monkeypatch, 32)
    folded = simserve.run(scenario)
    assert all(log.num_folded > 0 for log in folded._recorder.replicas.values())
    kept = simserve.run(scenario, keep_steps=True)
    assert dumps(folded.summary) == dumps(kept.summary)
    assert dumps(folded.summary) == dumps(simserve.run(scenario, fast_forward=False).summary)
    check_itl_close(exact.summary, folded.summary)
    pd.testing.assert_frame_equal(folded.requests, exact.requests)
    for a, b in zip(exact.summary["per_replica"], folded.summary["per_replica"], strict=True):
        assert a["num_steps"] == b["num_steps"] and a["completed"] == b["completed"]
        assert b["busy_s"] == pytest.approx(a["busy_s"], rel=1e-12)


def test_frontend_delay_shifts_the_folded_window(monkeypatch):
    """A calibrated front-end delay moves steps onto the client's clock: the folded chunks'
    window checks use the shifted times, and the summary equals the kept run's."""
    from simserve.config import load_scenario
    s = load_scenario(SCENARIOS / "quickstart.yaml", ["latency.frontend_delay_ms=3"])
    small_folds(monkeypatch, 64)
    folded = simserve.run(s)
    assert folded._recorder.replicas[0].num_folded > 0
    assert folded._recorder.replicas[0].offset == 0.003
    assert folded.summary["frontend_delay_ms"] == 3.0
    kept = simserve.run(s, keep_steps=True)
    assert dumps(folded.summary) == dumps(kept.summary)


def test_replica_failures_and_retries_fold_only_completed_steps(monkeypatch, tmp_path):
    """Failures cut stretches short and drop the step in flight (StepLog.trim): only steps
    the token log has counted are folded, so the folded run equals the kept one."""
    raw = yaml.safe_load((DATA / "tiny.yaml").read_text())
    raw["workload"].update(rate=60, num_requests=400)
    raw["cluster"] = {"replicas": 2, "router": "least_kv", "faults": {
        "on_failure": "retry", "max_retries": 1, "restart_s": 0.3,
        "events": [{"replica": 0, "at_s": 0.7, "restart_s": 0.4},
                   {"replica": 1, "at_s": 2.1, "restart_s": 0.2},
                   {"replica": 0, "at_s": 3.3, "restart_s": 0.2}]}}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(raw))
    exact = simserve.run(path)
    assert exact.summary["num_replica_failures"] == 3
    small_folds(monkeypatch, 32)
    folded = simserve.run(path)
    assert all(log.num_folded > 0 for log in folded._recorder.replicas.values())
    assert dumps(folded.summary) == dumps(simserve.run(path, keep_steps=True).summary)
    assert dumps(folded.summary) == dumps(simserve.run(path, fast_forward=False).summary)
    pd.testing.assert_frame_equal(folded.requests, exact.requests)
    check_itl_close(exact.summary, folded.summary)


def test_folded_steps_are_refused_with_a_clear_error_and_kept_when_asked(monkeypatch, tmp_path,
                                                                        capsys):
    small_folds(monkeypatch, 32)
    r = simserve.run(DATA / "tiny.yaml")
    assert not r.has_steps
    with pytest.raises(SimserveError, match=r"not kept.*keep_steps=True \(CLI: --steps\)"):
        _ = r.steps
    with pytest.raises(SimserveError, match="--steps"):
        r.save(tmp_path / "x", steps=True)
    out = r.save(tmp_path / "default")          # the default writes no steps for it
    assert not (out / "steps.csv").exists() and (out / "requests.csv").exists()
    assert main(["run", str(DATA / "tiny.yaml"), "--out", str(tmp_path / "cli"), "--quiet",
                 "--no-report", "--steps"]) == 0
    steps = pd.read_csv(tmp_path / "cli" / "steps.csv")
    assert len(steps) == r.num_steps
    assert np.all(np.diff(steps["step"]) == 1)
    capsys.readouterr()


def test_recorded_tokens_are_never_folded(monkeypatch):
    small_folds(monkeypatch, 32)
    r = simserve.run(DATA / "tiny.yaml", record_tokens=True)
    assert r.has_steps and r._recorder.replicas[0].num_folded == 0
    assert len(r.token_times) == len(r.requests)


def test_compare_skips_folded_runs_in_the_coincidence_check(monkeypatch):
    from simserve.runner import coinciding
    small_folds(monkeypatch, 32)
    a = simserve.run(DATA / "tiny.yaml")
    b = simserve.run(DATA / "tiny.yaml")
    assert not a.has_steps and not b.has_steps
    assert coinciding({"a": a, "b": b}) == []
    # the same run with its steps kept is compared, and coincides with its twin; the folded
    # ones beside them are left out of the group
    c = simserve.run(DATA / "tiny.yaml", keep_steps=True)
    d = simserve.run(DATA / "tiny.yaml", keep_steps=True)
    assert coinciding({"a": a, "c": c, "b": b, "d": d}) == [["c", "d"]]


def test_vllm_v1_coincides_with_sarathi_at_its_budget_despite_its_null_block():
    """vllm_v1 keeps a null block back (its kv_blocks_total is one less): the capacity is not
    part of the schedule, so at vLLM's 8192-token budget with ample KV it coincides with sarathi
    (docs/policies.md); a smaller budget does not."""
    from simserve.runner import coinciding
    runs = {p: simserve.run(SCENARIOS / "quickstart.yaml",
                            overrides=["workload.num_requests=200", f"scheduler.policy={p}"])
            for p in ("vllm_v1", "sarathi")}
    totals = {p: int(r.steps["kv_blocks_total"].iloc[0]) for p, r in runs.items()}
    assert totals["vllm_v1"] == totals["sarathi"] - 1
    assert coinciding(runs) == [["vllm_v1", "sarathi"]]
    runs["sarathi_512"] = simserve.run(
        SCENARIOS / "quickstart.yaml",
        overrides=["workload.num_requests=200", "scheduler.policy=sarathi",
                   "engine.max_num_batched_tokens=512"])
    assert coinciding(runs) == [["vllm_v1", "sarathi"]]
