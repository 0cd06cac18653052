"""The Python API's entry points (simserve.run, compare, capacity) given the wrong kind of
input: one ConfigError naming the argument or field, never a TypeError from deep inside."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import simserve
from simserve.config import load_scenario
from simserve.errors import ConfigError

TINY = Path(__file__).parents[1] / "data" / "tiny.yaml"


def tiny() -> dict:
    return yaml.safe_load(TINY.read_text())


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_run_takes_a_scenario_mapping_as_sweep_and_plan_do():
    # was: TypeError "expected str, bytes or os.PathLike object, not dict"
    from_mapping = simserve.run(tiny(), overrides=["workload.rate=10"])
    from_file = simserve.run(TINY, overrides=["workload.rate=10"])
    assert from_mapping.summary == from_file.summary
    assert from_mapping.scenario.overrides == ("workload.rate=10",)


def test_a_bad_field_in_a_mapping_is_named():
    raw = tiny()
    raw["workload"]["rate"] = "abc"
    assert message(simserve.run, raw).startswith("workload.rate: ")
    raw = tiny()
    raw["engine"]["max_num_seqz"] = 4
    assert message(simserve.run, raw).startswith("engine.max_num_seqz: unknown field")


@pytest.mark.parametrize("scenario", [None, 5, [1, 2], b"tiny.yaml"])
def test_run_refuses_what_is_not_a_scenario(scenario):
    assert message(simserve.run, scenario).startswith("scenario: expected a Scenario, a "
                                                      "scenario mapping or the path")


@pytest.mark.parametrize("overrides", ["workload.rate=3", [5], ("seed=1", None), 7])
def test_overrides_must_be_a_list_of_strings(overrides):
    # a lone string was split into characters: "--set: expected FIELD=VALUE, got 'w'"
    assert message(simserve.run, TINY, overrides=overrides).startswith("overrides: expected")


@pytest.mark.parametrize("item", ["workload.rate", "=3", " =3"])
def test_an_override_without_field_or_value_names_the_argument_not_the_cli_flag(item):
    # Python said "--set: expected FIELD=VALUE", naming a flag the caller never used
    for call in (simserve.run, simserve.compare):
        assert message(call, TINY, overrides=[item]) == \
            f"overrides: expected FIELD=VALUE, got {item!r}"


def test_overrides_on_a_resolved_scenario_are_refused_not_dropped():
    # they were silently ignored: the run was the scenario's own
    s = load_scenario(TINY)
    assert message(simserve.run, s, overrides=["workload.rate=3"]).startswith("overrides: ")
    assert simserve.run(s, overrides=[]).summary["num_requests"] == 60


def test_a_mapping_with_compare_or_a_sweep_says_which_call_runs_it():
    raw = {**tiny(), "compare": {"seed": [1, 2]}}
    assert message(simserve.run, raw).startswith("compare: ")
    assert "simserve.sweep()" in message(simserve.run, {"base": str(TINY),
                                                        "grid": {"seed": [1]}})


def test_compare_names_its_path_argument():
    assert message(simserve.compare, tiny()).startswith("path: expected the path")


@pytest.mark.parametrize("kwargs, field", [
    ({"target_rate": "40"}, "target_rate"),        # was TypeError: '<' not supported
    ({"tolerance": "0.1"}, "tolerance"),
    ({"seeds": 1.5}, "seeds"),                     # passed the bound check, then range(1.5)
    ({"seeds": True}, "seeds"),
    ({"max_replicas": "8", "target_rate": 40}, "max_replicas"),
])
def test_capacity_arguments_of_the_wrong_type_are_named(kwargs, field):
    assert message(simserve.capacity, TINY, **kwargs).startswith(f"{field}: expected")


def test_capacity_takes_a_mapping_and_names_its_bad_field():
    raw = tiny()
    raw["slo"]["ttft_ms"] = -1
    assert message(simserve.capacity, raw).startswith("slo.ttft_ms: ")


# -- from a notebook user's round (2026-11-30) -------------------------------------------------


def test_numpy_numbers_are_taken_as_the_plain_ints_and_floats_they_are():
    import numpy as np
    raw = tiny()
    raw["seed"], raw["workload"]["num_requests"] = np.int64(3), np.int64(20)
    raw["workload"]["rate"] = np.float32(10.0)
    plain = tiny()
    plain["seed"], plain["workload"]["num_requests"], plain["workload"]["rate"] = 3, 20, 10.0
    got = simserve.run(raw)
    assert got.summary == simserve.run(plain).summary
    assert type(got.scenario.seed) is int and got.summary["num_requests"] == 20
    raw["seed"] = np.bool_(True)          # a boolean still is not a number
    assert message(simserve.run, raw).startswith("seed: expected an integer")


@pytest.mark.parametrize("change, start", [
    ({"seed": "abc"}, "seed: expected an integer"),
    ({"seed": -1}, "seed: expected an integer >= 0"),
    ({"policy": "vllm_v9"}, "policy: unknown value 'vllm_v9'"),
    ({"sead": 3}, "sead: not a Scenario field (did you mean seed?)"),
    ({"workload": {"rate": 5}}, "workload.num_requests: is required"),
    ({"workload": "x"}, "workload: expected a WorkloadConfig or a mapping"),
    ({"cluster": {}}, "cluster: expected a ClusterConfig"),
    ({"model": "no-such-model"}, "model: "),
    ({"policy_params": 3}, "policy_params: expected None for policy 'vllm_v1'"),
    ({"metric_percentiles": [0]}, "metric_percentiles[0]: expected a number in (0, 100]"),
])
def test_scenario_replace_checks_what_it_is_given_as_the_file_is_checked(change, start):
    s = load_scenario(TINY)
    assert message(s.replace, **change).startswith(start)


def test_scenario_replace_reads_values_as_a_scenario_file_writes_them():
    s = load_scenario(TINY)
    assert s.replace(model="Qwen2.5-7B", engine={"max_num_seqs": 8}).model.name == "Qwen2.5-7B"
    assert s.replace(slo=None).slo.is_empty            # (an empty section: no SLO)
    sarathi = s.replace(policy="sarathi")
    assert sarathi.policy == "sarathi" and simserve.run(sarathi).summary["completed"] > 0
    raw = tiny()
    raw["seed"] = 11
    assert simserve.run(s.replace(seed=11)).summary == simserve.run(raw).summary


def test_results_are_never_saved_over_the_files_the_run_read(tmp_path, capsys):
    """A trace or scenario in the output folder would be replaced by the results: refused
    before anything is written, from Python and from the command line."""
    from simserve.cli import main
    trace = tmp_path / "requests.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,20,5\n0.1,30,4\n")
    raw = tiny()
    del raw["workload"]
    raw["workload"] = {"trace": "requests.csv", "format": "csv"}
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(raw))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = simserve.run(tmp_path / "scenario.yaml")
    with pytest.raises(simserve.errors.SimserveError, match="would overwrite .*which this run"):
        result.save(tmp_path)
    assert main(["run", str(tmp_path / "scenario.yaml"), "--out", str(tmp_path)]) == 2
    assert "which this run reads" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    saved = result.save(tmp_path / "out")
    assert (saved / "requests.csv").is_file()
    # ...but a results folder's own scenario.yaml, run again in place, is rewritten
    again = simserve.run(saved / "scenario.yaml")
    again.save(saved)
    assert again.summary == result.summary
    assert main(["run", str(saved / "scenario.yaml"), "--out", str(saved), "--no-report"]) == 0


@pytest.mark.parametrize("out", ["", None, 5])
def test_save_needs_a_folder(out, tmp_path):
    result = simserve.run(TINY, overrides=["workload.num_requests=5"])
    with pytest.raises(simserve.errors.SimserveError, match="out_dir: expected a folder"):
        result.save(out)


def test_save_with_tokens_refuses_a_run_that_did_not_record_them(tmp_path):
    result = simserve.run(TINY, overrides=["workload.num_requests=5"])
    with pytest.raises(simserve.errors.SimserveError, match="record_tokens=True"):
        result.save(tmp_path, tokens=True)
    assert not any(tmp_path.iterdir())


def test_saving_a_run_replaces_another_kind_of_output_in_the_folder(tmp_path):
    (tmp_path / "capacity.json").write_text("{}")
    (tmp_path / "probes.csv").write_text("rate\n1\n")
    (tmp_path / "notes.txt").write_text("mine")
    simserve.run(TINY, overrides=["workload.num_requests=5"]).save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt", "requests.csv", "scenario.yaml", "steps.csv", "summary.json"]


def test_load_functions_name_what_is_not_a_file_path():
    assert message(load_scenario, TINY, overrides="seed=1").startswith(
        "overrides: expected a list")
    assert message(load_scenario, tiny()).startswith("path: expected the path")
    assert message(load_scenario, None).startswith("path: expected the path")
    assert message(simserve.config.load_variants, load_scenario(TINY)).startswith(
        "path: expected the path")
    text = TINY.read_text()
    assert message(simserve.run, text).startswith("path: is YAML text")
    assert len(message(simserve.run, text).splitlines()) == 1


def test_run_names_a_latency_that_is_not_a_model():
    assert message(simserve.run, TINY, latency="roofline").startswith(
        "latency: expected a step-latency model")


def test_compare_checks_every_variant_before_running_any(tmp_path, monkeypatch):
    raw = tiny()
    raw["model"] = "Llama-3.1-70B"
    raw["engine"] = {"tensor_parallel_size": 2, "max_model_len": 2048}
    raw["latency"] = {"model": "roofline"}
    raw["compare"] = {"hardware": ["H100-SXM", "L40S"]}
    path = tmp_path / "cmp.yaml"
    path.write_text(yaml.safe_dump(raw))
    ran = []
    real = simserve.runner.run
    monkeypatch.setattr(simserve.runner, "run", lambda s, **k: ran.append(s) or real(s, **k))
    assert "(in compare variant 'L40S')" in message(simserve.compare, path)
    assert ran == []


def test_request_column_names_a_missing_column():
    result = simserve.run(TINY, overrides=["workload.num_requests=5"])
    with pytest.raises(simserve.errors.SimserveError, match="did you mean ttft_s"):
        result.request_column("ttft")


def test_scenario_replace_keeps_a_policys_knobs_unless_the_policy_changes():
    raw = tiny()
    raw["scheduler"] = {"policy": "tgi", "waiting_served_ratio": 0.7}
    s = simserve.run(raw, overrides=["workload.num_requests=5"]).scenario
    assert s.replace(policy="tgi").policy_params.waiting_served_ratio == 0.7
    assert s.replace(seed=2).policy_params.waiting_served_ratio == 0.7
    assert s.replace(policy="lmdeploy").policy_params.schedule_interval == 16
    assert s.replace(policy="vllm_v1").policy_params is None


def test_a_short_probe_of_a_trace_is_told_to_replay_a_longer_trace():
    """For a trace, num_requests only caps its rows: the advice names the trace's length."""
    from types import SimpleNamespace
    from simserve.plan.capacity import _more_requests
    trace = SimpleNamespace(base=SimpleNamespace(workload=SimpleNamespace(trace=object())))
    synthetic = SimpleNamespace(base=SimpleNamespace(workload=SimpleNamespace(trace=None)))
    said = _more_requests(trace, 128, "at that rate", 100)
    assert said.startswith("replay a trace of at least 128 requests") and "gives 100" in said
    assert _more_requests(synthetic, 128, "", 100).startswith(
        "raise workload.num_requests to at least 128")


def test_scenario_replace_serves_the_card_as_a_new_engine_does():
    raw = tiny()
    raw["latency"] = {"model": "roofline"}
    del raw["engine"]["num_gpu_blocks"]
    engine = dict(raw["engine"], kv_cache_dtype="fp8")
    changed = load_scenario(TINY).replace(latency={"model": "roofline"}, engine=engine)
    parsed = simserve.parse_scenario({**raw, "engine": engine})
    assert changed.model == parsed.model and changed.model.kv_cache_dtype == "fp8"
    assert changed.replica == parsed.replica


def test_numpy_strings_are_kept_as_plain_strings(tmp_path):
    import numpy as np
    raw = tiny()
    raw["name"], raw["scheduler"]["policy"] = np.str_("np-name"), np.str_("sarathi")
    result = simserve.run(raw, overrides=["workload.num_requests=5"])
    assert type(result.scenario.name) is str and type(result.scenario.policy) is str
    assert (result.save(tmp_path) / "scenario.yaml").is_file()


def test_capacity_seeds_past_the_largest_int64_seed_still_run():
    got = simserve.capacity(TINY, overrides=[f"seed={2**63 - 1}", "workload.num_requests=30"],
                            seeds=2, tolerance=0.3)
    assert got.seeds == [2**63 - 1, 2**63] and got.max_rate > 0


def test_capacity_and_sweep_refuse_to_write_over_a_trace_in_their_folder(tmp_path, capsys):
    from simserve.cli import main
    for name in ("probes.csv", "sweep.csv"):
        (tmp_path / name).write_text("arrival_s,prompt_tokens,output_tokens\n"
                                     + "".join(f"{i * 0.05:.2f},40,8\n" for i in range(30)))
    raw = tiny()
    raw["workload"] = {"trace": "probes.csv", "format": "csv"}
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(raw))
    raw["workload"] = {"trace": "sweep.csv", "format": "csv"}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(
        {"base": "base.yaml", "grid": {"seed": [1, 2]}}))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["capacity", str(tmp_path / "cap.yaml"), "--out", str(tmp_path),
                 "--seeds", "1"]) == 2
    assert "probes.csv, which this run reads" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "grid.yaml"), "--out", str(tmp_path)]) == 2
    assert "sweep.csv, which this run reads" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_capacity_result_is_not_saved_over_its_inputs_and_replaces_a_run(tmp_path):
    (tmp_path / "probes.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                         + "".join(f"{i * 0.05:.2f},40,8\n" for i in range(30)))
    raw = tiny()
    raw["workload"] = {"trace": "probes.csv", "format": "csv", "rate": 10}
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(raw))
    found = simserve.capacity(tmp_path / "cap.yaml", seeds=1, tolerance=0.3)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(simserve.errors.SimserveError, match="probes.csv, which this run reads"):
        found.save(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    elsewhere = tmp_path / "out"
    simserve.run(TINY, overrides=["workload.num_requests=5"]).save(elsewhere)
    found.save(elsewhere)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["capacity.json", "probes.csv"]
