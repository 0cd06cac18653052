"""Sweeps: grid expansion, bad grid specs, the table, executors, and the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import simserve
from simserve.cli import main
from simserve.errors import ConfigError, SimserveError
from simserve.plan.sweep import expand, load_sweep, run_scenarios, sweep

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny.yaml"


def write_grid(tmp_path: Path, **sections) -> Path:
    spec = {"base": str(TINY), "set": {"workload.num_requests": 20}, **sections}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# --- expansion ---------------------------------------------------------------------------------

def test_grid_is_a_cartesian_product_with_the_last_field_fastest():
    points = expand({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(points) == 6
    assert points[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}]
    assert points[-1] == {"a": 2, "b": "z"}


def test_zip_advances_together_as_the_innermost_axis():
    points = expand({"a": [1, 2]}, {"b": [10, 20, 30], "c": ["p", "q", "r"]})
    # 2 grid values × 3 zip rows = 6 points, never mixing b=10 with c="q"
    assert len(points) == 6
    assert points[:3] == [{"a": 1, "b": 10, "c": "p"}, {"a": 1, "b": 20, "c": "q"},
                          {"a": 1, "b": 30, "c": "r"}]
    assert all((p["b"], p["c"]) in {(10, "p"), (20, "q"), (30, "r")} for p in points)
    assert expand({}, {"b": [1, 2]}) == [{"b": 1}, {"b": 2}]


def test_mismatched_zip_lengths_are_one_clear_error():
    with pytest.raises(ConfigError, match=r"zip: lists must all have the same length: "
                                          r"b has 3, c has 2"):
        expand({}, {"b": [1, 2, 3], "c": [1, 2]})


@pytest.mark.parametrize("grid, zip_, message", [
    ({"workload.rate": 4}, {}, r"grid\.workload\.rate: expected a non-empty list"),
    ({"workload.rate": []}, {}, r"grid\.workload\.rate: expected a non-empty list"),
    ({"seed": [1]}, {"seed": [2]}, r"zip\.seed: is also in grid"),
    ({}, {}, r"nothing to sweep"),
    ([1, 2], {}, r"grid: expected a mapping"),
    # a value twice was the same point run twice, counted twice in a report's averages
    ({"workload.rate": [5, 10, 5]}, {}, r"grid\.workload\.rate: values 0 and 2 repeat 5"),
    ({"workload.rate": [5, 5.0]}, {}, r"grid\.workload\.rate: values 0 and 1 repeat 5\.0"),
    ({"workload.prompt": [{"dist": "fixed", "value": 8}, {"value": 8.0, "dist": "fixed"}]}, {},
     r"grid\.workload\.prompt: values 0 and 1 repeat"),
    ({}, {"seed": [1, 2, 1], "workload.rate": [5, 6, 5]}, r"zip: rows 0 and 2 repeat \(1, 5\)"),
])
def test_bad_axes(grid, zip_, message):
    with pytest.raises(ConfigError, match=message):
        expand(grid, zip_)


@pytest.mark.parametrize("grid, zip_, message", [
    # zip() stops at the shortest list: rows (1, 3) and (1, 3) looked repeated, while the
    # lists' lengths were the mistake
    ({}, {"b": [1, 1, 2], "c": [3, 3]}, r"zip: lists must all have the same length: "
                                        r"b has 3, c has 2"),
    # a field in both places: "is also in grid", not its values repeating in one of them
    ({"seed": [1, 1]}, {"seed": [2, 3]}, r"zip\.seed: is also in grid"),
])
def test_the_structural_error_wins_over_a_repeated_value(grid, zip_, message):
    with pytest.raises(ConfigError, match=message):
        expand(grid, zip_)


def test_unknown_field_in_the_grid_fails_before_anything_runs(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr("simserve.plan.sweep.run_scenarios", lambda *a, **k: ran.append(1))
    path = write_grid(tmp_path, grid={"workload.rate": [5, 10],
                                      "engine.max_num_seqz": [4, 8]})
    with pytest.raises(ConfigError) as err:
        sweep(path)
    assert str(err.value).startswith("engine.max_num_seqz: unknown field")
    assert "sweep point 0" in str(err.value)
    assert not ran


def test_a_bad_value_at_one_point_names_that_point(tmp_path):
    path = write_grid(tmp_path, grid={"workload.rate": [5, -1]})
    with pytest.raises(ConfigError, match=r"workload\.rate: must be > 0.*sweep point 1: "
                                          r"workload\.rate=-1"):
        load_sweep(path).scenarios()


def test_sweep_file_needs_exactly_one_base(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("grid: {seed: [1, 2]}\n")
    with pytest.raises(ConfigError, match="either base: .* or scenario:"):
        load_sweep(path)
    path.write_text(f"base: {TINY}\ngrid: {{seed: [1]}}\ngird: {{}}\n")
    with pytest.raises(ConfigError, match="gird: unknown field"):
        load_sweep(path)


def test_base_is_relative_to_the_grid_file_and_inline_scenarios_work(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "s.yaml").write_text(TINY.read_text())
    (tmp_path / "g.yaml").write_text("base: sub/s.yaml\ngrid: {seed: [1, 2]}\n")
    assert len(load_sweep(tmp_path / "g.yaml").scenarios()) == 2
    inline = {"scenario": yaml.safe_load(TINY.read_text()), "zip": {"seed": [3, 4, 5]}}
    (tmp_path / "i.yaml").write_text(yaml.safe_dump(inline))
    assert [s.seed for s in load_sweep(tmp_path / "i.yaml").scenarios()] == [3, 4, 5]


# --- running -----------------------------------------------------------------------------------

def test_table_has_one_row_per_point_in_order_with_metrics(tmp_path):
    table = sweep(write_grid(tmp_path, grid={"scheduler.policy": ["vllm_v0", "sarathi"],
                                             "workload.rate": [5.0, 40.0]}), workers=1)
    assert list(table.columns[:6]) == ["point", "scheduler.policy", "workload.rate", "policy",
                                       "offered_rate", "error"]
    assert table["point"].tolist() == [0, 1, 2, 3]
    assert table["policy"].tolist() == ["vllm_v0", "vllm_v0", "sarathi", "sarathi"]
    assert table["offered_rate"].tolist() == [5.0, 40.0, 5.0, 40.0]
    assert table["error"].isna().all()
    assert (table["num_requests"] == 20).all()
    for col in ("request_throughput", "request_goodput", "slo_attainment", "p99_ttft_ms"):
        assert col in table


def test_process_pool_gives_the_same_table_as_in_process(tmp_path, monkeypatch):
    from concurrent.futures import ProcessPoolExecutor

    import simserve.plan.sweep as sweep_module
    submitted = []

    class CountingPool(ProcessPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            submitted.append(args)
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(sweep_module, "ProcessPoolExecutor", CountingPool)
    path = write_grid(tmp_path, grid={"workload.rate": [5.0, 20.0, 80.0]})
    serial = sweep(path, workers=1)
    assert submitted == []                              # workers=1: in this process
    parallel = sweep(path, workers=2)
    assert len(submitted) == 3                          # every point went to the pool
    pd.testing.assert_frame_equal(serial, parallel)


def test_a_failing_point_is_recorded_not_fatal():
    # num_gpu_blocks: null falls back to the memory arithmetic, and 1e-4 of an H100 cannot
    # hold the weights: that point fails when its replicas are built; the other still runs.
    table = sweep(TINY, grid={"engine.num_gpu_blocks": [64, None]},
                  fixed={"engine.gpu_memory_utilization": 0.0001, "workload.num_requests": 20},
                  workers=1)
    assert table["error"].isna().tolist() == [True, False]
    assert "engine.gpu_memory_utilization" in table["error"][1]
    assert table["completed"][0] == 20 and pd.isna(table["completed"][1])


def test_python_api_from_a_scenario_object():
    base = simserve.load_scenario(TINY, overrides=["workload.num_requests=10"])
    table = simserve.sweep(base, grid={"scheduler.policy": ["vllm_v0", "vllm_v1"]}, workers=1)
    assert isinstance(table, pd.DataFrame)
    # the policy re-derives its own chunking: vllm_v0 never chunks, vllm_v1 does
    assert table["policy"].tolist() == ["vllm_v0", "vllm_v1"]
    assert table["error"].isna().all()


def test_unknown_executor_and_missing_ray(monkeypatch):
    s = simserve.load_scenario(TINY)
    with pytest.raises(ConfigError, match="unknown executor 'dask'"):
        run_scenarios([s], "dask")
    monkeypatch.setitem(__import__("sys").modules, "ray", None)   # import ray → ImportError
    with pytest.raises(SimserveError, match=r"needs the ray package: pip install"):
        run_scenarios([s], "ray")


def test_progress_bar_counts_points_and_failures(tmp_path, monkeypatch, capsys):
    from simserve import progress
    monkeypatch.setattr(progress, "DELAY_S", 0)       # shown at once (normally after 1 s)
    # (the middle point cannot hold the weights: it fails, as in the test above)
    table = sweep(TINY, grid={"engine.num_gpu_blocks": [64, None, 32]},
                  fixed={"engine.gpu_memory_utilization": 0.0001, "workload.num_requests": 20},
                  workers=1, progress=True)
    assert table["error"].notna().sum() == 1
    err = capsys.readouterr().err
    assert "sweep" in err and "3/3" in err and "failed=1" in err


def test_ray_executor_gives_the_same_table_as_local(tmp_path):
    ray = pytest.importorskip("ray")
    path = write_grid(tmp_path, grid={"scheduler.policy": ["vllm_v1", "sarathi"],
                                      "workload.rate": [10.0, 40.0]})
    local = sweep(path, workers=1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep(path, executor="ray")
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(local, remote)


def test_ray_address_nobody_answers_at_is_a_clear_error():
    pytest.importorskip("ray")
    with pytest.raises(SimserveError, match="ray: no cluster answers at 127.0.0.1:1"):
        run_scenarios([simserve.load_scenario(TINY)], "ray", address="127.0.0.1:1")


# --- command line ------------------------------------------------------------------------------

def test_cli_sweep_writes_table_and_report(tmp_path, capsys, monkeypatch):
    from simserve import progress
    monkeypatch.setattr(progress, "DELAY_S", 0)       # the bar shown however short the sweep
    path = write_grid(tmp_path, grid={"workload.rate": [5.0, 20.0]})
    code = main(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "2/2" in err and "sweep" in err
    assert "2 points (0 failed)" in out
    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert table["workload.rate"].tolist() == [5.0, 20.0]
    assert yaml.safe_load((tmp_path / "out" / "sweep.yaml").read_text())["grid"] == \
        {"workload.rate": [5.0, 20.0]}
    assert (tmp_path / "out" / "report.html").is_file()


def test_cli_sweep_says_when_it_replaces_another_sweeps_table(tmp_path, capsys):
    """A sweep into a folder holding another sweep's table says so before it runs (as run and
    capacity do); the same sweep again, or its saved sweep.yaml rerun there, says nothing."""
    out = tmp_path / "out"
    first = write_grid(tmp_path, name="rates", grid={"workload.rate": [5.0, 20.0]})
    assert main(["sweep", str(first), "--out", str(out), "--workers", "1", "--no-report",
                 "--quiet"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["sweep", str(first), "--out", str(out), "--workers", "1", "--no-report",
                 "--quiet"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["sweep", str(out / "sweep.yaml"), "--out", str(out), "--workers", "1",
                 "--no-report", "--quiet"]) == 0
    assert "note:" not in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    second = write_grid(other, name="seqs", grid={"engine.max_num_seqs": [4, 8]})
    assert main(["sweep", str(second), "--out", str(out), "--workers", "1", "--no-report",
                 "--quiet"]) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
    assert notes == [f"note: replacing the results of a different sweep in {out}/ (name: rates "
                     f"→ seqs; differs in name, grid)"]
    assert pd.read_csv(out / "sweep.csv")["engine.max_num_seqs"].tolist() == [4, 8]


def test_sweep_file_typos_name_what_was_typed(tmp_path):
    """A misspelt base: is named as the unknown field; a base that is not there names the field
    and the folder it was looked for in; a nested grid says to write a dotted path."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"bsae": str(TINY), "grid": {"seed": [1, 2]}}))
    with pytest.raises(ConfigError, match=r"^bsae: unknown field; known fields here: base, "
                                          r"grid, name, scenario, set, zip$"):
        load_sweep(path)
    path.write_text(yaml.safe_dump({"base": "nothere.yaml", "grid": {"seed": [1, 2]}}))
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert str(e.value) == (f"base: nothere.yaml: file not found (a path relative to the sweep "
                            f"file's folder, {tmp_path}/)")
    path.write_text(yaml.safe_dump({"base": str(TINY),
                                    "grid": {"engine": {"max_num_seqs": [16, 64]}}}))
    with pytest.raises(ConfigError, match=r"^grid\.engine: expected a list of values; a nested "
                                          r"field is one dotted path"):
        load_sweep(path)


@pytest.mark.parametrize("grid, message", [
    ({"engine.max_num_seqz": [1, 2]}, "error: engine.max_num_seqz: unknown field"),
    ({"workload.rate": 3}, "error: grid.workload.rate: expected a non-empty list"),
    ({"workload.rate": [5, 5]}, "error: grid.workload.rate: values 0 and 1 repeat 5; each "
                                "point would run twice"),
])
def test_cli_bad_grid_is_one_line_and_exit_2(tmp_path, capsys, grid, message):
    code = main(["sweep", str(write_grid(tmp_path, grid=grid)), "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sections, flags, message", [
    # every point set the axis after set: and --set: the fixed value was dropped silently
    ({"set": {"seed": 3}, "grid": {"seed": [1, 2]}}, [],
     "error: set.seed: is also varied by grid.seed, whose values would replace it at every "
     "point; give it in one place"),
    ({"grid": {"seed": [1, 2]}}, ["--set", "seed=5"], "error: --set seed: is also varied by "
                                                      "grid.seed"),
    ({"grid": {"workload.rate": [5, 6]}, "zip": {"workload.prompt": [
        {"dist": "fixed", "value": 8}, {"dist": "fixed", "value": 9}]}},
     ["--set", "workload.prompt.value=3"], "error: --set workload.prompt.value: is also varied "
                                            "by zip.workload.prompt"),
    # a whole section given, one of its fields an axis: that field was dropped
    ({"grid": {"engine.max_num_seqs": [8, 16]}}, ["--set", "engine={max_num_seqs: 4}"],
     "error: --set engine: is also varied by grid.engine.max_num_seqs"),
    ({"set": {"engine": {"max_num_seqs": 4}}, "grid": {"engine.max_num_seqs": [8, 16]}}, [],
     "error: set.engine: is also varied by grid.engine.max_num_seqs"),
])
def test_a_fixed_field_that_an_axis_also_sets_is_refused(tmp_path, capsys, sections, flags,
                                                          message):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"base": str(TINY), **sections}))
    code = main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fixed, flags, message", [
    # a bad fixed value was blamed on "sweep point 0" though no point has a part in it
    ({}, ["--set", "engine.max_num_seqs=0"],
     "error: --set engine.max_num_seqs: must be >= 1, got 0\n"),
    ({}, ["--set", "engine.max_num_seqz=4"],
     "error: --set engine.max_num_seqz: unknown field (did you mean max_num_seqs?)\n"),
    ({}, ["--set", "engine={max_num_seqs: abc}"],
     "error: --set engine: engine.max_num_seqs: expected an integer, got 'abc'\n"),
    ({"engine.max_num_seqs": 0}, [], "error: set.engine.max_num_seqs: must be >= 1, got 0\n"),
    # --set is applied after set:, so its value is the one at fault
    ({"engine.max_num_seqs": 4}, ["--set", "engine.max_num_seqs=-2"],
     "error: --set engine.max_num_seqs: must be >= 1, got -2\n"),
])
def test_a_bad_fixed_value_names_set_not_a_point(tmp_path, capsys, fixed, flags, message):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"base": str(TINY), "set": fixed,
                                    "grid": {"workload.rate": [5, 6]}}))
    for command in (["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"],
                    ["validate", str(path)]):
        code = main([*command, *flags])
        err = capsys.readouterr().err
        assert code == 2 and err == message, err
    assert not (tmp_path / "o").exists()


def test_a_bad_value_in_the_base_scenario_names_the_base_not_a_point(tmp_path, capsys):
    # the base file's own bad value was blamed on "sweep point 0"
    base = yaml.safe_load(TINY.read_text())
    base["engine"]["max_num_seqs"] = 0
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"workload.rate": [5, 6]}}))
    for command in (["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"],
                    ["validate", str(path)]):
        assert main(command) == 2
        assert capsys.readouterr().err == ("error: engine.max_num_seqs: must be >= 1, got 0 "
                                           "(in the sweep's base scenario, before any "
                                           "point)\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("axis, point", [([64, 1024], 1), ([1024, 64], 0)])
def test_a_fixed_value_bad_only_with_some_points_still_names_the_point(tmp_path, axis, point):
    # max_num_batched_tokens below max_model_len without chunked prefill: the set: value is
    # wrong only beside a long max_model_len, so the point that has it is named
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "base": str(TINY), "grid": {"engine.max_model_len": axis},
        "set": {"engine.max_num_batched_tokens": 100, "engine.enable_chunked_prefill": False}}))
    with pytest.raises(ConfigError, match=rf"^engine\.max_num_batched_tokens: 100 is smaller "
                                          rf"than max_model_len 1024.*\(in sweep point {point}: "
                                          rf"engine\.max_model_len=1024\)$"):
        load_sweep(path).scenarios()


def test_a_fixed_field_beside_the_axes_still_applies(tmp_path, capsys):
    # a whole section set beside an axis inside it is not dropped: its other fields stay
    path = write_grid(tmp_path, grid={"workload.rate": [5.0, 20.0]})
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--quiet",
                 "--no-report", "--set", "workload.num_requests=7"]) == 0
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert table["num_requests"].tolist() == [7, 7]


def test_cli_sweep_overrides_get_their_own_default_folder(tmp_path, capsys, monkeypatch):
    """issue #33 item 1: `sweep --set` writes beside, not into, the sweep without overrides;
    a --no-report rerun removes the report of the earlier sweep in the folder it reuses."""
    path = write_grid(tmp_path, grid={"workload.rate": [5.0, 20.0]})
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(path), "--workers", "1", "--quiet"]) == 0
    plain = tmp_path / "runs" / "grid"
    assert (plain / "report.html").is_file()
    assert main(["sweep", str(path), "--workers", "1", "--quiet", "--no-report",
                 "--set", "engine.max_num_seqs=4"]) == 0
    other = tmp_path / "runs" / "grid+engine.max_num_seqs=4"
    assert (other / "sweep.csv").is_file() and not (other / "report.html").exists()
    assert yaml.safe_load((plain / "sweep.yaml").read_text())["scenario"]["engine"][
        "max_num_seqs"] == 16
    assert main(["sweep", str(path), "--workers", "1", "--quiet", "--no-report"]) == 0
    assert not (plain / "report.html").exists() and not (plain / "figures").exists()


# --- limits: points counted before they are expanded, workers bounded ---------------------------

def _axis(n: int) -> list[int]:
    return list(range(1, n + 1))


@pytest.mark.parametrize("grid, zip_, count, names", [
    # 10^12 points: refused at once, never built (expanding them ended in MemoryError)
    ({f"f{k}": _axis(10) for k in range(12)}, {}, "1,000,000,000,000 points",
     "(f0 10 x f1 10 x f2 10"),
    ({"workload.rate": _axis(1000), "seed": _axis(1000)}, {}, "1,000,000 points",
     "(workload.rate 1,000 x seed 1,000)"),
    ({"workload.rate": _axis(2)}, {"seed": _axis(5001), "slo.ttft_ms": _axis(5001)},
     "10,002 points", "(workload.rate 2 x zip (seed, slo.ttft_ms) 5,001)"),
    ({}, {"seed": _axis(100_001)}, "100,001 points", "(zip (seed) 100,001)"),
])
def test_a_grid_past_the_point_limit_is_refused_before_it_is_expanded(grid, zip_, count, names):
    with pytest.raises(ConfigError) as e:
        expand(grid, zip_)
    assert e.value.field == ("grid" if grid else "zip")
    assert e.value.message.startswith(count) and names in e.value.message
    assert "more than the 10,000 a sweep may have" in e.value.message


def test_the_limit_itself_is_a_sweep():
    assert len(expand({"a": _axis(100), "b": _axis(100)})) == 10_000


def test_a_long_zip_list_in_a_file_without_aliases_is_not_an_alias_bomb(tmp_path, capsys,
                                                                         monkeypatch):
    # a zip list of 100,001 plain values passed the alias limit's 100,000 nodes and was called
    # an alias bomb; the limits are scaled down 100x here (PyYAML reads 100,001 values slowly)
    import simserve.plan.sweep as sweep_module
    import simserve.safeyaml as safeyaml
    monkeypatch.setattr(safeyaml, "MAX_NODES", 1000)
    monkeypatch.setattr(sweep_module, "MAX_SWEEP_POINTS", 100)
    path = write_grid(tmp_path, zip={"seed": _axis(1001)})
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "alias" not in err, err
    assert err.startswith("error: zip: 1,001 points (zip (seed) 1,001) is more than the "
                          "100 a sweep may have") and err.count("\n") == 1


def test_an_alias_bomb_in_a_sweep_file_is_still_one(tmp_path):
    lines = ["a0: &a0 [" + ", ".join(["1"] * 20) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 20) + "]" for i in range(1, 6)]
    path = tmp_path / "grid.yaml"
    path.write_text("\n".join(lines) + f"\nbase: {TINY}\ngrid: {{seed: *a5}}\n")
    with pytest.raises(SimserveError, match=r"grid\.yaml:\d+: the aliases expand to more than "
                                            r"100,000 values beyond the \d+ written out"):
        load_sweep(path)


@pytest.mark.parametrize("workers", [0, -3, 10**6])
def test_workers_are_bounded(tmp_path, capsys, workers):
    import os
    top = min(256, 4 * (os.cpu_count() or 1))
    code = main(["sweep", str(write_grid(tmp_path, grid={"workload.rate": [5, 20]})),
                 "--workers", str(workers), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --workers: must be 1 to {top} (4 x this machine's")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="^workers: must be 1 to"):
        run_scenarios([], workers=top + 1)


# --- values from Python ------------------------------------------------------------------------

def test_numpy_tuple_and_range_axes_sweep_as_their_lists(tmp_path):
    # np.arange was "grid.workload.rate: expected a non-empty list of values" (it is one), and
    # an np.int64 fixed value or workers count was refused or could not be written to sweep.yaml
    from simserve.plan.sweep import make_spec, save_sweep
    given = make_spec(TINY, {"workload.rate": np.arange(5, 20, 5)},
                      {"seed": (1, 2), "engine.max_num_seqs": range(8, 24, 8)},
                      fixed={"workload.num_requests": np.int64(10)})
    typed = make_spec(TINY, {"workload.rate": [5, 10, 15]},
                      {"seed": [1, 2], "engine.max_num_seqs": [8, 16]},
                      fixed={"workload.num_requests": 10})
    assert given == typed
    assert all(type(v) is int for p in given.points() for v in p.values())
    a, b = save_sweep(pd.DataFrame(), given, tmp_path / "a"), save_sweep(pd.DataFrame(), typed,
                                                                          tmp_path / "b")
    assert (a / "sweep.yaml").read_text() == (b / "sweep.yaml").read_text()
    table = sweep(TINY, grid={"workload.rate": np.array([5.0, 10.0])},
                  fixed={"workload.num_requests": np.int64(10)}, workers=np.int64(1))
    pd.testing.assert_frame_equal(table, sweep(TINY, grid={"workload.rate": [5.0, 10.0]},
                                               fixed={"workload.num_requests": 10}, workers=1))
    assert expand({"a": np.array([1, 2])}) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ConfigError, match=r"^grid\.a: expected a non-empty list of values, got "
                                          r"str 'xy'"):
        expand({"a": "xy"})           # one value, not a list of its characters
    with pytest.raises(ConfigError, match=r"^workers: must be 1 to"):
        sweep(TINY, grid={"seed": [1]}, workers=np.bool_(True))


@pytest.mark.parametrize("call", [
    lambda o: sweep(TINY, grid={"workload.rate": [5]}, overrides=o),
    lambda o: sweep(DATA / "none.yaml", overrides=o),
    lambda o: load_sweep(DATA / "none.yaml", overrides=o),
])
def test_overrides_must_be_a_list_of_strings(call):
    # a lone string was split into characters: "--set: expected FIELD=VALUE, got 's'"
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of FIELD=VALUE "
                                          r"strings, got str 'seed=1'"):
        call("seed=1")


def test_arguments_a_sweep_would_ignore_are_refused(tmp_path):
    from simserve.plan.sweep import make_spec
    spec = make_spec(TINY, {"seed": [1]})
    with pytest.raises(ConfigError, match=r"^overrides: would be ignored: a SweepSpec"):
        sweep(spec, overrides=["workload.num_requests=5"])
    with pytest.raises(ConfigError, match=r"^grid: would be ignored: a SweepSpec"):
        sweep(spec, grid={"seed": [2]})
    with pytest.raises(ConfigError, match=r"^fixed: would be ignored: a sweep file"):
        sweep(write_grid(tmp_path, grid={"seed": [1]}), fixed={"seed": 3})
