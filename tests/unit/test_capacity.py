"""Capacity search on a scenario whose answer is known by hand, plus its errors and CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import simserve
from simserve.plan.capacity import capacity, with_rate
from simserve.cli import main
from simserve.config import parse_scenario
from simserve.errors import ConfigError, SimserveError

DATA = Path(__file__).resolve().parents[1] / "data"

# One request at a time (max_num_seqs 1), every step 10 ms (constant latency model), 32-token
# prompts (one prefill step, which samples the first token) and 10 output tokens: a request
# holds the engine for S = 10 steps × 10 ms = 100 ms, so one replica serves at most 1/S = 10 req/s.
#
# Constant arrivals at rate r, request k arriving at k/r. Below 10 req/s nobody waits:
# TTFT = one step = 10 ms ≤ 55 ms (the limit sits between multiples of 10 ms, so no request
# lands exactly on it), attainment 1. Above it, request k waits k·(S − 1/r), so
# TTFT_k = 10 ms + k·(100 ms − 1000/r ms), and with 50 requests and a 90% target the 45th
# request (k = 44) must still make 55 ms: 44·(100 − 1000/r) ≤ 45 → r ≤ 10.10 req/s.
# The true knee r* = 10.10 is within 1.1% of 1/S = 10.
CONSTANT = {
    "name": "constant",
    "model": "tiny-llama-45m",
    "hardware": "H100-SXM",
    "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 512, "num_gpu_blocks": 64,
               "max_model_len": 512},
    "scheduler": {"policy": "vllm_v1"},
    "latency": {"model": "constant", "step_ms": 10},
    "workload": {"arrival": "constant", "rate": 4, "num_requests": 50,
                 "prompt": {"dist": "fixed", "value": 32},
                 "output": {"dist": "fixed", "value": 10}},
    "slo": {"ttft_ms": 55, "attainment": 0.9},
}
KNEE = 1 / (0.100 - 0.045 / 44)     # 44·(0.1 s − 1/r) ≤ 0.045 s  →  r ≤ 10.103 req/s


def scenario(**changes):
    raw = yaml.safe_load(yaml.safe_dump(CONSTANT))
    for key, value in changes.items():
        section, _, name = key.partition("__")
        raw.setdefault(section, {})[name] = value
    return parse_scenario(raw, name="constant")


def test_the_hand_computed_knee_holds_in_single_runs():
    s = scenario()
    assert simserve.run(with_rate(s, 9.9)).summary["slo_attainment"] == 1.0
    assert simserve.run(with_rate(s, KNEE * 0.999)).summary["slo_attainment"] >= 0.9
    assert simserve.run(with_rate(s, KNEE * 1.01)).summary["slo_attainment"] < 0.9


@pytest.mark.parametrize("tolerance", [0.05, 0.01])
def test_max_rate_is_within_tolerance_of_the_known_answer(tolerance):
    cap = capacity(scenario(), tolerance=tolerance, seeds=2)
    assert cap.max_rate <= KNEE < cap.first_failing_rate
    assert (cap.first_failing_rate - cap.max_rate) / cap.max_rate <= tolerance
    assert abs(cap.max_rate - 10.0) / 10.0 <= tolerance          # 1/S = 10 req/s
    # every probe below 1/S attained everything; the answer held for both seeds
    below = cap.probes[cap.probes["rate"] < 10.0]
    assert (below["slo_attainment"] == 1.0).all()
    at = cap.probes[cap.probes["rate"] == cap.max_rate]
    assert sorted(at["seed"]) == [0, 1] and at["slo_met"].all()
    # fixed lengths and constant arrivals: every seed sees the same run
    assert cap.spread["min"] == cap.spread["max"] >= 0.9
    assert cap.per_gpu_rate == cap.max_rate


def test_fewest_replicas_for_a_target_rate():
    # 25 req/s round-robin over n replicas: each sees a request every n/25 s. n = 3 → 120 ms
    # ≥ S = 100 ms, nobody waits; n = 2 → 80 ms, each replica falls 20 ms behind per request,
    # so only k ≤ 2 of its 25 requests make TTFT = 10 + 20·k ≤ 55 ms: 6/50 good. Answer: 3.
    cap = capacity(scenario(), target_rate=25, seeds=1)
    assert cap.replicas_needed == 3
    reps = cap.probes[cap.probes["phase"] == "replicas"].set_index("replicas")
    assert reps.loc[3, "slo_attainment"] == 1.0
    assert reps.loc[2, "slo_attainment"] == pytest.approx(6 / 50)


def test_a_replica_search_builds_no_request_tables(monkeypatch):
    # a probe reads its arrivals from the run's columns: a DataFrame per probe costs time
    def no_table(self):
        raise AssertionError("a probe built Result.requests")
    monkeypatch.setattr(simserve.Result, "requests", property(no_table))
    assert capacity(scenario(), target_rate=25, seeds=1).replicas_needed == 3


def test_a_target_served_only_by_a_short_probe_says_so():
    # 100 req/s: the 50 requests arrive within 490 ms (longer than one 100 ms request, so the
    # replicas are loaded), round-robin over n replicas, a request every 10·n ms on each. The
    # k-th request of a replica waits k·(100 − 10·n) ms, so it makes TTFT = 10 + k·(100 − 10·n)
    # ≤ 55 ms while k ≤ 45 / (100 − 10·n). n = 9: k ≤ 4, 5 good of each replica's 5 or 6 = 45/50
    # = 90%; n = 8: k ≤ 2, 3 good each = 24/50. Answer 9 replicas, which in steady state serve
    # 9 × ~10 req/s, not 100: the answer of this 50-request transient carries a note
    cap = capacity(scenario(), target_rate=100, seeds=1)
    assert cap.replicas_needed == 9
    reps = cap.probes[cap.probes["phase"] == "replicas"].set_index("replicas")
    assert reps.loc[9, "slo_attainment"] == pytest.approx(45 / 50)
    assert reps.loc[8, "slo_attainment"] == pytest.approx(24 / 50)
    note = ("9 replica(s) meet the SLO at 100 req/s, more than 9 x the "
            f"{cap.first_failing_rate:.3g} req/s one replica misses at: a probe too short")
    assert any(n.startswith(note) for n in cap.notes), cap.notes
    assert "raise workload.num_requests" in cap.table()
    # within the linear bound (3 replicas x ~10.2 req/s >= 25 req/s): no such note
    assert not any("too short" in n for n in capacity(scenario(), target_rate=25,
                                                       seeds=1).notes)


def test_a_target_whose_probe_is_one_burst_is_refused():
    # 1000 req/s: the 50 requests arrive within 49 ms, before the first 100 ms request ends.
    # Each of n replicas gets one or two, n ms apart; only the first of each makes TTFT ≤ 55 ms
    # until n ≥ 55, so 45 replicas pass (45/50 = 90%). That number answered "45 replicas" (with
    # a note), though no replica was ever loaded; a 10 req/s engine needs ~100 at 1000 req/s.
    # Outlasting one request takes (n − 1) / 1000 s > 0.1 s: n ≥ 101
    with pytest.raises(ConfigError, match=r"^target_rate: 1000 req/s is one burst for a probe "
                                          r"of 50 requests: they arrive within 49 ms, less than "
                                          r"the 100 ms the median request lasted on 45 "
                                          r"replica\(s\).* at least 101, "):
        capacity(scenario(), target_rate=1000, seeds=1)
    # with 101 requests it is a load (a transient one): an answer, with the note
    cap = capacity(scenario(workload__num_requests=101), target_rate=1000, seeds=1)
    assert cap.replicas_needed is not None and any("too short" in n for n in cap.notes)


def test_cli_a_target_no_run_can_probe_is_one_line_and_exit_2(tmp_path, capsys):
    # 30 requests at 1e300 req/s answered "8 replicas" plus a note
    raw = {**CONSTANT, "workload": {**CONSTANT["workload"], "num_requests": 30}}
    code = main(["capacity", str(write(tmp_path, raw)), "--target-rate", "1e300", "--quiet",
                 "--no-report", "--seeds", "1", "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: --target-rate: 1e+300 req/s is one burst for a probe of 30 "
                          "requests: ")
    assert err.endswith("; outlasting one request at this rate takes over 10,000,000 "
                        "requests, a run's most: give a lower target (one replica serves "
                        "9.93 req/s)\n"), err
    assert "replicas for" not in out
    assert not (tmp_path / "o").exists()


def test_per_gpu_rate_divides_by_replicas_and_tensor_parallel():
    s = scenario(cluster__replicas=2, engine__tensor_parallel_size=2)
    cap = capacity(s, tolerance=0.05, seeds=1)
    assert cap.gpus == 4
    assert cap.per_gpu_rate == pytest.approx(cap.max_rate / 4)
    assert abs(cap.max_rate - 2 * KNEE) / (2 * KNEE) <= 0.05


def test_random_seeds_report_their_spread_and_take_the_minimum():
    s = parse_scenario(yaml.safe_load((DATA / "tiny.yaml").read_text()), DATA, "tiny")
    cap = capacity(s.replace(slo=dataclasses.replace(s.slo, attainment=0.8)), seeds=3,
                   tolerance=0.1)
    at = cap.probes[cap.probes["rate"] == cap.max_rate]
    assert len(at) == 3 and (at["slo_attainment"] >= 0.8).all()
    assert cap.spread["min"] == at["slo_attainment"].min()
    assert cap.spread["min"] <= cap.spread["mean"] <= cap.spread["max"]
    # a failing probe stops at its first missing seed
    fails = cap.probes[~cap.probes["slo_met"]]
    assert fails.groupby("rate").size().max() == 1
    assert "min over 3 seeds" in cap.table()


def test_duration_workloads_get_a_fixed_request_count():
    s = scenario(workload__duration=10, workload__num_requests=None)
    cap = capacity(s, seeds=1, tolerance=0.1)
    assert (cap.probes["num_requests"] == 40).all()          # 4 req/s × 10 s
    assert any("num_requests 40" in note for note in cap.notes)


def test_holding_the_duration_sends_more_requests_at_higher_rates():
    """hold="duration": every probe runs the workload's 50 s of arrivals at its own rate (the
    constant arrivals k / r with k / r < 50 s: about 50·r requests), so the knee is the one of
    ~500 requests: the 451st (k = 450) must make 55 ms, 450·(100 − 1000/r) ≤ 45 ms →
    r ≤ 1000 / 99.9 = 10.010 req/s (50 requests held fixed: 10.103)."""
    s = scenario(workload__duration=50, workload__num_requests=None)
    cap = capacity(s, seeds=1, tolerance=0.01, hold="duration")
    n, rate = cap.probes["num_requests"], cap.probes["rate"]
    assert ((n - 50 * rate).abs() <= 1).all() and n.nunique() > 1
    knee = 1000 / 99.9
    assert knee / 1.01 <= cap.max_rate <= knee < cap.first_failing_rate
    assert any("50 s of arrivals" in note for note in cap.notes)
    assert cap.to_dict()["hold"] == "duration" and "hold" not in capacity(
        s, seeds=1, tolerance=0.1).to_dict()


def test_holding_the_duration_needs_one():
    with pytest.raises(ConfigError, match=r"^workload\.duration: holding the duration"):
        capacity(scenario(), hold="duration")
    # a target rate whose timed probe would exceed the request limit: refused at once
    timed = scenario(workload__duration=50, workload__num_requests=None)
    with pytest.raises(ConfigError, match=r"^target_rate: 1e\+06 req/s for workload\.duration "
                                          r"50 s is over 10,000,000 requests"):
        capacity(timed, hold="duration", target_rate=1e6)
    with pytest.raises(ConfigError, match="^hold: must be one of requests, duration"):
        capacity(scenario(), hold="time")


@pytest.mark.parametrize("changes, message", [
    ({"slo": {}}, "slo: capacity planning needs an SLO"),
    ({"workload": {"arrival": "burst", "num_requests": 5, "prompt": {"dist": "fixed", "value": 8},
                   "output": {"dist": "fixed", "value": 4}}},
     "arrival: burst and rate: inf have none"),
])
def test_scenarios_that_cannot_be_searched(changes, message):
    raw = {**yaml.safe_load(yaml.safe_dump(CONSTANT)), **changes}
    with pytest.raises(ConfigError, match=message):
        capacity(parse_scenario(raw))


def test_an_unreachable_slo_and_one_that_never_binds_are_clear_errors():
    # TTFT ≥ one 10 ms step for every request: a 5 ms limit cannot be met at any rate
    with pytest.raises(SimserveError, match="below the target even at"):
        capacity(scenario(slo__ttft_ms=5))
    # 3 requests that each fit the 10 s limit even when they all queue: no rate breaks it
    with pytest.raises(SimserveError, match="still meets the target"):
        capacity(scenario(slo__ttft_ms=10_000, workload__num_requests=3))


@pytest.mark.parametrize("kwargs, message", [
    ({"tolerance": 0}, "tolerance: must be in"), ({"seeds": 0}, "seeds: must be >= 1"),
    ({"target_rate": -1}, "target_rate: must be > 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        capacity(scenario(), **kwargs)


def test_numpy_arguments_are_the_numbers_they_hold():
    # seeds=np.int64(1) was "seeds: expected an integer, got int64 np.int64(1)"
    cap = capacity(scenario(), target_rate=np.int64(25), seeds=np.int64(1),
                   tolerance=np.float32(0.25), max_replicas=np.int64(8))
    same = capacity(scenario(), target_rate=25, seeds=1, tolerance=0.25, max_replicas=8)
    assert cap.to_dict() == same.to_dict() and cap.replicas_needed == 3
    assert type(cap.target_rate) is int and json.dumps(cap.to_dict())
    with pytest.raises(ConfigError, match=r"^seeds: expected an integer, got bool True"):
        capacity(scenario(), seeds=np.bool_(True))
    with pytest.raises(ConfigError, match=r"^tolerance: expected a number, got NoneType None"):
        capacity(scenario(), tolerance=None)


def test_a_log_that_is_not_callable_is_refused():
    # was TypeError: 'str' object is not callable, at the first probe
    with pytest.raises(ConfigError, match=r"^log: expected a function taking each line"):
        capacity(scenario(), seeds=1, log="x")


QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def test_a_max_rate_passed_only_by_one_burst_is_refused_or_noted():
    # 100 requests of the quickstart pass 40 req/s (and 300 of them only ~18 req/s): there the
    # 100 arrive within 2.5 s, before the median request (3.1 s) ends, so no queue ever built.
    # The answer was max_rate 40 with no note; alone it is refused, as a burst replica count is
    hundred = ["workload.num_requests=100"]
    with pytest.raises(ConfigError, match=r"^workload\.num_requests: 40 req/s, the highest "
                                          r"rate found to meet the SLO, is one burst for a probe "
                                          r"of 100 requests: .* at least \d+, "):
        capacity(QUICKSTART, overrides=hundred, seeds=1, tolerance=0.2)
    # with a target, the replica count is the answer (checked by its own probes at 30 req/s,
    # a load): the max rate stands, flagged and noted
    cap = capacity(QUICKSTART, overrides=hundred, seeds=1, tolerance=0.2, target_rate=30)
    assert cap.max_rate == 40 and cap.replicas_needed == 1 and cap.burst_max_rate
    assert cap.to_dict()["burst_max_rate"] is True
    assert [n for n in cap.notes if n.startswith("max rate: 40 req/s, the highest rate found")]
    assert "bounded by the probe size" in cap.table()
    # a probe that outlasts its requests is an answer, unflagged
    cap = capacity(QUICKSTART, overrides=["workload.num_requests=300"], seeds=1, tolerance=0.2)
    assert cap.max_rate < 20 and not cap.burst_max_rate and "burst_max_rate" not in cap.to_dict()


def test_python_api_is_the_module_call():
    assert simserve.capacity is capacity
    cap = simserve.capacity(scenario(), seeds=1, tolerance=0.1)
    assert type(cap) is simserve.CapacityResult
    # the arguments reach the search: the hand-computed knee, bracketed within 10 %
    assert cap.max_rate <= KNEE < cap.first_failing_rate
    assert (cap.first_failing_rate - cap.max_rate) / cap.max_rate <= 0.1
    assert cap.seeds == [0] and cap.tolerance == 0.1


# --- command line ------------------------------------------------------------------------------

def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_cli_capacity_holds_the_duration(tmp_path, capsys):
    raw = yaml.safe_load(yaml.safe_dump(CONSTANT))
    raw["workload"].pop("num_requests")
    raw["workload"]["duration"] = 20
    code = main(["capacity", str(write(tmp_path, raw)), "--hold", "duration", "--seeds", "1",
                 "--quiet", "--no-report", "--out", str(tmp_path / "cap")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "note: every probe: 20 s of arrivals at its rate (hold: duration)" in out
    answer = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert answer["hold"] == "duration"


def test_cli_capacity_prints_answer_and_writes_results(tmp_path, capsys):
    code = main(["capacity", str(write(tmp_path, CONSTANT)), "--target-rate", "25",
                 "--seeds", "1", "--out", str(tmp_path / "cap")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "max rate:" in out
    assert "replicas for 25 req/s: 3 replica(s)" in out
    assert "bracket" in err                                   # one line per probe
    answer = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert answer["replicas_needed"] == 3 and answer["max_rate"] <= KNEE
    assert (tmp_path / "cap" / "probes.csv").is_file()
    assert (tmp_path / "cap" / "report.html").is_file()


def test_cli_capacity_into_a_log_writes_whole_lines_no_carriage_returns(tmp_path, capsys,
                                                                        monkeypatch):
    # stderr is not a terminal here (capsys): the bar may write one line per LOG_INTERVAL_S
    # and its final count, never a \r redraw, not even around each probe's line
    from simserve import progress
    monkeypatch.setattr(progress, "DELAY_S", 0)        # shown at once (normally after 1 s)
    code = main(["capacity", str(write(tmp_path, CONSTANT)), "--seeds", "1", "--no-report",
                 "--out", str(tmp_path / "cap")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "\r" not in err
    lines = err.splitlines()
    probes = [line for line in lines if "bracket" in line]
    bars = [line for line in lines if line.startswith("capacity:")]
    assert len(probes) >= 3 and len(bars) == 1      # the search took well under 30 s


def test_a_log_bar_writes_at_most_one_line_per_interval(monkeypatch):
    import io

    import tqdm.std

    from simserve import progress
    clock = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])     # tqdm's clock, not the world's
    log = io.StringIO()
    bar = progress.bar(100, "x", "req", stream=log)
    for _ in range(100):            # one update a second for 100 s: lines at 30, 60 and 90 s
        clock[0] += 1
        bar.update(1)
        bar.refresh()               # as a line printed beside the bar would force
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.count("\n") == 4          # 30, 60, 90 s and the end
    assert text.splitlines()[0].startswith("x:  30%")
    assert text.endswith("| 100/100 [01:40<00:00,  1.00req/s]\n")


@pytest.mark.parametrize("raw, args, message", [
    ({**CONSTANT, "slo": {}}, [], "error: slo: capacity planning needs an SLO"),
    (CONSTANT, ["--tolerance", "2"], "error: --tolerance: must be in [0.001, 1), got 2"),
    (CONSTANT, ["--set", "workload.rat=3"], "error: workload.rat: unknown field"),
    (CONSTANT, ["--hold", "duration"], "error: workload.duration: holding the duration"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, raw, args, message):
    code = main(["capacity", str(write(tmp_path, raw)), "--quiet", "--no-report",
                 "--out", str(tmp_path / "o"), *args])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_bad_hold_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["capacity", str(write(tmp_path, CONSTANT)), "--hold", "../x", "--quiet",
              "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: simserve capacity: argument --hold: invalid choice")
    assert not (tmp_path / "o").exists()


def test_cli_overrides_get_their_own_default_folder_and_no_report_clears_the_old_one(
        tmp_path, capsys, monkeypatch):
    """issue #33 item 1: `capacity --set` never lands in the folder of the search without
    overrides, and a --no-report rerun into a folder does not leave the earlier search's
    report.html beside its own capacity.json."""
    path = write(tmp_path, CONSTANT)
    monkeypatch.chdir(tmp_path)
    assert main(["capacity", str(path), "--quiet", "--seeds", "1"]) == 0
    plain = tmp_path / "runs" / "s-capacity"
    assert (plain / "report.html").is_file() and any((plain / "figures").iterdir())
    before = (plain / "capacity.json").read_text()
    assert main(["capacity", str(path), "--quiet", "--seeds", "1", "--no-report",
                 "--set", "slo.ttft_ms=35"]) == 0
    assert (plain / "capacity.json").read_text() == before      # untouched
    other = tmp_path / "runs" / "s-capacity+slo.ttft_ms=35"
    assert json.loads((other / "capacity.json").read_text())["slo"]["ttft_ms"] == 35
    capsys.readouterr()
    # the same search rerun without a report into the first folder: its report goes
    assert main(["capacity", str(path), "--quiet", "--seeds", "1", "--no-report",
                 "--out", str(plain)]) == 0
    assert "removed the earlier report" in capsys.readouterr().err
    assert not (plain / "report.html").exists() and not (plain / "figures").exists()


def test_cli_trace_with_time_scale_asks_for_both_changes_at_once(tmp_path, capsys):
    """issue #33 item 4: the shipped Azure trace scenario sets time_scale; the first error says
    both what to add (a rate) and what to drop (time_scale), and the changes it names work."""
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "trace_azure.yaml"
    code = main(["capacity", str(scenario), "--quiet", "--no-report", "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "give workload.rate" in err and "drop workload.time_scale" in err
    assert not (tmp_path / "o").exists()
    code = main(["capacity", str(scenario), "--quiet", "--no-report", "--seeds", "1",
                 "--set", "workload.time_scale=null", "--set", "workload.rate=5",
                 "--out", str(tmp_path / "o")])
    assert code == 0, capsys.readouterr().err


def test_cli_says_when_it_replaces_another_search_in_the_folder(tmp_path, capsys):
    """A search with other options (here --target-rate) into a folder holding another search's
    answer says so, naming what differs, rather than replacing it silently."""
    path, out = write(tmp_path, CONSTANT), tmp_path / "o"
    args = ["capacity", str(path), "--quiet", "--seeds", "1", "--no-report", "--out", str(out)]
    assert main(args) == 0
    assert "replacing" not in capsys.readouterr().err
    assert main(args) == 0                           # the same search again: nothing to say
    assert "replacing" not in capsys.readouterr().err
    assert main([*args, "--target-rate", "15"]) == 0
    err = capsys.readouterr().err
    assert "replacing another capacity search" in err and "target_rate" in err


def test_holding_a_duration_shorter_than_a_request_is_refused():
    # 1 ms of arrivals: every probe is one burst that ends before a queue builds; the search
    # answered "max rate 1.21e+05 req/s" for Llama-3.1-8B on one H100. The requests here take
    # at least one 10 ms step (module docstring's constant model), so no rate can be held.
    s = scenario(workload__duration=0.001, workload__num_requests=None)
    with pytest.raises(ConfigError, match=r"^workload\.duration: 0\.001 s is too short to hold "
                                          r"a request: at 4 req/s the median request lasted "):
        capacity(s, seeds=1, hold="duration")


def test_target_rate_on_disaggregated_cluster_grows_whole_copies():
    # before: with_rate set cluster.replicas on a cluster of groups, which refuses it
    raw = yaml.safe_load((Path(__file__).parents[1] / "data" / "plan_small.yaml").read_text())
    raw.pop("plan")
    raw["cluster"] = {"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                                 {"name": "d", "role": "decode", "replicas": 2}],
                      "kv_transfer": {"link": "nvlink"}}
    s = parse_scenario(raw)
    r = capacity(s, target_rate=60, seeds=1, tolerance=0.2)
    assert r.replicas_needed is not None and r.replicas_needed % 3 == 0
    runs = r.probes[r.probes["phase"] == "replicas"]
    assert set(runs["replicas"] % 3) == {0}
    scaled = with_rate(s, 60, replicas=6)
    assert [g.replicas for g in scaled.cluster.groups] == [2, 4]
    with pytest.raises(ValueError, match="4 replicas are not whole copies of 3"):
        with_rate(s, 60, replicas=4)
