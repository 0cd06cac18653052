"""The promise of README's output table: the scenario.yaml written beside the results reproduces
the run, byte for byte, for every shipped scenario (traces included) and sweep.

Each scenario runs (a few requests, through ``--set``) into one folder; then every written
scenario.yaml runs again, from another working directory, into a folder at the same depth
elsewhere. requests.csv, steps.csv, summary.json must be identical, and so must the scenario
itself (its paths are written relative to its own folder, so they read the same at the same
depth).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simserve.cli import main
from simserve.config import file_kind

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
FEW = ["--set", "workload.num_requests=40"]
RESULTS = ("requests.csv", "steps.csv", "summary.json")


def cli(argv: list) -> None:
    assert main([str(a) for a in argv]) == 0


def body(path: Path) -> str:
    """scenario.yaml without its header comment (the --set overrides that made it)."""
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


def test_the_shipped_scenarios_include_a_trace_replay():
    formats = {line.split(":")[1].strip() for p in SHIPPED for line in p.read_text().splitlines()
               if line.strip().startswith("format:")}
    assert {"mooncake", "azure"} <= formats


@pytest.mark.parametrize("scenario", [p for p in SHIPPED if file_kind(p) != "sweep"],
                         ids=lambda p: p.stem)
def test_written_scenario_reproduces_the_run(scenario, tmp_path, monkeypatch, capsys):
    first, again = tmp_path / "a" / "run", tmp_path / "b" / "run"
    monkeypatch.chdir(tmp_path)
    cli(["run", scenario, "--out", first, "--no-report", "--quiet", *FEW])
    written = sorted(first.rglob("scenario.yaml"))
    assert written
    for path in written:
        assert path.read_text().startswith("# resolved with these overrides")
        rel = path.parent.relative_to(first)
        elsewhere = tmp_path / "elsewhere"          # not the scenario's folder, not the output's
        elsewhere.mkdir(exist_ok=True)
        monkeypatch.chdir(elsewhere)
        cli(["run", path, "--out", again / rel, "--no-report", "--quiet"])
        for name in RESULTS:
            assert (again / rel / name).read_bytes() == (path.parent / name).read_bytes(), \
                f"{rel / name} differs"
        assert body(again / rel / "scenario.yaml") == body(path)
    capsys.readouterr()


@pytest.mark.parametrize("sweep", [p for p in SHIPPED if file_kind(p) == "sweep"],
                         ids=lambda p: p.stem)
def test_written_sweep_reproduces_the_sweep(sweep, tmp_path, monkeypatch, capsys):
    first, again = tmp_path / "a" / "sweep", tmp_path / "b" / "sweep"
    monkeypatch.chdir(tmp_path)
    cli(["sweep", sweep, "--out", first, "--no-report", "--quiet", "--workers", "1", *FEW])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cli(["sweep", first / "sweep.yaml", "--out", again, "--no-report", "--quiet",
         "--workers", "1"])
    assert (again / "sweep.csv").read_bytes() == (first / "sweep.csv").read_bytes()
    capsys.readouterr()


def test_a_trace_path_is_written_relative_to_the_output(tmp_path, capsys):
    cli(["run", ROOT / "scenarios" / "trace_azure.yaml", "--out", tmp_path / "r", "--no-report",
         "--quiet", *FEW])
    text = (tmp_path / "r" / "scenario.yaml").read_text()
    trace = next(line.split(": ", 1)[1] for line in text.splitlines()
                 if line.strip().startswith("trace:"))
    assert not Path(trace).is_absolute()
    assert (tmp_path / "r" / trace).resolve() == ROOT / "scenarios/traces/azure_conv_sample.csv"
    capsys.readouterr()
