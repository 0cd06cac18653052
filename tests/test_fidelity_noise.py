"""benchmarks/fidelity_noise.py: the real server scored against itself, on made-up campaigns."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
