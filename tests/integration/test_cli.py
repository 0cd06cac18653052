"""The command line: happy paths, and bad input giving one clear message and exit code 2.

Runs whose report is not what a test checks pass ``--no-report`` (writing it is most of a tiny
run's time; test_run_writes_outputs_and_prints_table keeps the default, and test_report.py
tests reports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simserve.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_writes_outputs_and_prints_table(tmp_path, capsys):
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "r"], capsys)
    assert code == 0, err
    assert "Serving Benchmark Result" in out or "simserve: tiny" in out
    assert "Successful requests:" in out
    for name in ("scenario.yaml", "requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "r" / name).is_file()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["num_requests"] == 60
    assert summary["completed"] + summary["num_rejected"] == 60


def test_tokens_file_gives_exact_itl(tmp_path, capsys):
    import numpy as np
    import pandas as pd
    assert run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path, "--quiet", "--tokens",
                    "--no-report"],
                   capsys)[0] == 0
    tokens = pd.read_csv(tmp_path / "tokens.csv")
    requests = pd.read_csv(tmp_path / "requests.csv")
    summary = json.loads((tmp_path / "summary.json").read_text())
    done = requests[requests.status == "finished"]
    assert len(tokens) == done.num_output_tokens.sum()
    gaps = np.concatenate([np.diff(g.time_s.to_numpy()) for _, g in tokens.groupby("request_id")])
    assert gaps.mean() * 1000 == pytest.approx(summary["mean_itl_ms"], rel=1e-6)
    first = tokens[tokens.token_index == 0].set_index("request_id").time_s
    ttft = (first - done.set_index("request_id").arrival_s).mean() * 1000
    assert ttft == pytest.approx(summary["mean_ttft_ms"], rel=1e-6)


def test_resolved_scenario_reruns_to_identical_outputs(tmp_path, capsys):
    assert run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "a", "--no-report"],
                   capsys)[0] == 0
    # the written scenario.yaml is itself a valid scenario that reproduces the run
    rerun = ["run", tmp_path / "a" / "scenario.yaml", "--out", tmp_path / "b", "--no-report"]
    assert run_cli(rerun, capsys)[0] == 0
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_set_override_changes_the_run(tmp_path, capsys):
    code, _, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path, "--quiet", "--no-report",
                            "--set", "engine.max_num_seqs=2", "--set", "scheduler.policy=sarathi"],
                           capsys)
    assert code == 0, err
    import yaml
    resolved = yaml.safe_load((tmp_path / "scenario.yaml").read_text())
    assert resolved["engine"]["max_num_seqs"] == 2
    assert resolved["scheduler"]["policy"] == "sarathi"


def test_compare_runs_every_variant(tmp_path, capsys):
    src = (DATA / "tiny.yaml").read_text() + "compare:\n  scheduler.policy: [vllm_v0, sarathi]\n"
    path = tmp_path / "cmp.yaml"
    path.write_text(src)
    code, out, err = run_cli(["run", path, "--out", tmp_path / "o", "--quiet", "--no-report"],
                             capsys)
    assert code == 0, err
    assert (tmp_path / "o" / "vllm_v0" / "summary.json").is_file()
    assert (tmp_path / "o" / "sarathi" / "summary.json").is_file()
    assert "vllm_v0" in out and "sarathi" in out
    assert (tmp_path / "o" / "comparison.csv").is_file()
    # (no variant caches prefixes: no hit-rate column)
    assert "hit rate" not in (tmp_path / "o" / "comparison.csv").read_text()


def test_list_and_validate(capsys):
    code, out, _ = run_cli(["list", "policies"], capsys)
    assert code == 0 and all(p in out for p in ("static", "orca", "vllm_v0", "vllm_v1", "sarathi"))
    code, out, _ = run_cli(["list", "models"], capsys)
    assert code == 0 and "Llama-3.1-8B" in out
    code, out, _ = run_cli(["validate", DATA / "tiny.yaml"], capsys)
    assert code == 0 and "64 KV blocks" in out


def scenario_with(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


BASE = (DATA / "tiny.yaml").read_text()


@pytest.mark.parametrize("text, expected", [
    ("name: x\nmodel: [unclosed\n", "bad.yaml:3: invalid YAML"),
    ("", "empty"),
    ("- a list\n", "mapping"),
    (BASE.replace("policy: vllm_v1", "policy: fifo_magic"), "scheduler.policy"),
    (BASE.replace("max_num_seqs: 16", "max_num_seqz: 16"), "engine.max_num_seqz"),
    (BASE.replace("rate: 20", "rate: -1"), "workload.rate"),
    (BASE.replace("max_num_seqs: 16", "max_num_seqs: 0"), "engine.max_num_seqs"),
    (BASE.replace("max_num_seqs: 16", "max_num_seqs: lots"), "engine.max_num_seqs"),
    (BASE.replace("model: tiny-llama-45m", "model: gpt-17"), "model"),
    (BASE.replace("hardware: H100-SXM", "hardware: B9000"), "hardware"),
    (BASE.replace("ttft_ms: 100", "ttft_ms: -5"), "slo.ttft_ms"),
    (BASE.replace("policy: vllm_v1", "policy: vllm_v0").replace(
        "max_num_batched_tokens: 512", "max_num_batched_tokens: 256"),
     "engine.max_num_batched_tokens"),
    (BASE + "surprise: 1\n", "surprise"),
])
def test_bad_scenarios_give_one_clear_error(tmp_path, capsys, text, expected):
    path = scenario_with(tmp_path, text)
    code, out, err = run_cli(["run", path, "--out", tmp_path / "o"], capsys)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_missing_scenario_file(capsys, tmp_path):
    code, _, err = run_cli(["run", tmp_path / "nope.yaml"], capsys)
    assert code == 2 and "nope.yaml" in err and "not found" in err


def test_bad_override_syntax(capsys):
    code, _, err = run_cli(["run", DATA / "tiny.yaml", "--set", "engine.max_num_seqs"], capsys)
    assert code == 2 and "FIELD=VALUE" in err


def test_a_field_set_twice_is_refused(tmp_path, capsys):
    # the last one won, silently, into a folder named after both (a key given twice in YAML
    # is refused)
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--set", "seed=1", "--set", " seed=2",
                              "--out", tmp_path / "o"], capsys)
    assert code == 2 and out == "" and not (tmp_path / "o").exists()
    assert err.strip() == ("error: --set seed: given twice ('seed=1', then ' seed=2'): give "
                           "it once")


def test_trace_with_bad_row_names_file_and_line(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,abc,5\n")
    text = BASE.split("workload:")[0] + (
        "workload:\n  trace: t.csv\n  format: csv\n")
    path = scenario_with(tmp_path, text)
    code, _, err = run_cli(["run", path, "--out", tmp_path / "o"], capsys)
    assert code == 2 and "t.csv:3" in err and "Traceback" not in err


def test_trace_with_missing_column(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens\n0.0,10\n")
    text = BASE.split("workload:")[0] + "workload:\n  trace: t.csv\n  format: csv\n"
    code, _, err = run_cli(["run", scenario_with(tmp_path, text)], capsys)
    assert code == 2 and "output_tokens" in err and "t.csv" in err


def test_console_script_subprocess(tmp_path):
    """The installed entry point, end to end, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "simserve", "run", str(DATA / "tiny.yaml"),
                           "--set", "policy=vllm_v1", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: policy") and "Traceback" not in proc.stderr


def test_stepwise_switch_gives_identical_outputs(tmp_path, capsys):
    """Fast-forward is an optimisation, never a modelling choice: --stepwise must agree."""
    run = ["run", DATA / "tiny.yaml", "--quiet", "--no-report", "--out"]
    assert run_cli([*run, tmp_path / "ff"], capsys)[0] == 0
    assert run_cli([*run, tmp_path / "st", "--stepwise"], capsys)[0] == 0
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "ff" / name).read_bytes() == (tmp_path / "st" / name).read_bytes()


PP_ASYNC = BASE.split("latency:")[0].replace(
    "  max_model_len: 512\n",
    "  max_model_len: 512\n  pipeline_parallel_size: 2\n  async_scheduling: true\n") \
    + "latency:\n  model: roofline\nworkload:" + BASE.split("workload:")[1]


def test_async_pipeline_runs_and_is_refused_for_a_policy_without_an_async_scheduler(
        tmp_path, capsys):
    # async scheduling with PP (vLLM 0.32's V2 model runner, 2026-11-25) runs for vllm_v1;
    # for a policy without vLLM's AsyncScheduler it is one line naming the field, exit 2
    path = scenario_with(tmp_path, PP_ASYNC)
    code, _, err = run_cli(["run", path, "--out", tmp_path / "ok", "--quiet", "--no-report"],
                           capsys)
    assert code == 0, err
    out = tmp_path / "bad"
    code, _, err = run_cli(["run", path, "--set", "scheduler.policy=sarathi", "--out", out],
                           capsys)
    assert code == 2 and "engine.async_scheduling" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("setting, field", [
    ("engine.async_scheduling=maybe", "engine.async_scheduling"),
    ("engine.async_scheduling=1", "engine.async_scheduling"),
    ("engine.pipeline_parallel_size=true", "engine.pipeline_parallel_size"),
    ("engine.pipeline_parallel_size=2.5", "engine.pipeline_parallel_size"),
    ("engine.pipeline_parallel_size=1000000000000000000000000000000",
     "engine.pipeline_parallel_size"),
    ("engine.pipeline_parallel_size=-1", "engine.pipeline_parallel_size"),
    ("latency.frontend_delay_ms=-5", "latency.frontend_delay_ms"),
    ("latency.frontend_delay_ms=abc", "latency.frontend_delay_ms"),
    ("latency.frontend_delay_ms=.nan", "latency.frontend_delay_ms"),
])
def test_garbage_in_the_new_engine_knobs_is_one_error(tmp_path, capsys, setting, field):
    # async scheduling, pipeline parallelism and the front-end delay (2026-11-25): exit 2, one
    # line naming the field, no traceback, nothing written
    out = tmp_path / "r"
    code, _, err = run_cli(["run", DATA / "tiny.yaml", "--set", setting, "--out", out], capsys)
    assert code == 2
    assert field in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("command, work", [
    (["run", DATA / "tiny.yaml"], "simserve.runner.run"),
    (["sweep", "{sweep}", "--workers", "1"], "simserve.plan.sweep.sweep"),
    (["capacity", DATA / "tiny.yaml", "--seeds", "1"], "simserve.plan.capacity.capacity"),
    (["plan", DATA / "plan_small.yaml", "--target-rate", "5", "--workers", "1"],
     "simserve.plan.planner.plan"),
])
@pytest.mark.parametrize("out", ["afile", "afile/sub", "locked/sub"])
def test_an_output_folder_that_cannot_be_made_is_refused_before_the_work(
        tmp_path, capsys, monkeypatch, command, work, out):
    # it was found only when saving: the whole run, sweep, search or plan ran (and printed
    # its table) first, then the results were lost
    def must_not_run(*args, **kwargs):
        raise AssertionError(f"{work} ran before the output folder was checked")
    monkeypatch.setattr(work, must_not_run)
    mkdir = Path.mkdir

    def refused(self, *args, **kwargs):   # a folder the OS will not make (no permission,
        if self.name == "locked":         # a read-only or virtual file system)
            raise PermissionError(13, "Permission denied")
        return mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", refused)
    (tmp_path / "afile").write_text("a file, not a folder\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {DATA / 'tiny.yaml'}\ngrid:\n  seed: [1, 2]\n")
    argv = [str(a).replace("{sweep}", str(sweep)) for a in command]
    code, stdout, err = run_cli([*argv, "--no-report", "--quiet", "--out", tmp_path / out],
                                capsys)
    assert code == 2 and stdout == ""
    assert err.startswith(f"error: {tmp_path / out}: cannot create output directory (")
    assert err.strip().endswith("(Permission denied)") == out.startswith("locked")
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "s.yaml"]


@pytest.mark.parametrize("plan, expect", [
    # `validate` said ok; only `simserve plan` read the section
    ("plan:\n  bogus: 1\n", "error: plan.bogus: unknown field"),
    ("plan:\n  hardware: [H100]\n", "error: plan.hardware[0]: unknown name 'H100'"),
    ("plan:\n  hardware: [H200]\n", "error: plan.prices.H200: no price per GPU-hour"),
    ("plan:\n  tensor_parallel_size: [0]\n", "error: plan.tensor_parallel_size[0]: "),
])
def test_validate_reads_a_scenarios_plan_section(tmp_path, capsys, plan, expect):
    path = tmp_path / "s.yaml"
    path.write_text((DATA / "tiny.yaml").read_text() + plan)
    code, out, err = run_cli(["validate", path], capsys)
    assert code == 2 and out == "" and err.startswith(expect) and err.count("\n") == 1


def test_validate_accepts_a_good_plan_section(capsys):
    code, out, _ = run_cli(["validate", DATA / "plan_small.yaml"], capsys)
    assert code == 0 and out.startswith(f"{DATA / 'plan_small.yaml'}: ok")


@pytest.mark.parametrize("command", [
    ["sweep", "{sweep}", "--workers", "1"],
    ["plan", DATA / "plan_small.yaml", "--target-rate", "5", "--workers", "1"],
])
def test_address_without_the_ray_executor_is_refused(tmp_path, capsys, command):
    # it was ignored: the points ran on local processes
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {DATA / 'tiny.yaml'}\ngrid:\n  seed: [1, 2]\n")
    argv = [str(a).replace("{sweep}", str(sweep)) for a in command]
    code, out, err = run_cli([*argv, "--address", "10.0.0.1:6379", "--no-report", "--quiet",
                              "--out", tmp_path / "o"], capsys)
    assert code == 2 and out == "" and not (tmp_path / "o").exists()
    assert err == "error: --address: names a Ray cluster: give it with --executor ray\n"


def test_the_executor_refuses_an_address_it_would_ignore():
    from simserve.errors import ConfigError
    from simserve.plan.sweep import Executor
    with pytest.raises(ConfigError, match="^address: names a Ray cluster"):
        Executor("local", 1, "10.0.0.1:6379")


def test_the_summary_says_what_was_simulated(tmp_path, capsys):
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "r", "--no-report",
                              "--set", "engine.tensor_parallel_size=2"], capsys)
    assert code == 0, err
    title, what = out.splitlines()[:2]
    assert "simserve: tiny (vllm_v1)" in title
    assert what == "tiny-llama-45m on H100-SXM (TP 2); 60 requests, poisson arrivals at 20 req/s"


def run_compare(tmp_path, capsys, variants: str):
    """tiny.yaml with the ``compare:`` list ``variants`` (YAML lines), run into tmp_path/o."""
    path = tmp_path / "cmp.yaml"
    path.write_text(BASE + "compare:\n" + variants)
    return run_cli(["run", path, "--out", tmp_path / "o", "--quiet", "--no-report"], capsys)


def test_prefix_caching_with_nothing_to_share_is_said_and_the_hit_rate_is_a_column(
        tmp_path, capsys):
    """A compare with prefix caching shows each variant's hit rate (blank where caching is
    off); a workload whose requests name no content gets a warning, one that does gets none."""
    code, out, err = run_compare(tmp_path, capsys,
                                 "  - {label: none}\n"
                                 "  - {label: cached, engine.enable_prefix_caching: true}\n"
                                 "  - {label: shared, engine.enable_prefix_caching: true, "
                                 "workload.prefix_len: 128}\n")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "no request says what its prompt holds" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: cached:"), err
    table = (tmp_path / "o" / "comparison.csv").read_text().splitlines()
    assert table[0].endswith(",prefix cache hit rate")
    rates = {row.split(",")[0]: row.split(",")[-1] for row in table[1:]}
    assert rates["none"] == "" and float(rates["cached"]) == 0 and float(rates["shared"]) > 0.2
    assert "prefix cache hit rate (%)" in out
    summary = json.loads((tmp_path / "o" / "cached" / "summary.json").read_text())
    assert summary["warnings"] == [w.removeprefix("warning: cached: ") for w in warned]
    # a single run says so too
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "p", "--quiet",
                              "--no-report", "--set", "engine.enable_prefix_caching=true"],
                             capsys)
    assert code == 0 and "no request says what its prompt holds" in err


def test_compare_given_a_scenario_file_says_to_run_it(capsys):
    code, out, err = run_cli(["compare", ROOT / "scenarios" / "compare_policies.yaml"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "is a scenario file" in err and "simserve run" in err


def test_another_policys_knob_is_named_with_its_policy(tmp_path, capsys):
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "o",
                              "--set", "scheduler.waiting_served_ratio=1.2"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err == ("error: scheduler.waiting_served_ratio: a knob of policy tgi, not of "
                   "vllm_v1 (scheduler.policy: tgi to use it)\n")
    assert not (tmp_path / "o").exists()
    # vLLM's own scheduler's priority knob: the simulated priority policy is named
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "o",
                              "--set", "scheduler.scheduling_policy=priority"], capsys)
    assert code == 2 and "scheduler.policy: priority" in err and err.count("\n") == 1
    # a misspelt knob is still an unknown field
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "o",
                              "--set", "scheduler.waiting_served_rato=1.2"], capsys)
    assert code == 2 and "unknown field" in err


def test_requests_with_empty_hash_ids_name_no_content():
    from simserve.runner import _no_content
    from simserve.workload.spec import RequestSpec, SpecColumns
    assert _no_content([RequestSpec(0, 0.0, 10, 2, ()), RequestSpec(1, 0.1, 10, 2, None)])
    assert not _no_content([RequestSpec(0, 0.0, 10, 2, ()), RequestSpec(1, 0.1, 10, 2, (7,))])
    assert _no_content(SpecColumns([0.0], [10], [2], hash_ids=()))
    assert not _no_content(SpecColumns([0.0], [10], [2], hash_ids=(3,)))
    assert not _no_content(SpecColumns([0.0, 1.0], [10, 10], [2, 2],
                                       hash_tables=([0, 1], [(), (5,)])))


def test_a_group_that_caches_prefixes_reports_its_hit_rate(tmp_path, capsys):
    code, out, err = run_compare(tmp_path, capsys,
                                 "  - {label: plain}\n"
                                 "  - label: grouped\n    cluster.groups:\n"
                                 "      - {name: a, replicas: 1, "
                                 "engine: {enable_prefix_caching: true}}\n")
    assert code == 0, err
    summary = json.loads((tmp_path / "o" / "grouped" / "summary.json").read_text())
    assert "prefix_cache_hit_rate" in summary
    assert (tmp_path / "o" / "comparison.csv").read_text().splitlines()[0].endswith(
        ",prefix cache hit rate")


def test_the_summary_line_for_a_closed_loop_all_at_once(tmp_path, capsys):
    code, out, err = run_cli(["run", DATA / "tiny.yaml", "--out", tmp_path / "r", "--no-report",
                              "--set", "workload.rate=.inf", "--set", "workload.max_concurrency=4",
                              "--set", "workload.num_requests=1"], capsys)
    assert code == 0, err
    assert out.splitlines()[1] == ("tiny-llama-45m on H100-SXM; 1 request, all at once, "
                                   "at most 4 in flight")


def test_a_set_of_compare_runs_the_base_alone_or_other_variants():
    # `--set compare=null` was "compare: unknown field (in compare variant 'vllm_v1')": the
    # overrides reached each variant after compare: was split off
    from simserve.config import load_variants
    path = ROOT / "scenarios" / "compare_more_policies.yaml"
    [(label, s)] = load_variants(path, ["compare=null"])
    assert label == "compare_more_policies" and s.policy == "vllm_v1"
    two = load_variants(path, ["compare=[{label: a, scheduler.policy: priority}, "
                               "{label: b, scheduler.policy: tgi}]"])
    assert [(label, s.policy) for label, s in two] == [("a", "priority"), ("b", "tgi")]
    assert len(load_variants(path)) == 10
