"""simserve plan: the bounds against an exhaustive search, the vllm serve line against vLLM's
own argument names, Ray fan-out, bad input (one line, exit 2) and "none meets" (exit 3)."""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

import simserve
from simserve.cli import main
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.plan.bounds import kv_fits
from simserve.plan.command import engine_flags
from simserve.plan.planner import load_plan_inputs, plan

SMALL = Path(__file__).parents[1] / "data" / "plan_small.yaml"
PLAN_70B = Path(__file__).parents[2] / "benchmarks" / "data" / "plan_llama70b.yaml"

# vLLM's `vllm serve` flags, written down from vllm-project/vllm vllm/engine/arg_utils.py
# (EngineArgs.add_cli_args) at commit 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b (the 0.11
# series: its deprecations say "will be removed in v0.12.0"). Boolean fields use
# argparse.BooleanOptionalAction, so each has its --no- form.
VLLM_ARGS = {
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
    "--enable-expert-parallel", "--no-enable-expert-parallel", "--max-model-len",
    "--max-num-batched-tokens", "--max-num-seqs", "--gpu-memory-utilization", "--block-size",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--kv-cache-dtype", "--quantization", "--async-scheduling",
    "--no-async-scheduling", "--kv-transfer-config", "--swap-space", "--seed", "--dtype",
}


# The bounds, the vllm serve line, the report and Ray fan-out do not need plan_small's 120
# requests per probe: 40 give each bound something to prune (cost 4-6, slo 4, throughput 3
# candidates) in under half the time
FEWER = ["workload.num_requests=40"]


def _space(**changes):
    base = dict(yaml.safe_load(SMALL.read_text())["plan"])
    base.update(changes)
    return base


@pytest.mark.parametrize("overrides, space, bound", [
    ([], {}, "cost"),
    (["slo.tpot_ms=20"], {}, "slo"),                 # L40S TP 1: one decode step > 20 ms
    ([], {"max_replicas": 3}, "throughput"),          # slow cards cannot reach 30 req/s
])
def test_pruned_plan_equals_exhaustive_search(overrides, space, bound):
    # 24 candidates; each bound prunes some; the answer must not change
    overrides = [*FEWER, *overrides]
    pruned = plan(SMALL, 30, overrides=overrides, space=_space(**space), workers=1)
    full = plan(SMALL, 30, overrides=overrides, space=_space(**space), workers=1, prune=False)
    assert pruned.pruned[bound] > 0 and pruned.pruned["cost"] > 0
    assert pruned.simulated < full.simulated == 24
    assert pruned.winner is not None
    assert (pruned.winner, pruned.runners_up) == (full.winner, full.runners_up)
    cols = ["candidate", "replicas", "gpus", "cost_per_hour", "cost_per_million_output_tokens"]
    assert pruned.ranking()[cols].equals(full.ranking()[cols])
    # every pruned candidate is, in the exhaustive search, no cheaper than the last one kept
    last = full.row(full.runners_up[-1])["cost_per_hour"]
    t = full.table.set_index("candidate")
    for i in pruned.table[pruned.table["pruned_by"] == "cost"]["candidate"]:
        cost = t.loc[i, "cost_per_hour"]
        assert cost != cost or cost >= last      # NaN: it does not serve the rate at all


def test_bounds_slo_throughput_memory_parallelism():
    # TP 3 does not divide 32 heads; max_replicas 2 cannot reach 200 req/s on most cards
    r = plan(SMALL, 60, space=_space(tensor_parallel_size=[1, 3], max_replicas=2), workers=1)
    assert r.pruned["parallelism"] == 12
    assert r.pruned["throughput"] > 0
    t = r.table
    assert set(t[t["tensor_parallel_size"] == 3]["status"]) == {"pruned: parallelism"}
    # a lone request's TTFT bound: a 1 ms TTFT limit is missed by everything, before any run
    r = plan(SMALL, 5, overrides=["slo.ttft_ms=1"], workers=1)
    assert r.pruned["slo"] == 24 and r.simulated == 0 and not r.met
    assert len(r.closest) == 5
    # memory: Llama-3.1-70B's weights do not fit one L40S
    raw, base_dir, name, _ = load_plan_inputs(SMALL, overrides=["model=Llama-3.1-70B",
                                                                "hardware=L40S"])
    assert "weights need 141.1 GB per device" in kv_fits(parse_scenario(raw, base_dir, name))
    raw["engine"]["tensor_parallel_size"] = 4
    assert kv_fits(parse_scenario(raw, base_dir, name)) == ""
    # ...and one max_model_len request's KV must fit beside them, as vLLM checks at start-up:
    # on two H100s the 70B weights leave room for a few thousand tokens, not 8,192
    raw["hardware"], raw["engine"]["tensor_parallel_size"] = "H100-SXM", 2
    raw["engine"]["max_model_len"] = 8192
    assert "fewer than one max_model_len request" in kv_fits(parse_scenario(raw, base_dir, name))
    raw["engine"]["max_model_len"] = 1024
    assert kv_fits(parse_scenario(raw, base_dir, name)) == ""


def _flags(commands):
    return {w for c in commands for w in c.split() if w.startswith("--")}


def test_vllm_serve_uses_vllms_argument_names():
    r = plan(SMALL, 30, overrides=FEWER, workers=1)
    assert r.commands and r.commands[0].startswith("vllm serve meta-llama/Llama-3.1-8B ")
    flags = _flags(r.commands)
    assert {"--tensor-parallel-size", "--max-num-batched-tokens", "--max-num-seqs",
            "--max-model-len", "--gpu-memory-utilization"} <= flags
    assert flags <= VLLM_ARGS, flags - VLLM_ARGS
    # every flag the writer can emit: EP, async scheduling, prefix caching, fp8 KV, DP
    raw, base_dir, name, _ = load_plan_inputs(SMALL, overrides=[
        "model=Qwen3-30B-A3B", "engine.enable_expert_parallel=true",
        "engine.tensor_parallel_size=2", "engine.async_scheduling=true",
        "engine.enable_prefix_caching=true", "engine.kv_cache_dtype=fp8",
        "engine.data_parallel_size=2"])
    more = _flags([" ".join(engine_flags(parse_scenario(raw, base_dir, name)))])
    assert {"--enable-expert-parallel", "--async-scheduling", "--enable-prefix-caching",
            "--kv-cache-dtype", "--data-parallel-size"} <= more
    assert more <= VLLM_ARGS, more - VLLM_ARGS
    # disaggregated: one line per role, each with the KV connector
    r = plan(SMALL, 30, space=_space(hardware=["L40S"], tensor_parallel_size=[1],
                                     disaggregation=["1:1"], max_num_batched_tokens=[1024]),
             workers=1)
    assert len(r.commands) == 2 and _flags(r.commands) <= VLLM_ARGS
    assert all("--kv-transfer-config" in c for c in r.commands)


def test_callable_package_and_saved_table(tmp_path):
    import pandas as pd
    r = simserve.plan(SMALL, 30, space=_space(hardware=["H100-SXM"]), workers=1)
    out = r.save(tmp_path)
    table = pd.read_csv(out / "candidates.csv")
    assert len(table) == 8 and table["candidate"].tolist() == list(range(8))
    answer = json.loads((out / "plan.json").read_text())
    assert answer["winner"] == r.winner and answer["met"]


def test_ray_fan_out_matches_local():
    pytest.importorskip("ray")
    space = _space(hardware=["H100-SXM"], disaggregation=["colocated"])
    local = plan(SMALL, 30, overrides=FEWER, space=space, workers=1)
    remote = plan(SMALL, 30, overrides=FEWER, space=space, executor="ray")
    assert remote.winner == local.winner
    assert remote.table.equals(local.table)


@pytest.mark.parametrize("args, field", [
    (["--target-rate", "0"], "--target-rate"),
    (["--target-rate", "500000"], "--target-rate"),
    (["--target-rate", "5", "--set", "slo.ttft_ms=null"], "slo"),
])
def test_cli_bad_input_one_line_exit_2(args, field, capsys, tmp_path):
    rc = main(["plan", str(SMALL), *args, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: {field}"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("space, field", [
    ({"tensor_parallel_size": []}, "plan.tensor_parallel_size"),
    ({"hardware": ["H200"]}, "plan.prices.H200"),
    ({"disaggregation": ["2-1"]}, "plan.disaggregation[0]"),
    ({"max_num_seqs": [0]}, "plan.max_num_seqs[0]"),
    ({"prices": {"L40S": -1}}, "plan.prices.L40S"),
    ({"tensor_parallel_size": [3]}, "plan"),          # nothing can start
    ({"bogus": 1}, "plan.bogus"),
])
def test_bad_space_names_the_field(space, field, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps({"plan": space}))
    with pytest.raises(ConfigError) as e:
        plan(SMALL, 5, space=path if "bogus" in space else space, workers=1)
    assert e.value.field.endswith(field), e.value.field


@pytest.mark.parametrize("override, field, source", [
    # every candidate wrote its own value over these: the --set was dropped silently
    ("engine.tensor_parallel_size=4", "engine.tensor_parallel_size", "plan.tensor_parallel_size"),
    ("engine.max_num_batched_tokens=2048", "engine.max_num_batched_tokens",
     "plan.max_num_batched_tokens"),
    ("hardware=A100-80GB", "hardware", "plan.hardware"),
    ("cluster.replicas=4", "cluster.replicas", "the replica search (plan.max_replicas)"),
])
def test_cli_a_set_that_every_candidate_replaces_is_refused(capsys, tmp_path, override, field,
                                                              source):
    rc = main(["plan", str(SMALL), "--target-rate", "5", "--set", override,
               "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert rc == 2 and err == (f"error: --set {key}: simserve plan sets {field} for every "
                               f"candidate, from {source}: this value would be dropped; vary "
                               f"it there\n"), err
    assert not (tmp_path / "o").exists()


def test_cli_a_set_of_a_whole_section_holding_a_planned_field_is_refused(capsys, tmp_path):
    # --set engine={...} replaced the section, and the candidates then wrote their own
    # tensor_parallel_size over the one inside it: dropped silently
    rc = main(["plan", str(SMALL), "--target-rate", "5", "--set",
               "engine={tensor_parallel_size: 4, max_num_seqs: 64}", "--out",
               str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("error: --set engine: simserve plan sets "
                               "engine.tensor_parallel_size for every candidate, from "
                               "plan.tensor_parallel_size: this value would be dropped; vary "
                               "it there\n"), err
    assert not (tmp_path / "o").exists()


def test_a_set_the_space_leaves_to_the_scenario_is_kept():
    # plan_small's space gives no max_num_seqs (None: the scenario's), so --set reaches every
    # candidate; and without plan.hardware the --set hardware is the one planned
    space = _space(hardware=None, tensor_parallel_size=[1], disaggregation=["colocated"],
                   max_num_batched_tokens=[1024])
    r = plan(SMALL, 5, space=space, overrides=["engine.max_num_seqs=64", "hardware=L40S"],
             workers=1)
    assert set(r.table["max_num_seqs"]) == {64} and set(r.table["hardware"]) == {"L40S"}


def test_cli_searches_that_all_fail_are_bad_input_not_none_meets(capsys, tmp_path):
    # 20 requests arrive almost at once at any high rate, so no capacity search finds a rate
    # that fails: each candidate's search raised, was recorded as "misses SLO", and the plan
    # said "no deployment meets the SLOs" (exit 3) over an empty table
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps({"plan": {"hardware": ["H100-SXM"],
                                          "tensor_parallel_size": [1, 2]}}))
    rc = main(["plan", str(SMALL), "--target-rate", "5", "--plan", str(space),
               "--set", "workload.num_requests=20", "--out", str(tmp_path / "o"), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("error: plan: the capacity search failed for all 2 candidates "
                          "simulated; candidate 0 (H100-SXM TP1 colocated): capacity: SLO "
                          "attainment still meets the target at "), err
    assert "raise workload.num_requests" in err and "no deployment meets" not in out
    assert not (tmp_path / "o").exists()


def test_cli_none_meets_exit_3_with_closest(capsys, tmp_path):
    rc = main(["plan", str(SMALL), "--target-rate", "30", "--set", "slo.tpot_ms=4",
               "--out", str(tmp_path), "--quiet", "--no-report"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "no deployment meets the SLOs" in out
    answer = json.loads((tmp_path / "plan.json").read_text())
    assert not answer["met"] and answer["closest"]
    assert re.search(r"pruned by bound: parallelism 0, config 0, memory 0, slo \d+", out)


def test_cli_plan_writes_report(capsys, tmp_path):
    rc = main(["plan", str(SMALL), "--target-rate", "30", "--out", str(tmp_path), "--quiet",
               "--workers", "1", *(f"--set={o}" for o in FEWER)])
    assert rc == 0
    html = (tmp_path / "report.html").read_text()
    assert "Plan: plan_small" in html and "Pareto" in html
    assert (tmp_path / "figures" / "plan_small_pareto.png").is_file()


def test_validate_checks_a_plan_file_for_plan_and_run_alike(capsys):
    assert main(["validate", str(SMALL)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{SMALL}: ok — plan of 24 candidate deployments, 24 can start",
        "  simserve run of this file: ok too"]
    # a --set that `simserve plan` drops (it sets the field per candidate), which `run` keeps
    assert main(["validate", str(SMALL), "--set", "engine.tensor_parallel_size=2"]) == 0
    assert "simserve plan would refuse --set engine.tensor_parallel_size: simserve plan sets " \
        "engine.tensor_parallel_size for every candidate" in capsys.readouterr().out


# one H100 (TP 1) and one L40S, 120 requests a probe: the L40S needs 7 replicas for 30 req/s,
# more than 7 x the rate one misses at (the probe is too short to load them steadily)
TWO_CARDS = {"hardware": ["L40S", "H100-SXM"], "tensor_parallel_size": [1],
             "disaggregation": ["colocated"], "max_num_batched_tokens": [4096], "runners_up": 2,
             "prices": {"L40S": 0.9}}


def test_replica_counts_from_probes_too_short_are_flagged():
    # the capacity search's note ("a probe too short to load them steadily") was dropped: the
    # plan listed 9 L40S replicas at 2.42 req/s each as serving 40 req/s, with no notes
    r = plan(SMALL, 30, space=TWO_CARDS, workers=1)
    rows = r.table.set_index("candidate")
    assert r.winner == 1 and r.runners_up == [0]
    assert bool(rows.loc[0, "short_probe"]) and not bool(rows.loc[1, "short_probe"])
    assert rows.loc[0, "status"] == "serves target" and "lower bound" in rows.loc[0, "reason"]
    assert rows.loc[0, "replicas"] * rows.loc[0, "max_rate_per_copy"] < 30
    assert list(r.ranking()["status"]) == ["serves target", "serves target (short probe)"]
    assert len(r.notes) == 1 and r.notes[0].startswith("candidate(s) 0 (status 'short probe')")
    assert "raise workload.num_requests (now 120)" in r.notes[0]
    assert r.notes[0] in r.answer() and r.to_dict()["notes"] == r.notes


def test_a_price_given_in_another_case_is_the_one_used_and_said():
    # the shipped 'H100-SXM' and a given 'h100-sxm' both stayed: the cost used the given one,
    # the assumed block said the default
    r = plan(SMALL, 30, space={**TWO_CARDS, "hardware": ["H100-SXM"],
                               "prices": {"h100-sxm": 1.0}}, workers=1)
    assert r.row(r.winner)["cost_per_hour"] == 1.0
    assert r.assumptions()[1].startswith("  H100-SXM: $1/GPU-hour (yours)")
    assert [k for k in r.space["prices"] if k.lower() == "h100-sxm"] == ["h100-sxm"]


def test_plan_says_what_it_assumed():
    r = plan(SMALL, 30, space=TWO_CARDS, workers=1)
    lines = r.assumptions()
    assert lines[0] == "assumed:"
    l40s, h100 = lines[1], lines[2]
    assert l40s.startswith("  L40S: $0.9/GPU-hour (yours); step times: roofline from the L40S "
                           "spec sheet (an estimate)")
    assert h100.startswith("  H100-SXM: $2.25/GPU-hour (shipped default, an assumption") \
        and "h100-vllm curves, fitted to measured vLLM runs, median E2E mean error 8.8 % " \
            "within them" in h100 and "±" not in h100   # (a median, not a bound)
    assert lines[3] == "  each candidate probed with 120 requests a run, 1 seed(s) a rate, " \
                       "capacity to within 10%"
    assert "different standing" in lines[4]      # one fitted, one an estimate
    assert "\n".join(lines) in r.answer()
    assert r.to_dict()["assumed"] == [a.strip() for a in lines[1:]]
    one = plan(SMALL, 30, space={**TWO_CARDS, "hardware": ["L40S"]}, workers=1)
    assert not any("different standing" in a for a in one.assumptions())


def test_a_candidate_that_misses_the_slo_at_any_load_is_not_served_not_a_failure(capsys,
                                                                               tmp_path):
    # a TTFT limit just above one request's (the bound passes it) is missed at every rate: the
    # capacity search raised, the candidate was "search failed" and, alone, the plan exited 2
    # as bad input instead of 3 (none meets) with the lone-request latencies
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps({"plan": {**TWO_CARDS, "hardware": ["H100-SXM"]}}))
    args = ["plan", str(SMALL), "--target-rate", "30", "--plan", str(space), "--set",
            "slo.ttft_ms=32", "--set", "workload.num_requests=40", "--out", str(tmp_path / "o"),
            "--quiet"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(args)
    # (the Pareto figure with no point to plot warned "No artists with labels found")
    assert not [w for w in caught if "artists" in str(w.message)]
    out = capsys.readouterr().out
    assert rc == 3, out
    answer = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert not answer["met"] and answer["closest"] == [0]
    rows = list(csv.DictReader((tmp_path / "o" / "candidates.csv").open()))
    assert rows[0]["status"] == "not served" and "even at" in rows[0]["reason"]
    # the runs that showed it are kept (they were lost with the exception)
    probes = list(csv.DictReader((tmp_path / "o" / "probes.csv").open()))
    assert len(probes) == int(rows[0]["runs"]) > 5
    assert all(p["candidate"] == "0" and p["slo_met"] == "False" for p in probes)
    header = out.splitlines()[3]
    assert "lone_ttft_ms" in header and "replicas" not in header and "cost_per_hour" not in header
    html = (tmp_path / "o" / "report.html").read_text()
    assert "<th>lone_ttft_ms</th>" in html


def test_validate_checks_a_plans_candidates_not_its_base_deployment(capsys, tmp_path):
    # the shipped 70B plan example's base (70B on one H100) cannot start; its candidates can:
    # validate refused the file `simserve plan` ran (it now says what `run` would do)
    assert main(["validate", str(PLAN_70B)]) == 0
    out = capsys.readouterr().out
    assert "plan of 432 candidate deployments, 150 can start (ruled out: config 156, " \
           "memory 126)" in out
    assert "note: simserve run of this file would fail: model: Llama-3.1-70B's weights need " \
        "141.1 GB per device" in out
    bad = tmp_path / "bad.yaml"
    raw = yaml.safe_load(SMALL.read_text())
    raw["model"] = "Llama-3.1-70B"
    raw["plan"] = {"hardware": ["L40S"], "tensor_parallel_size": [1]}
    bad.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plan: no candidate of the 1 can start") and err.count("\n") == 1


def test_plan_and_capacity_results_read_well_in_a_notebook():
    import inspect
    params = inspect.signature(simserve.plan).parameters
    assert list(params)[:2] == ["scenario", "target_rate"] and "space" in params
    assert simserve.plan.__doc__.startswith("``simserve.plan(scenario, target_rate")
    r = plan(SMALL, 30, space=TWO_CARDS, workers=1)
    text = repr(r)
    assert text.startswith("<PlanResult plan_small: 30 req/s of Llama-3.1-8B, 2 candidates, "
                           "2 simulated; cheapest: candidate 1, H100-SXM TP1 colocated; 1 note")
    assert len(text) < 300
    cap = simserve.capacity(SMALL, target_rate=30, overrides=["hardware=L40S"])
    text = repr(cap)
    assert text.startswith("<CapacityResult plan_small: max rate ") and "7 replica(s) for 30 " \
        "req/s; 1 note(s): .notes" in text and len(text) < 300
    assert cap.short_probe and cap.to_dict()["short_probe"] is True


def test_numpy_values_are_the_numbers_and_lists_they_hold():
    # np.int64(10) was "target_rate: must be > 0 and finite, got np.int64(10)", an array of
    # sizes "plan.tensor_parallel_size[0]: expected a positive integer, got array([1, 2])"
    space = {"hardware": ("H100-SXM", "L40S"), "tensor_parallel_size": np.array([1, 2]),
             "max_replicas": np.int64(8), "tolerance": np.float32(0.25),
             "prices": {"L40S": np.int64(1)}}
    r = plan(SMALL, np.int64(5), overrides=["slo.ttft_ms=1"], space=space,
             workers=np.int64(1))      # (a 1 ms TTFT: every candidate pruned, none simulated)
    typed = plan(SMALL, 5, overrides=["slo.ttft_ms=1"], workers=1,
                 space={"hardware": ["H100-SXM", "L40S"], "tensor_parallel_size": [1, 2],
                        "max_replicas": 8, "tolerance": 0.25, "prices": {"L40S": 1}})
    assert r.to_dict() == typed.to_dict() and len(r.table) == 4
    assert type(r.target_rate) is int and json.dumps(r.to_dict())


@pytest.mark.parametrize("kwargs, message", [
    # each was "must be > 0 and finite, got '10'" or a TypeError from inside
    ({"target_rate": "10"}, r"^target_rate: expected a number, got str '10'"),
    ({"target_rate": np.bool_(True)}, r"^target_rate: expected a number, got bool True"),
    ({"overrides": "seed=1"}, r"^overrides: expected a list of FIELD=VALUE strings"),
    ({"log": "x"}, r"^log: expected a function taking each line"),
    ({"workers": "2"}, r"^workers: expected an integer, got str '2'"),
    ({"workers": 0}, r"^workers: must be >= 1, got 0"),
])
def test_bad_python_arguments_are_one_config_error(kwargs, message):
    kwargs = {"target_rate": 5, **kwargs}
    with pytest.raises(ConfigError, match=message):
        plan(SMALL, kwargs.pop("target_rate"), overrides=kwargs.pop("overrides", ["seed=1"]),
             **kwargs)
    if "overrides" in message:     # `simserve validate`'s reading of a plan, too
        from simserve.plan.planner import check_plan
        with pytest.raises(ConfigError, match=message):
            check_plan(SMALL, "seed=1")


def test_a_plan_and_a_sweep_are_not_saved_over_their_inputs(tmp_path):
    """From Python too: a trace named as an output (probes.csv, sweep.csv) in the folder is
    kept, the save refused before anything is written; another kind of output is replaced."""
    import pandas as pd
    from simserve.errors import SimserveError
    from simserve.plan.sweep import load_sweep, save_sweep
    raw = yaml.safe_load(SMALL.read_text())
    raw["workload"] = {"trace": "probes.csv", "format": "csv", "rate": 5}
    (tmp_path / "probes.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.0,50,5\n"
                                         "0.2,60,6\n")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    r = plan(tmp_path / "s.yaml", 5, overrides=["slo.ttft_ms=1"], workers=1)   # all pruned
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(SimserveError, match="probes.csv, which this run reads"):
        r.save(tmp_path)
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(
        {"base": "s.yaml", "grid": {"seed": [1, 2]}}))
    before["grid.yaml"] = (tmp_path / "grid.yaml").read_bytes()
    spec = load_sweep(tmp_path / "grid.yaml")
    (tmp_path / "sweep.csv").write_text("not a sweep: the trace of an axis\n")
    before["sweep.csv"] = (tmp_path / "sweep.csv").read_bytes()
    spec.grid["workload.trace"] = ["sweep.csv"]
    with pytest.raises(SimserveError, match="sweep.csv, which this run reads"):
        save_sweep(pd.DataFrame({"point": [0]}), spec, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    elsewhere = tmp_path / "out"
    simserve.run(SMALL.parent / "tiny.yaml", overrides=["workload.num_requests=5"]).save(elsewhere)
    r.save(elsewhere)
    names = {p.name for p in elsewhere.iterdir()}
    assert "plan.json" in names and not names & {"scenario.yaml", "summary.json", "steps.csv"}
