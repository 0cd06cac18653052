"""What `vllm bench serve` users expect, with vLLM's names: `rate: inf`, `max_concurrency`
(closed-loop clients), a ShareGPT loader, a shared synthetic prefix (`prefix_len`, vLLM's
--random-prefix-len) and configurable `metric_percentiles`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import simserve
from simserve.cli import main
from simserve.config import load_scenario
from simserve.errors import ConfigError, DataError

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny.yaml"
SAMPLES = Path(__file__).resolve().parents[2] / "scenarios" / "traces"


def run(*overrides: str) -> simserve.Result:
    return simserve.run(load_scenario(TINY, list(overrides)))


# --- rate: inf ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["inf", ".inf", "Infinity"])
def test_rate_inf_sends_everything_at_once(spelling):
    r = run(f"workload.rate={spelling}")
    assert (r.requests["arrival_s"] == 0).all() and len(r.requests) == 60
    assert r.scenario.workload.arrival.rate == math.inf


def test_rate_inf_needs_a_count_and_has_no_capacity_search():
    with pytest.raises(ConfigError, match=r"workload\.rate: inf sends every request at once"):
        load_scenario(TINY, ["workload.rate=inf", "workload.num_requests=null",
                             "workload.duration=10"])
    with pytest.raises(ConfigError, match=r"workload\.arrival: .*finite arrival rate"):
        simserve.capacity(load_scenario(TINY, ["workload.rate=inf"]))


# --- max_concurrency ---------------------------------------------------------------------------

def in_flight_max(requests) -> int:
    """The most requests sent and not yet ended at any moment (ends before starts at a tie:
    a slot freed at t is taken at t)."""
    events = [(t, 1) for t in requests["arrival_s"]] + [(t, -1) for t in requests["finish_s"]]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_max_concurrency_bounds_the_requests_in_flight(limit):
    r = run("workload.rate=inf", f"workload.max_concurrency={limit}")
    assert (r.requests["status"] == "finished").all()
    assert in_flight_max(r.requests) == limit


def test_one_client_sends_each_request_when_the_last_one_ends():
    req = run("workload.rate=inf", "workload.max_concurrency=1").requests
    # request i is sent at request i-1's finish; its TTFT counts from that send, as vLLM's does
    np.testing.assert_array_equal(req["arrival_s"].to_numpy()[1:], req["finish_s"].to_numpy()[:-1])
    assert (req["ttft_s"] == req["first_token_s"] - req["arrival_s"]).all()


def test_a_limit_above_the_load_changes_nothing_but_is_written_back(tmp_path):
    plain, limited = run(), run("workload.max_concurrency=1000")
    assert plain.requests.equals(limited.requests)
    limited.save(tmp_path)
    assert load_scenario(tmp_path / "scenario.yaml").workload.max_concurrency == 1000


# --- metric_percentiles ------------------------------------------------------------------------

def test_metric_percentiles_choose_the_reported_percentiles(tmp_path, capsys):
    r = run("metric_percentiles=[25, 50, 99.9]")
    assert {"p25_ttft_ms", "p99.9_tpot_ms", "p50_itl_ms"} <= set(r.summary)
    assert "p90_ttft_ms" not in r.summary
    ttft = np.sort(r.requests["ttft_s"].dropna().to_numpy() * 1000)
    assert r.summary["p25_ttft_ms"] == pytest.approx(np.percentile(ttft, 25))
    assert main(["run", str(TINY), "--metric-percentiles", "10,90", "--no-report",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "P10 TTFT (ms):" in out and "P99 TTFT" not in out


@pytest.mark.parametrize("value, where", [
    ("[0]", r"metric_percentiles\[0\]"), ("[101]", r"metric_percentiles\[0\]"),
    ("[50, 50]", "repeat"), ("[]", "metric_percentiles"), ("x", "metric_percentiles"),
    ("[true]", r"metric_percentiles\[0\]")])
def test_bad_percentiles_are_named(value, where):
    with pytest.raises(ConfigError, match=where):
        load_scenario(TINY, [f"metric_percentiles={value}"])


# --- ShareGPT ----------------------------------------------------------------------------------

def conversation(prompt_chars: int, reply_chars: int, turns: int = 2) -> dict:
    texts = ["p" * prompt_chars, "r" * reply_chars] + ["x"] * (turns - 2)
    return {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t}
                              for i, t in enumerate(texts[:turns])]}


def sharegpt(tmp_path, entries, **lengths) -> list:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(entries))
    return simserve.run(load_scenario(TINY, [
        "workload.prompt=null", "workload.output=null", "workload.num_requests=40",
        f"workload.lengths={json.dumps({'format': 'sharegpt', 'path': str(path), **lengths})}",
        "engine.max_model_len=4096", "engine.max_num_batched_tokens=4096",
        "engine.num_gpu_blocks=4096"])).requests


def test_sharegpt_counts_and_filters_as_vllm(tmp_path):
    entries = [conversation(40, 80),          # 10 prompt, 20 output tokens (4 chars each): kept
               conversation(41, 81),          # ceil: 11 and 21: kept
               conversation(12, 80),          # 3-token prompt: too short
               conversation(40, 12),          # 3-token output: too short
               conversation(4100, 80),        # 1,025-token prompt: too long
               conversation(4000, 4400),      # 1,000 + 1,100 > 2,048: too long
               conversation(40, 80, turns=1),   # one turn: skipped
               {"id": "no conversations"}]
    req = sharegpt(tmp_path, entries)
    pairs = set(zip(req["num_prompt_tokens"], req["num_output_tokens"]))
    assert pairs == {(10, 20), (11, 21)}                 # 40 requests oversample the two
    # --sharegpt-output-len: every output 7 tokens, no minimum on the completion; the
    # 1,000-token prompt now fits 2,048 with its output
    fixed = sharegpt(tmp_path, entries, output_len=7)
    assert set(zip(fixed["num_prompt_tokens"], fixed["num_output_tokens"])) == {
        (10, 7), (11, 7), (1000, 7)}


def test_sharegpt_takes_a_shuffle_without_repeats_when_there_are_enough(tmp_path):
    entries = [conversation(4 * (10 + i), 80) for i in range(100)]
    prompts = sharegpt(tmp_path, entries)["num_prompt_tokens"].tolist()
    assert len(set(prompts)) == 40 and prompts != sorted(prompts)


def test_the_shipped_sharegpt_sample_runs(tmp_path):
    req = sharegpt(tmp_path, json.loads((SAMPLES / "sharegpt_sample.json").read_text()))
    assert len(req) == 40 and (req["num_prompt_tokens"] >= 4).all()


@pytest.mark.parametrize("text, why", [("{", "not JSON"), ("{}", "JSON list"),
                                       ("[" * 50000 + "]" * 50000, "nested"),
                                       ("[]", "no usable conversation"),
                                       ('[{"conversations": [{"value": 5}, {"value": "x"}]}]',
                                        "text 'value'")])
def test_bad_sharegpt_files_are_named(tmp_path, text, why):
    path = tmp_path / "sg.json"
    path.write_text(text)
    with pytest.raises(DataError, match=why):
        simserve.run(load_scenario(TINY, [
            "workload.prompt=null", "workload.output=null",
            f"workload.lengths={{format: sharegpt, path: {path}}}"]))


# --- prefix_len --------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", [96, 100, 512])
def test_a_shared_prefix_is_cached_exactly(prefix):
    # one request at a time (1 req/s, each done within a second): every request after the
    # first finds the prefix's whole 16-token blocks cached, and nothing more
    r = run(f"workload.prefix_len={prefix}", "workload.rate=1", "engine.enable_prefix_caching=true",
            "engine.max_model_len=1024", "engine.max_num_batched_tokens=1024",
            "engine.num_gpu_blocks=512")
    base = run("workload.rate=1").requests
    req = r.requests
    assert (req["num_prompt_tokens"] == base["num_prompt_tokens"] + prefix).all()
    assert (req["status"] == "finished").all()
    assert req["num_cached_tokens"].iloc[0] == 0
    assert (req["num_cached_tokens"].iloc[1:] == prefix // 16 * 16).all()


def test_prefix_len_is_written_back(tmp_path):
    r = run("workload.prefix_len=64")
    r.save(tmp_path)
    assert load_scenario(tmp_path / "scenario.yaml").workload.prefix_len == 64
