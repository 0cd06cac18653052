"""Workload layer: config parsing, synthetic generation, trace loaders and their errors."""

from __future__ import annotations

import datetime
import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simserve.errors import ConfigError, DataError
from simserve.fields import Fields
from simserve.workload import RequestSpec, WorkloadConfig, build_workload
from simserve.workload.traces import load_trace

# Small samples shipped with the repository (written by scenarios/traces/make_samples.py), so
# every clone runs these tests.
TRACES = Path(__file__).resolve().parents[2] / "scenarios" / "traces"
AZURE = TRACES / "azure_conv_sample.csv"
MOONCAKE = TRACES / "mooncake_prefix_sample.jsonl"
SHAREGPT = TRACES / "sharegpt_lengths_sample.csv"
BURSTGPT_SAMPLE = TRACES / "burstgpt_sample.csv"
CLASSES = TRACES / "classes_sample.csv"


def parse(raw: dict) -> WorkloadConfig:
    return WorkloadConfig.from_fields(Fields(raw, "workload"))


def synth(seed: int = 0, base_dir: Path = TRACES, **raw) -> list[RequestSpec]:
    raw.setdefault("rate", 4.0)
    raw.setdefault("num_requests", 100)
    raw.setdefault("prompt", {"dist": "fixed", "value": 100})
    raw.setdefault("output", {"dist": "fixed", "value": 10})
    return build_workload(parse({k: v for k, v in raw.items() if v is not None}), seed, base_dir)


def trace(path: Path, fmt: str, **raw) -> list[RequestSpec]:
    return build_workload(parse({"trace": str(path), "format": fmt, **raw}), 0, path.parent)


def arrivals(reqs: list[RequestSpec]) -> np.ndarray:
    return np.array([r.arrival_s for r in reqs])


def prompts(reqs: list[RequestSpec]) -> np.ndarray:
    return np.array([r.num_prompt_tokens for r in reqs])


def outputs(reqs: list[RequestSpec]) -> np.ndarray:
    return np.array([r.num_output_tokens for r in reqs])


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error(exc: type[Exception], fn, *args, **kwargs) -> str:
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --- config ----------------------------------------------------------------------------------

ROUND_TRIP = [
    {"rate": 4, "num_requests": 10, "prompt": {"dist": "fixed", "value": 5},
     "output": {"dist": "uniform", "low": 16, "high": 512}},
    {"arrival": "gamma", "burstiness": 0.5, "rate": 2, "duration": 60,
     "prompt": {"dist": "lognormal", "mean": 1000, "sigma": 0.8, "max": 8192},
     "output": {"dist": "normal", "mean": 200, "std": 50, "min": 4}},
    {"arrival": "burst", "num_requests": 3, "prompt": {"dist": "zipf", "a": 1.2, "max": 100},
     "output": {"dist": "empirical", "path": "x.csv", "column": "n"}},
    {"type": "synthetic", "arrival": "constant", "rate": 1, "num_requests": 5,
     "lengths": {"path": "l.csv", "prompt_column": "p", "output_column": "o"}},
    {"trace": "t.csv", "format": "csv"},
    {"trace": "t.csv", "format": "burstgpt", "rate": 3, "start_s": 10, "end_s": 20,
     "num_requests": 5, "max_prompt_tokens": 100, "max_output_tokens": 50, "model": "GPT-4"},
]


@pytest.mark.parametrize("raw", ROUND_TRIP)
def test_to_dict_round_trips(raw):
    cfg = parse(raw)
    assert parse(cfg.to_dict()) == cfg
    json.dumps(cfg.to_dict())  # plain types only


def test_defaults():
    cfg = parse(ROUND_TRIP[0])
    assert cfg.type == "synthetic"
    assert cfg.arrival.process == "poisson" and cfg.arrival.burstiness == 1.0
    assert cfg.output.min == 1 and cfg.output.max is None
    t = parse({"trace": "t.csv", "format": "azure"})
    assert t.type == "trace" and t.trace.time_scale == 1.0 and t.trace.rate is None


@pytest.mark.parametrize("raw, expected", [
    ({"rate": -1}, "workload.rate: must be > 0, got -1"),
    ({"rate": "fast"}, "workload.rate: expected a number"),
    ({"prompt": {"dist": "pareto"}}, "workload.prompt.dist: unknown value 'pareto'"),
    ({"output": {"dist": "fixed", "value": 3, "sigma": 1}}, "workload.output.sigma: unknown field"),
    ({"colour": "red"}, "workload.colour: unknown field"),
    ({"duration": 10}, "workload.duration: give either num_requests or duration, not both"),
    ({"num_requests": None}, "workload.num_requests: is required"),
    ({"arrival": "burst"}, "workload.rate: does not apply to arrival: burst"),
    ({"burstiness": 2}, "workload.burstiness: only applies to arrival: gamma"),
    ({"arrival": "gamma", "burstiness": 0}, "workload.burstiness: must be >= 0.001, got 0"),
    ({"prompt": {"dist": "zipf", "a": 1.0, "max": 10}}, "workload.prompt.a: must be > 1"),
    ({"prompt": {"dist": "zipf", "a": 2}}, "workload.prompt.max: is required for dist: zipf"),
    ({"prompt": {"dist": "uniform", "low": 10, "high": 5}}, "workload.prompt.high: must be >= 10"),
    ({"prompt": {"dist": "fixed", "value": 5, "min": 10, "max": 3}},
     "workload.prompt.max: must be >= 10"),
    ({"lengths": {"path": "a", "prompt_column": "p", "output_column": "o"}},
     "workload.prompt: give either lengths"),
])
def test_synthetic_config_errors(raw, expected):
    full = {"rate": 4, "num_requests": 10, "prompt": {"dist": "fixed", "value": 5},
            "output": {"dist": "fixed", "value": 5}}
    full.update(raw)
    full = {k: v for k, v in full.items() if v is not None}
    if raw.get("arrival") == "burst":
        full["num_requests"] = 3
    assert expected in error(ConfigError, parse, full)


@pytest.mark.parametrize("raw, expected", [
    # a misspelt required field names the key given and the close match, not "is required"
    ({"num_request": 10}, "workload.num_request: unknown field (did you mean num_requests?)"),
    ({"prompt": {"dis": "fixed", "value": 3}},
     "workload.prompt.dis: unknown field (did you mean dist?)"),
    ({"output": {"dist": "fixed", "vaule": 3}},
     "workload.output.vaule: unknown field (did you mean value?)"),
    # unknown keys found at the end of a section get the close match too
    ({"arival": "poisson"}, "workload.arival: unknown field (did you mean arrival?)"),
])
def test_misspelt_fields_say_did_you_mean(raw, expected):
    full = {"rate": 4, "prompt": {"dist": "fixed", "value": 5},
            "output": {"dist": "fixed", "value": 5}}
    if "num_request" not in raw:
        full["num_requests"] = 10
    full.update(raw)
    assert error(ConfigError, parse, full) == expected


def test_burst_needs_num_requests():
    msg = error(ConfigError, parse, {"arrival": "burst", "duration": 5,
                                     "prompt": {"dist": "fixed", "value": 1},
                                     "output": {"dist": "fixed", "value": 1}})
    assert msg.startswith("workload.num_requests: is required for arrival: burst")


@pytest.mark.parametrize("raw, expected", [
    ({"format": "sharegpt"}, "workload.format: unknown value 'sharegpt'; expected one of: "
                             "azure, mooncake, burstgpt, csv"),
    ({"time_scale": 2, "rate": 3}, "workload.rate: give either time_scale or rate, not both"),
    ({"start_s": 10, "end_s": 5}, "workload.end_s: must be > start_s (10), got 5"),
    ({"model": "ChatGPT"}, "workload.model: only applies to format: burstgpt"),
    ({"prompt": {"dist": "fixed", "value": 1}}, "workload.prompt: unknown field"),
    ({"type": "synthetic"}, "workload.trace: unknown field"),
])
def test_trace_config_errors(raw, expected):
    full = {"trace": "t.csv", "format": "csv", **raw}
    if raw.get("type") == "synthetic":
        full.update(rate=1, num_requests=1, prompt={"dist": "fixed", "value": 1},
                    output={"dist": "fixed", "value": 1})
    assert expected in error(ConfigError, parse, full)


# --- arrivals --------------------------------------------------------------------------------

def test_poisson_mean_gap():
    gaps = np.diff(arrivals(synth(rate=4.0, num_requests=20000)))
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_cv(burstiness):
    gaps = np.diff(arrivals(synth(arrival="gamma", burstiness=burstiness, rate=4.0,
                                  num_requests=20000)))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_gamma_burstiness_one_is_poisson():
    np.testing.assert_allclose(arrivals(synth(arrival="gamma", burstiness=1.0, seed=5)),
                               arrivals(synth(seed=5)))


def test_constant_exact_spacing():
    t = arrivals(synth(arrival="constant", rate=8.0, num_requests=50))
    assert t[0] == 0.0
    np.testing.assert_array_equal(t, np.arange(50) / 8.0)


def test_burst_all_at_zero():
    reqs = synth(arrival="burst", rate=None, num_requests=7)
    assert len(reqs) == 7 and all(r.arrival_s == 0.0 for r in reqs)
    assert [r.request_id for r in reqs] == list(range(7))


def test_duration_mode():
    t = arrivals(synth(num_requests=None, duration=100.0, rate=5.0))
    assert t[0] == 0.0 and t.max() < 100.0 and np.all(np.diff(t) >= 0)
    assert abs(len(t) - 500) < 4 * math.sqrt(500)  # Poisson count, 4 sigma
    # constant: 0, 0.25, ..., 9.75 are < 10; 10.0 is not
    assert len(synth(arrival="constant", num_requests=None, duration=10, rate=4)) == 40


def test_ids_follow_arrival_order():
    reqs = synth(arrival="gamma", burstiness=0.2, num_requests=500)
    assert [r.request_id for r in reqs] == list(range(500))
    assert np.all(np.diff(arrivals(reqs)) >= 0)


def test_column_specs_are_the_specs_their_values_make():
    from simserve.workload.spec import SpecColumns
    cols = SpecColumns([0.0, 1.5], [10, 20], [3, 4], klass=[1, 0],
                       classes=[(0, "chat"), (2, "batch")],
                       hash_tables=([0, 1], [(7,), (7, 8)]))
    made = [RequestSpec(0, 0.0, 10, 3, (7,), 2, "batch"),
            RequestSpec(1, 1.5, 20, 4, (7, 8), 0, "chat")]
    assert list(cols) == made and [hash(s) for s in cols] == [hash(s) for s in made]
    assert cols[-1] == made[1] and cols[0:1] == made[:1]
    with pytest.raises(AttributeError):        # frozen, as RequestSpec(...) makes them
        cols[0].num_prompt_tokens = 5          # type: ignore[misc]
    # the values are checked when the columns are made (the specs are then made unchecked)
    for arrival, prompt, output, why in (
            ([0.0, 1.0], [10, 0], [3, 3], "request 1: num_prompt_tokens"),
            ([0.0, 1.0], [10, 10], [0, 3], "request 0: num_output_tokens"),
            ([-1.0, 1.0], [10, 10], [3, 3], "request 0: arrival_s")):
        with pytest.raises(ValueError, match=why):
            SpecColumns(arrival, prompt, output)


# --- lengths ---------------------------------------------------------------------------------

def lengths(dist: dict, n: int = 20000) -> np.ndarray:
    return prompts(synth(num_requests=n, prompt=dist))


def test_fixed_and_uniform():
    assert set(lengths({"dist": "fixed", "value": 37}, 100)) == {37}
    x = lengths({"dist": "uniform", "low": 16, "high": 20})
    assert set(x) == {16, 17, 18, 19, 20}  # inclusive at both ends
    assert x.mean() == pytest.approx(18, rel=0.01)


def test_normal_mean_and_clipping():
    x = lengths({"dist": "normal", "mean": 300, "std": 50})
    assert x.mean() == pytest.approx(300, rel=0.02)
    y = lengths({"dist": "normal", "mean": 10, "std": 50, "min": 2, "max": 40})
    assert y.min() == 2 and y.max() == 40  # both clips bite


def test_lognormal_mean_is_token_mean():
    x = lengths({"dist": "lognormal", "mean": 1000, "sigma": 0.8}, 50000)
    assert x.mean() == pytest.approx(1000, rel=0.03)
    assert np.median(x) == pytest.approx(1000 * math.exp(-0.8 ** 2 / 2), rel=0.03)
    assert lengths({"dist": "lognormal", "mean": 1000, "sigma": 2, "max": 4000}).max() == 4000


def test_zipf_finite_support():
    x = lengths({"dist": "zipf", "a": 1.5, "max": 50})
    assert x.min() == 1 and x.max() == 50  # whole support reached, nothing beyond it
    k = np.arange(1, 51)
    p1 = 1 / np.sum(k ** -1.5)
    assert np.mean(x == 1) == pytest.approx(p1, rel=0.05)


def test_empirical_values_come_from_column():
    x = lengths({"dist": "empirical", "path": SHAREGPT.name, "column": "num_decode_tokens"}, 5000)
    column = set(pd.read_csv(SHAREGPT)["num_decode_tokens"])
    assert set(x) <= column and len(set(x)) > 100


def test_joint_lengths_are_real_rows():
    reqs = synth(num_requests=2000, prompt=None, output=None, lengths={
        "path": str(SHAREGPT), "prompt_column": "num_prefill_tokens",
        "output_column": "num_decode_tokens"})
    rows = set(pd.read_csv(SHAREGPT)[["num_prefill_tokens", "num_decode_tokens"]]
               .itertuples(index=False, name=None))
    pairs = set(zip(prompts(reqs).tolist(), outputs(reqs).tolist()))
    assert pairs <= rows and len(pairs) > 1000


def test_missing_lengths_file_names_field(tmp_path):
    msg = error(ConfigError, synth, base_dir=tmp_path,
                output={"dist": "empirical", "path": "nope.csv", "column": "n"})
    assert msg.startswith("workload.output.path: file not found") and "nope.csv" in msg


def test_bad_lengths_file_row(tmp_path):
    write(tmp_path, "l.csv", "n\n5\n0\n")
    msg = error(DataError, synth, base_dir=tmp_path,
                output={"dist": "empirical", "path": "l.csv", "column": "n"})
    assert "l.csv:3" in msg and "'n' must be >= 1, got 0" in msg


# --- randomness ------------------------------------------------------------------------------

RICH = {"arrival": "gamma", "burstiness": 0.5, "num_requests": 300,
        "prompt": {"dist": "lognormal", "mean": 500, "sigma": 1.0},
        "output": {"dist": "uniform", "low": 1, "high": 300}}


def test_same_seed_same_workload():
    assert synth(seed=42, **RICH) == synth(seed=42, **RICH)
    assert synth(seed=42, **RICH) != synth(seed=43, **RICH)


def test_streams_are_independent():
    base = synth(seed=7, **RICH)
    other_output = synth(seed=7, **{**RICH, "output": {"dist": "zipf", "a": 2, "max": 99}})
    np.testing.assert_array_equal(arrivals(base), arrivals(other_output))
    np.testing.assert_array_equal(prompts(base), prompts(other_output))
    assert not np.array_equal(outputs(base), outputs(other_output))
    other_prompt = synth(seed=7, **{**RICH, "prompt": {"dist": "normal", "mean": 50, "std": 5}})
    np.testing.assert_array_equal(arrivals(base), arrivals(other_prompt))
    np.testing.assert_array_equal(outputs(base), outputs(other_prompt))


# --- shared trace samples --------------------------------------------------------------------

def _azure_seconds(stamp: str) -> Decimal:
    whole, _, frac = stamp.partition(".")
    t = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").timestamp()
    return Decimal(int(t)) + Decimal("0." + (frac or "0"))


def test_azure_trace():
    reqs = trace(AZURE, "azure")
    rows = AZURE.read_text().splitlines()[1:]
    assert len(reqs) == len(rows) == 500
    assert reqs[0].arrival_s == 0.0
    first = rows[0].split(",")
    assert (reqs[0].num_prompt_tokens, reqs[0].num_output_tokens) == (int(first[1]),
                                                                      int(first[2]))
    # every one of the 7 fractional digits survives (finer than datetime's microseconds)
    t = [_azure_seconds(r.split(",")[0]) for r in rows]
    assert any(str(x)[-1] != "0" for x in t[:20])
    for k in range(1, 20):
        assert reqs[k].arrival_s == pytest.approx(float(t[k] - t[0]), abs=1e-9)
    assert np.all(np.diff(arrivals(reqs)) >= 0)
    assert [r.request_id for r in reqs] == list(range(len(reqs)))


def test_mooncake_trace():
    reqs = trace(MOONCAKE, "mooncake")
    lines = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    assert len(reqs) == len(lines) == 410
    t0 = lines[0]["timestamp"]
    assert [r.arrival_s for r in reqs[:10]] == pytest.approx(
        [(x["timestamp"] - t0) / 1000 for x in lines[:10]])          # milliseconds
    assert all(isinstance(r.hash_ids, tuple) for r in reqs)
    assert all(len(r.hash_ids) == math.ceil(r.num_prompt_tokens / 512) for r in reqs)
    assert reqs[0].hash_ids == tuple(lines[0]["hash_ids"])


def test_window_cap_and_rate_on_azure():
    full = arrivals(trace(AZURE, "azure"))
    win = trace(AZURE, "azure", start_s=20, end_s=60)
    expected = full[(full >= 20) & (full < 60)]
    assert len(win) == len(expected) > 100 and win[0].arrival_s == 0.0
    np.testing.assert_allclose(arrivals(win), expected - expected[0], atol=1e-9)
    capped = trace(AZURE, "azure", start_s=20, num_requests=100)
    assert len(capped) == 100
    np.testing.assert_allclose(arrivals(capped), arrivals(win)[:100], atol=1e-9)
    fast = arrivals(trace(AZURE, "azure", end_s=60, rate=20.0))
    assert (len(fast) - 1) / fast[-1] == pytest.approx(20.0, rel=1e-12)


# --- generated trace files -------------------------------------------------------------------

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,100,20,120,Conversation log
6,GPT-4,200,0,200,Conversation log
7.5,ChatGPT,300,0,300,API log
9,GPT-4,400,40,440,API log
12,ChatGPT,500,50,550,Conversation log
"""


def test_burstgpt_skips_failures_and_filters_model(tmp_path):
    p = write(tmp_path, "burst.csv", BURSTGPT)
    cfg = parse({"trace": str(p), "format": "burstgpt"}).trace
    loaded = load_trace(cfg, tmp_path)
    assert loaded.num_skipped == 2
    assert arrivals(loaded.requests).tolist() == [0.0, 4.0, 7.0]
    assert prompts(loaded.requests).tolist() == [100, 400, 500]
    chat = load_trace(parse({"trace": "burst.csv", "format": "burstgpt",
                             "model": "ChatGPT"}).trace, tmp_path)
    assert chat.num_skipped == 1 and prompts(chat.requests).tolist() == [100, 500]
    assert arrivals(chat.requests).tolist() == [0.0, 7.0]
    msg = error(DataError, trace, p, "burstgpt", model="Claude")
    assert "no rows with Model 'Claude'" in msg and "ChatGPT, GPT-4" in msg
    # a run says it dropped them (it was an INFO log line nobody saw)
    import simserve
    r = simserve.run({"name": "b", "model": "Llama-3.1-8B", "hardware": "H100-SXM",
                      "scheduler": {"policy": "vllm_v1"}, "latency": {"model": "roofline"},
                      "workload": {"trace": str(p), "format": "burstgpt"}})
    assert r.summary["num_requests"] == 3
    assert r.warnings[0] == f"{p}: skipped 2 failed requests (zero output tokens: BurstGPT's " \
                            "mark of a failure)" and r.summary["warnings"] == r.warnings


def test_shipped_burstgpt_and_classes_samples_load():
    """The samples of the two formats docs/scenario.md shows: BurstGPT (two models, failed
    rows) and a plain csv with priority and class columns."""
    raw = pd.read_csv(BURSTGPT_SAMPLE)
    failed = int((raw["Response tokens"] == 0).sum())
    loaded = load_trace(parse({"trace": BURSTGPT_SAMPLE.name, "format": "burstgpt"}).trace,
                        TRACES)
    assert failed > 0 and loaded.num_skipped == failed
    assert len(loaded.requests) == len(raw) - failed
    gpt4 = load_trace(parse({"trace": BURSTGPT_SAMPLE.name, "format": "burstgpt",
                             "model": "GPT-4"}).trace, TRACES)
    assert 0 < len(gpt4.requests) < len(loaded.requests)
    assert len(gpt4.requests) + gpt4.num_skipped == int((raw["Model"] == "GPT-4").sum())
    reqs = trace(CLASSES, "csv")
    assert {(r.priority, r.klass) for r in reqs} == {(0, "interactive"), (1, "batch")}
    assert len(reqs) == len(pd.read_csv(CLASSES))


def test_a_json_trace_read_as_csv_says_which_format_it_may_be():
    # it printed a JSON record as the "columns found"
    with pytest.raises(DataError, match=r"missing required column 'TIMESTAMP': the file reads "
                                        r"as JSON, not CSV \(a Mooncake trace is workload\."
                                        r"trace\.format: mooncake"):
        trace(MOONCAKE, "azure")


def test_plain_csv_sorts_stably_and_rescales(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,note\n"
                                 "10,1,1,a\n12,2,2,b\n10,3,3,c\n16,4,4,d\n")
    reqs = trace(p, "csv")
    assert arrivals(reqs).tolist() == [0.0, 0.0, 2.0, 6.0]
    assert prompts(reqs).tolist() == [1, 3, 2, 4]  # ties keep file order
    assert arrivals(trace(p, "csv", time_scale=2.0)).tolist() == [0.0, 0.0, 4.0, 12.0]
    t = arrivals(trace(p, "csv", rate=1.5))
    assert t[-1] == 3 / 1.5  # (n - 1) / last_arrival == rate
    clipped = trace(p, "csv", max_prompt_tokens=2, max_output_tokens=3)
    assert prompts(clipped).tolist() == [1, 2, 2, 2] and outputs(clipped).max() == 3
    # window on the original clock (from the first request at 10 s): [2, 6) keeps t=12 only
    assert prompts(trace(p, "csv", start_s=2, end_s=6)).tolist() == [2]


# --- bad trace files -------------------------------------------------------------------------

def test_trace_file_not_found(tmp_path):
    msg = error(ConfigError, trace, tmp_path / "missing.csv", "csv")
    assert msg.startswith("workload.trace: file not found") and "missing.csv" in msg
    # a folder where a file belongs was "file not found" too, though it is there
    (tmp_path / "traces").mkdir()
    msg = error(ConfigError, trace, tmp_path / "traces", "csv")
    assert msg == f"workload.trace: {tmp_path / 'traces'} is a directory, not a file"


def test_missing_column(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,out\n0,1,1\n")
    msg = error(DataError, trace, p, "csv")
    assert "missing required column 'output_tokens'" in msg
    assert "t.csv" in msg and "columns found: arrival_s, prompt_tokens, out" in msg


@pytest.mark.parametrize("body, line, why", [
    ("0,1,1\n1,x,1\n", 3, "column 'prompt_tokens' is not a number"),
    ("0,1,1\n1,2,1\n2,3,0\n", 4, "column 'output_tokens' must be >= 1, got 0"),
    ("0,1,1\n-1,2,1\n", 3, "column 'arrival_s' must be >= 0, got -1"),
    ("0,1,1\n1,2.5,1\n", 3, "column 'prompt_tokens' must be a whole number, got 2.5"),
    ("0,1,1\n\n\n1,2,\n", 5, "missing value in column 'output_tokens'"),  # blank lines counted
    ("0,1,1\n1,2,3,4\n", 3, "does not have the same number of fields"),
    # an extra field on the first row made pandas read the first column as an index: every
    # column shifted one to the left (arrival_s <- prompt_tokens, ...) and the run went on
    ("1,2,3,4\n0,1,1\n", 2, "does not have the same number of fields"),
    ("0,5,7,9\n1,5,7,9\n", 2, "does not have the same number of fields"),  # every row
])
def test_bad_csv_row_names_file_and_line(tmp_path, body, line, why):
    p = write(tmp_path, "bad.csv", "arrival_s,prompt_tokens,output_tokens\n" + body)
    msg = error(DataError, trace, p, "csv")
    assert f"bad.csv:{line}: " in msg and why in msg


def test_csv_rows_ending_in_a_comma_keep_their_columns(tmp_path):
    # before, pandas read arrival_s as the index: arrivals 5, 6 and prompts of 7 tokens
    p = write(tmp_path, "tc.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,7,\n1,6,7,\n")
    assert [(r.arrival_s, r.num_prompt_tokens, r.num_output_tokens) for r in trace(p, "csv")] == \
        [(0.0, 5, 7), (1.0, 6, 7)]


@pytest.mark.parametrize("header, fmt", [
    ("arrival_s,prompt_tokens,prompt_tokens,output_tokens", "csv"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens", "azure"),
])
def test_csv_header_naming_a_column_twice_is_refused(tmp_path, header, fmt):
    # pandas renames the second to 'prompt_tokens.1' and the first was used, silently
    row = ",".join(["0"] + ["3"] * header.count(","))
    p = write(tmp_path, "dup.csv", f"{header}\n{row}\n")
    msg = error(DataError, trace, p, fmt)
    assert "dup.csv:1: " in msg and "appears twice in the header" in msg


def test_bad_azure_timestamp(tmp_path):
    p = write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                  "2023-11-16 18:15:46.6805900,374,44\n"
                                  "2023-11-16 25:15:50.99,396,109\n")
    msg = error(DataError, trace, p, "azure")
    assert "az.csv:3: bad TIMESTAMP '2023-11-16 25:15:50.99'" in msg


def test_numeric_azure_timestamp_is_quoted_as_written(tmp_path):
    # a column pandas reads as numbers was quoted as "np.int64(5)"
    p = write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,374,44\n")
    msg = error(DataError, trace, p, "azure")
    assert "az.csv:2: bad TIMESTAMP '5'; expected" in msg


@pytest.mark.parametrize("line2, why", [
    ('{"timestamp": 5, "input_length": 10, "output_length": 2', "not valid JSON"),
    ('{"timestamp": 5, "input_length": 10}', "missing required field 'output_length'"),
    ('{"timestamp": 5, "input_length": "ten", "output_length": 2}',
     "field 'input_length' must be a JSON number, got the string 'ten'"),
    # a number written as a string was read as that number (issue #33)
    ('{"timestamp": "1000", "input_length": 10, "output_length": 2}',
     "field 'timestamp' must be a JSON number, got the string '1000'"),
    ('{"timestamp": 5, "input_length": 10, "output_length": "2"}',
     "field 'output_length' must be a JSON number"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, "a"]}',
     "hash_ids must be a list of integers"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1e2]}',
     "hash_ids must be a list of integers within int64"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, '
     '"hash_ids": [9223372036854775808]}', "hash_ids must be a list of integers within int64"),
    # json keeps the last of two equal keys silently: which length was meant is a guess
    ('{"timestamp": 5, "input_length": 10, "input_length": 20, "output_length": 2}',
     "field 'input_length' appears twice in the line's object"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "x": {"a": 1, "a": 2}}',
     "field 'a' appears twice"),
    # one id per 512 prompt tokens: 2 ids name a block past a 10-token prompt's end
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}',
     "hash_ids has 2 entries, more than the 1 blocks of 512 tokens that input_length 10 fills"),
    ('{"timestamp": 5, "input_length": 1025, "output_length": 2, "hash_ids": [1, 2, 3, 4]}',
     "more than the 3 blocks of 512 tokens that input_length 1,025 fills"),
])
def test_bad_mooncake_line(tmp_path, line2, why):
    p = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                                   + line2 + "\n")
    msg = error(DataError, trace, p, "mooncake")
    assert "m.jsonl:2: " in msg and why in msg


@pytest.mark.parametrize("field", ["timestamp", "input_length", "output_length", "priority"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_mooncake_number_that_is_not_finite_is_named(tmp_path, capsys, field, value):
    # Python's json reads NaN; a NaN timestamp was reported as a "missing value"
    from simserve.cli import main
    row = {"timestamp": "5", "input_length": "10", "output_length": "2", "priority": "1"}
    row[field] = value
    write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                               + "{" + ", ".join(f'"{k}": {v}' for k, v in row.items()) + "}\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: tiny-llama-45m\nhardware: H100-SXM\n"
                        "workload: {trace: m.jsonl, format: mooncake}\n")
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'm.jsonl'}:2: field {field!r} is not a finite number: " \
                  f"{value}\n", err


def test_a_mooncake_file_with_a_byte_order_mark_is_read(tmp_path):
    # the CSV formats (pandas) skip a UTF-8 BOM; the JSONL reader called line 1 "not valid JSON"
    body = ('{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
            '{"timestamp": 500, "input_length": 20, "output_length": 3}\n')
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + body.encode())
    reqs = trace(p, "mooncake")
    assert [(r.arrival_s, r.num_prompt_tokens, r.num_output_tokens) for r in reqs] == \
        [(0.0, 10, 2), (0.5, 20, 3)]


def test_empty_trace_and_empty_window(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n")
    assert "the trace has no requests" in error(DataError, trace, p, "csv")
    assert "the file is empty" in error(DataError, trace, write(tmp_path, "e.csv", ""), "csv")
    q = write(tmp_path, "w.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n5,1,1\n")
    msg = error(DataError, trace, q, "csv", start_s=6)
    assert "no requests in the window" in msg and "w.csv" in msg


def test_rate_needs_spread_arrivals(tmp_path):
    p = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens\n3,1,1\n3,2,2\n")
    assert error(ConfigError, trace, p, "csv", rate=2.0).startswith("workload.rate: cannot")
