"""benchmarks/fidelity_noise.py: the real server scored against itself, on made-up campaigns."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fidelity_noise",
                                              REPO / "benchmarks" / "fidelity_noise.py")
noise = importlib.util.module_from_spec(spec)
spec.loader.exec_module(noise)


def campaign(root: Path, name: str, runs: dict[str, list[float]], scenario: str = "s: 1\n"):
    """A campaign folder whose workload runs have these TPOT p50s (other metrics derived)."""
    for workload, tpots in runs.items():
        for i, tpot in enumerate(tpots):
            run = root / name / "real" / workload / f"run{i}"
            run.mkdir(parents=True)
            (run / "scenario.yaml").write_text(scenario)
            (run / "summary.json").write_text(json.dumps({"metrics": {
                "median_ttft_ms": 10 * tpot, "median_tpot_ms": tpot,
                "median_e2el_ms": 100 * tpot, "output_throughput": 1000 / tpot}}))
    return root / name


def test_best_band_counts_what_one_value_can_be_within_the_tolerance_of():
    assert noise.best_band([100, 104, 109, 200], 0.05) == 3       # 104 ± 5 % holds 100..109
    assert noise.best_band([100, 112], 0.05) == 1
    assert noise.best_band([5.0], 0.05) == 1
    assert noise.pairwise([100, 100]) == 0
    assert noise.pairwise([100, 125]) == pytest.approx((0.25 + 0.2) / 2)


def test_campaign_medians_spreads_and_only_identical_scenarios_compared(tmp_path, capsys):
    a = campaign(tmp_path, "a", {"light": [5.0, 6.0, 7.0], "trace": [9.0]})
    b = campaign(tmp_path, "b", {"light": [8.0, 8.0, 8.0]})
    c = campaign(tmp_path, "c", {"light": [6.0, 6.2, 5.8], "trace": [9.0]},
                 scenario="s: 2\n")        # "light" differs: compared with nothing
    rows = noise.analyse([a, b, c])
    light = [r for r in rows if r["workload"] == "light"]
    assert len(light) == 1 and light[0]["campaigns"] == ["a", "b"]
    tpot = light[0]["metrics"]["TPOT p50"]
    assert tpot["medians"] == [6.0, 8.0] and (tpot["min"], tpot["max"]) == (6.0, 8.0)
    assert tpot["best_band"] == 1
    assert tpot["within_campaign_median_range"] == pytest.approx((2 / 6 + 0) / 2)
    assert [r["workload"] for r in rows] == ["light"]      # "trace": different scenarios
    assert noise.main([str(a), str(b)]) == 0
    assert "light" in capsys.readouterr().out
    assert noise.main([str(tmp_path / "nothing")]) == 2
    assert "no real/ folder" in capsys.readouterr().err


def test_sensitivity_resimulates_a_campaign_at_other_speeds(tmp_path, capsys):
    """benchmarks/fidelity_sensitivity.py on a made-up campaign: the shipped tiny profile with a
    calibration block, and one workload; x1 is the campaign's own simulation, slower steps give
    a longer TPOT, faster ones a shorter."""
    import yaml

    import simserve
    from simserve.latency.schema import dump, load_profile
    from simserve.latency.profile import PROFILES_DIR
    spec = importlib.util.spec_from_file_location(
        "fidelity_sensitivity", REPO / "benchmarks" / "fidelity_sensitivity.py")
    sens = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sens)
    profile = load_profile(PROFILES_DIR / "tiny-llama-45m_cpu-epyc-2core_bf16_1t.json")
    dump({**profile, "calibration": {"step_overhead_s": 0.002, "scale": 0.8}},
         tmp_path / "calibrated.json")
    raw = yaml.safe_load((REPO / "scenarios" / "tiny_cpu_profile.yaml").read_text())
    raw["latency"]["path"] = str(tmp_path / "calibrated.json")
    raw["workload"]["num_requests"] = 40
    (tmp_path / "sim_calibrated" / "light").mkdir(parents=True)
    (tmp_path / "sim_calibrated" / "light" / "scenario.yaml").write_text(yaml.safe_dump(raw))
    table = sens.sensitivity(tmp_path, [0.8, 1.0, 1.25])
    tpot = {f: s["median_tpot_ms"] for f, s in table["light"].items()}
    own = simserve.run(tmp_path / "sim_calibrated" / "light" / "scenario.yaml")
    assert tpot[1.0] == pytest.approx(own.summary["median_tpot_ms"])
    assert tpot[0.8] < tpot[1.0] < tpot[1.25]
    assert sens.main([str(tmp_path), "--factors", "1", "1.1"]) == 0
    assert "light" in capsys.readouterr().out
    assert sens.main([str(tmp_path / "none")]) == 2
    assert "calibrated.json" in capsys.readouterr().err
    assert sens.main([str(tmp_path), "--factors", "0", "1"]) == 2
    assert "--factors must be > 0" in capsys.readouterr().err
