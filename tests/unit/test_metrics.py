"""Metrics: every expected value is computed by hand in the comment beside it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.errors import ConfigError
from simserve.fields import Fields
from simserve.metrics import SloConfig, format_summary, summarize

NAN = float("nan")
STEP_COLUMNS = ["step", "replica", "start_s", "duration_s", "num_prefill_tokens",
                "num_prefill_seqs", "num_decode_seqs", "num_batched_tokens", "num_running",
                "num_waiting", "kv_blocks_used", "kv_blocks_total", "num_preempted",
                "swap_out_blocks", "swap_in_blocks"]


def make_requests(rows: list[dict]) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """Rows give arrival, prompt, tokens (absolute times) or reject; the rest is derived."""
    records, token_times = [], []
    for i, r in enumerate(rows):
        tokens = np.asarray(r.get("tokens", []), float)
        done = "reject" not in r
        first, finish = (tokens[0], tokens[-1]) if done else (NAN, NAN)
        out = len(tokens) if done else r.get("out", 5)
        records.append(dict(
            request_id=i, replica=r.get("replica", 0), arrival_s=r["arrival"],
            num_prompt_tokens=r["prompt"], num_output_tokens=out,
            status="finished" if done else "rejected", reject_reason=r.get("reject", ""),
            first_scheduled_s=r["arrival"] if done else NAN, first_token_s=first,
            finish_s=finish, num_preemptions=r.get("preempt", 0),
            ttft_s=first - r["arrival"], e2el_s=finish - r["arrival"],
            tpot_s=(finish - first) / (out - 1) if done and out > 1 else NAN))
        token_times.append(tokens)
    return pd.DataFrame(records), token_times


def make_steps(rows: list[tuple]) -> pd.DataFrame:
    """rows: (replica, start, duration, batched, running, waiting, kv_used, kv_total)."""
    data = []
    for i, (rep, start, dur, batched, running, waiting, used, total) in enumerate(rows):
        data.append(dict(step=i, replica=rep, start_s=start, duration_s=dur,
                         num_prefill_tokens=0, num_prefill_seqs=0, num_decode_seqs=running,
                         num_batched_tokens=batched, num_running=running, num_waiting=waiting,
                         kv_blocks_used=used, kv_blocks_total=total, num_preempted=0,
                         swap_out_blocks=0, swap_in_blocks=0))
    return pd.DataFrame(data, columns=STEP_COLUMNS)


NO_STEPS = make_steps([])

# R0: arrives 0.0, tokens at 0.5, 0.7, 1.0 -> TTFT 0.5, E2EL 1.0, TPOT 0.5/2 = 0.25, ITL 0.2, 0.3
# R1: arrives 0.5, one token at 1.5      -> TTFT 1.0, E2EL 1.0, no TPOT, no ITL
# R2: arrives 1.0, tokens 1.25, 1.5, 2.0, 3.0 -> TTFT 0.25, E2EL 2.0, TPOT 1.75/3, ITL .25 .5 1
# R3: arrives 2.0, rejected (prompt too long)
RUN = [
    dict(arrival=0.0, prompt=10, tokens=[0.5, 0.7, 1.0], preempt=1),
    dict(arrival=0.5, prompt=20, tokens=[1.5]),
    dict(arrival=1.0, prompt=30, tokens=[1.25, 1.5, 2.0, 3.0], preempt=2, replica=1),
    dict(arrival=2.0, prompt=5000, reject="prompt_too_long"),
]


def run_summary(slo: SloConfig = SloConfig.none(), steps: pd.DataFrame = NO_STEPS, **kw) -> dict:
    requests, token_times = make_requests(RUN)
    return summarize(requests, token_times, steps, slo, **kw)


def test_counts_and_throughputs():
    s = run_summary()
    assert s["num_requests"] == 4
    assert s["completed"] == 3
    assert s["num_rejected"] == 1
    assert s["rejected_by_reason"] == {"prompt_too_long": 1}
    assert s["duration_s"] == 3.0               # last finish 3.0 - first arrival 0.0
    assert s["total_input_tokens"] == 60        # 10 + 20 + 30; the rejected prompt is not served
    assert s["total_output_tokens"] == 8        # 3 + 1 + 4
    assert s["request_throughput"] == pytest.approx(1.0)          # 3 / 3
    assert s["output_throughput"] == pytest.approx(8 / 3)
    assert s["total_token_throughput"] == pytest.approx(68 / 3)   # (60 + 8) / 3
    assert s["total_preemptions"] == 3


def test_latency_statistics():
    s = run_summary()
    # TTFT ms [500, 1000, 250]; sorted [250, 500, 1000]; p90 at index 1.8 -> 500 + .8*500
    assert s["mean_ttft_ms"] == pytest.approx(1750 / 3)
    assert s["median_ttft_ms"] == pytest.approx(500)
    assert s["p50_ttft_ms"] == pytest.approx(500)
    assert s["p90_ttft_ms"] == pytest.approx(900)
    assert s["p99_ttft_ms"] == pytest.approx(990)               # index 1.98
    # population std: deviations -250/3, 1250/3, -1000/3 -> sqrt((62500+1562500+1e6)/27)
    assert s["std_ttft_ms"] == pytest.approx(np.sqrt(2_625_000 / 27))
    # TPOT only over out > 1: ms [250, 583.33]; p90 at index 0.9 -> 250 + .9*333.33
    assert s["mean_tpot_ms"] == pytest.approx((250 + 1750 / 3) / 2)
    assert s["p90_tpot_ms"] == pytest.approx(250 + 0.9 * 1000 / 3)
    # ITL pooled ms [200, 300, 250, 500, 1000]; sorted [200, 250, 300, 500, 1000]
    assert s["mean_itl_ms"] == pytest.approx(450)               # 2250 / 5
    assert s["median_itl_ms"] == pytest.approx(300)
    assert s["p90_itl_ms"] == pytest.approx(800)                # index 3.6 -> 500 + .6*500
    assert s["p99_itl_ms"] == pytest.approx(980)                # index 3.96
    # E2EL ms [1000, 1000, 2000]
    assert s["mean_e2el_ms"] == pytest.approx(4000 / 3)
    assert s["median_e2el_ms"] == pytest.approx(1000)
    assert s["p90_e2el_ms"] == pytest.approx(1800)              # index 1.8


def test_custom_percentiles_name_keys_like_vllm():
    s = run_summary(percentiles=(25, 99.9))
    assert s["p25_ttft_ms"] == pytest.approx(375)               # index 0.5 -> 250 + .5*250
    assert "p99.9_itl_ms" in s and "p90_itl_ms" not in s


def test_goodput_every_given_slo_must_hold():
    # TTFT <= 600 ms and TPOT <= 300 ms: R0 good (500, 250); R1 misses TTFT (1000);
    # R2 misses TPOT (583); R3 rejected -> 1 good of 4 sent
    s = run_summary(SloConfig(ttft_ms=600, tpot_ms=300))
    assert s["num_good"] == 1
    assert s["request_goodput"] == pytest.approx(1 / 3)         # 1 good / 3 s
    assert s["slo_attainment"] == pytest.approx(0.25)           # rejected counts as a miss
    assert s["slo_attainment_target"] == 0.9
    assert s["slo_met"] is False


def test_goodput_single_token_request_has_zero_tpot():
    # TPOT <= 300 ms only: R0 (250) good, R1 (out == 1 -> 0) good, R2 (583) misses -> 2 of 4
    s = run_summary(SloConfig(tpot_ms=300, attainment=0.5))
    assert s["num_good"] == 2
    assert s["request_goodput"] == pytest.approx(2 / 3)
    assert s["slo_attainment"] == pytest.approx(0.5)
    assert s["slo_met"] is True                                 # 0.5 >= 0.5


def test_goodput_limits_are_inclusive():
    # E2EL <= 1000 ms: R0 and R1 take exactly 1.0 s (good), R2 takes 2.0 s
    s = run_summary(SloConfig(e2el_ms=1000))
    assert s["num_good"] == 2


def test_no_slo_means_no_goodput():
    s = run_summary()
    for key in ("request_goodput", "num_good", "slo_attainment", "slo_attainment_target",
                "slo_met"):
        assert s[key] is None


def test_time_weighted_levels_with_idle_gap():
    # Window [0, 3] (first arrival, last finish). Replica 0 is idle over [1.5, 2.5]; its last
    # step runs to 3.5 and is clipped to 0.5 s. Replica 1 runs one step over the whole window.
    steps = make_steps([
        # replica, start, dur, batched, running, waiting, kv used, kv total
        (0, 0.0, 1.0, 100, 2, 1, 50, 100),
        (0, 1.0, 0.5, 10, 1, 0, 20, 100),
        (0, 2.5, 1.0, 20, 1, 0, 40, 100),
        (1, 0.0, 3.0, 30, 3, 2, 90, 100),
    ])
    s = run_summary(steps=steps)
    assert s["num_steps"] == 4
    # running: replica 0 (2*1 + 1*.5 + 1*.5)/3 = 1, replica 1: 3 -> summed 4
    assert s["mean_running"] == pytest.approx(4.0)
    # waiting: replica 0 (1*1)/3, replica 1: 2 -> 7/3
    assert s["mean_waiting"] == pytest.approx(7 / 3)
    # KV: replica 0 (.5*1 + .2*.5 + .4*.5)/3 = .8/3, replica 1: .9 -> mean over 2 replicas
    assert s["mean_kv_utilization"] == pytest.approx((0.8 / 3 + 0.9) / 2)
    assert s["max_kv_utilization"] == pytest.approx(0.9)
    assert s["mean_batched_tokens"] == pytest.approx(40.0)      # (100 + 10 + 20 + 30) / 4


def test_all_rejected_gives_zeros_not_errors():
    requests, token_times = make_requests([dict(arrival=1.0, prompt=9, reject="queue_full")])
    s = summarize(requests, token_times, NO_STEPS, SloConfig(ttft_ms=100))
    assert s["completed"] == 0 and s["duration_s"] == 0.0
    assert s["request_throughput"] == 0.0 and s["mean_ttft_ms"] == 0.0 and s["p99_itl_ms"] == 0.0
    assert s["slo_attainment"] == 0.0 and s["slo_met"] is False
    assert s["rejected_by_reason"] == {"queue_full": 1}


def test_summary_is_plain_json_and_nan_becomes_none():
    requests, token_times = make_requests(RUN)
    requests.loc[0, "first_token_s"] = NAN                      # a corrupt record poisons TTFT
    s = summarize(requests, token_times, NO_STEPS, SloConfig(ttft_ms=600))
    assert s["mean_ttft_ms"] is None
    json.dumps(s, allow_nan=False)
    assert all(type(v) in (int, float, bool, str, dict, type(None)) for v in s.values())


def test_token_times_must_align_with_requests():
    requests, token_times = make_requests(RUN)
    with pytest.raises(ValueError, match="token_times must have one entry per request"):
        summarize(requests, token_times[:-1], NO_STEPS, SloConfig.none())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.001, 10),
                          st.lists(st.floats(0.001, 1), max_size=20)),
                min_size=1, max_size=8))
def test_itl_and_tpot_agree_with_per_request_definitions(specs):
    rows = []
    for arrival, ttft, gaps in specs:
        tokens = arrival + ttft + np.concatenate([[0.0], np.cumsum(gaps)])
        rows.append(dict(arrival=arrival, prompt=1, tokens=tokens))
    requests, token_times = make_requests(rows)
    s = summarize(requests, token_times, NO_STEPS, SloConfig.none())
    ttft = requests["first_token_s"] - requests["arrival_s"]
    e2el = requests["finish_s"] - requests["arrival_s"]
    out = requests["num_output_tokens"]
    num_gaps = int((out - 1).sum())
    # Σ over requests of the decode time E2EL - TTFT is exactly the sum of all pooled gaps
    expected_ms = 1000 * float((e2el - ttft).sum())
    assert s["mean_itl_ms"] * num_gaps == pytest.approx(expected_ms, rel=1e-9, abs=1e-6)
    multi = out > 1
    per_request_tpot = ((e2el - ttft)[multi] / (out[multi] - 1)) * 1000
    expected_tpot = float(per_request_tpot.mean()) if multi.any() else 0.0
    assert s["mean_tpot_ms"] == pytest.approx(expected_tpot, rel=1e-9, abs=1e-9)
    assert s["total_output_tokens"] == int(out.sum())


# --- SloConfig --------------------------------------------------------------------------------

def test_slo_from_fields_reads_every_field():
    slo = SloConfig.from_fields(Fields({"ttft_ms": 200, "tpot_ms": 50.5, "attainment": 0.99},
                                       "slo"))
    assert slo == SloConfig(ttft_ms=200.0, tpot_ms=50.5, e2el_ms=None, attainment=0.99)
    assert SloConfig.from_fields(Fields(slo.to_dict(), "slo")) == slo


def test_slo_empty_section_means_no_slos():
    slo = SloConfig.from_fields(Fields(None, "slo"))
    assert slo == SloConfig.none() and slo.is_empty and slo.attainment == 0.9


@pytest.mark.parametrize("raw, field", [
    ({"ttft_ms": 0}, "slo.ttft_ms"),
    ({"tpot_ms": -5}, "slo.tpot_ms"),
    ({"e2el_ms": "fast"}, "slo.e2el_ms"),
    ({"attainment": 1.5}, "slo.attainment"),
    ({"attainment": 0}, "slo.attainment"),
    ({"ttft": 100}, "slo.ttft"),
])
def test_slo_errors_name_the_field(raw, field):
    with pytest.raises(ConfigError) as err:
        SloConfig.from_fields(Fields(raw, "slo"))
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")


def test_slo_direct_construction_is_validated():
    with pytest.raises(ConfigError, match="slo.e2el_ms"):
        SloConfig(e2el_ms=-1)


# --- format_summary ---------------------------------------------------------------------------

def test_format_summary_has_vllm_lines():
    text = format_summary(run_summary(SloConfig(ttft_ms=600, tpot_ms=300)))
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert "---------------Time to First Token----------------" in lines
    for label in ("Successful requests:", "Benchmark duration (s):", "Request throughput (req/s):",
                  "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
                  "Mean TTFT (ms):", "Median TPOT (ms):", "P90 ITL (ms):", "P99 E2EL (ms):",
                  "Rejected requests:", "Preemptions:", "Mean KV cache utilization (%):",
                  "Request goodput (req/s):", "SLO attainment (%):"):
        assert any(line.startswith(label) for line in lines), label
    assert f"{'Successful requests:':<40} 3" in lines
    assert f"{'Benchmark duration (s):':<40} 3.00" in lines
    assert f"{'Mean ITL (ms):':<40} 450.00" in lines
    assert f"{'SLO attainment (%):':<40} 25.00" in lines
    assert f"{'  prompt_too_long:':<40} 1" in lines


def test_format_summary_shows_failures_retries_and_pipeline_bubbles():
    # they were only in summary.json: a faults run printed "Failed requests: 4" alone
    s = {**run_summary(SloConfig(ttft_ms=600, tpot_ms=300)), "num_replica_failures": 6,
         "num_retries": 111, "num_retried_requests": 90,
         "pipeline": {"bubble_fraction": 0.25, "stage_bubble_fraction": [0.2, 0.3],
                      "in_flight_s": 10.0}}
    lines = format_summary(s).splitlines()
    assert f"{'Replica failures:':<40} 6" in lines
    assert f"{'Retries (requests retried):':<40} 111 (90)" in lines
    assert f"{'Pipeline bubbles (%):':<40} 25.00" in lines
    plain = format_summary(run_summary(SloConfig(ttft_ms=600, tpot_ms=300)))
    assert "Replica failures" not in plain and "Pipeline bubbles" not in plain


def test_format_summary_is_deterministic_and_skips_goodput_without_slo():
    s = run_summary(percentiles=(99, 25, 90))
    # the same text whatever order the summary's keys come in: reversed, or sorted as
    # summary.json is written and read back (a copy in the same order, dict(s), could not
    # differ); the percentile rows stay in numeric order: P25, P90, P99
    text = format_summary(s)
    assert format_summary(dict(reversed(list(s.items())))) == text
    assert format_summary(json.loads(json.dumps(s, sort_keys=True))) == text
    ttft = [line.split()[0] for line in text.splitlines() if " TTFT (ms): " in line]
    assert ttft == ["Mean", "Median", "P25", "P90", "P99"]
    assert "goodput" not in format_summary(s) and "SLO" not in format_summary(s)
    assert format_summary(s, title="sim").splitlines()[0].count(" sim ") == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 5)), min_size=1,
                max_size=60),
       st.sampled_from([0, 1, 25, 50, 90, 99, 99.9, 100]))
def test_weighted_percentile_equals_expanded(pairs, q):
    """The engine's ITL comes as (gap, multiplicity): its percentiles must be exactly those of
    the expanded sample that vllm bench serve would compute."""
    from simserve.metrics.summary import WeightedSample
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    expanded = np.repeat(values, weights)
    sample = WeightedSample(values, weights)
    assert sample.percentile(q) == pytest.approx(np.percentile(expanded, q), rel=1e-12, abs=1e-15)
    assert sample.mean() == pytest.approx(expanded.mean(), rel=1e-12)
    assert sample.std() == pytest.approx(expanded.std(), rel=1e-9, abs=1e-12)


def test_weighted_percentile_of_nearly_equal_values():
    """Gaps a few ulps apart (constant step times summed in floating point)."""
    from simserve.metrics.summary import WeightedSample
    base = 0.01
    values = np.array([base, np.nextafter(base, 1), np.nextafter(np.nextafter(base, 1), 1)] * 50)
    weights = np.arange(1, 151) % 4 + 1
    expanded = np.repeat(values, weights)
    for q in (0, 50, 90, 99, 100):
        assert WeightedSample(values, weights).percentile(q) == np.percentile(expanded, q)


def test_weighted_percentiles_of_many_ranks_in_crowded_chunks():
    """Several percentiles at once over chunked data whose values crowd one histogram bin
    (more than 2**16 of them: the selection zooms in) and whose extremes share one bin."""
    from simserve.metrics.summary import WeightedSample
    rng = np.random.default_rng(5)
    crowd = 0.02 + rng.random(150_000) * 1e-7       # all in one of 4096 bins of [0, 1000]
    values = np.concatenate([crowd, rng.random(5000), [0.0, 1000.0]])
    weights = rng.integers(1, 4, len(values))
    cut = [0, 40_000, 150_500, len(values)]
    chunks = lambda: [(values[a:b], weights[a:b]) for a, b in zip(cut, cut[1:])]  # noqa: E731
    qs = [0, 1, 25, 50, 90, 99, 99.9, 100]
    expanded = np.repeat(values, weights)
    assert WeightedSample(chunks=chunks).percentiles(qs) == \
        [float(np.percentile(expanded, q)) for q in qs]


def test_request_columns_sorted_by_id_across_takes_and_tables():
    """Resolved requests taken in any order come back in id order, column by column; rows
    taken after a table join the sorted ones the next time."""
    from simserve.metrics.requests import RequestColumns
    from simserve.sched.request import Request, Status
    from simserve.workload import RequestSpec

    def req(i: int, status: Status) -> Request:
        r = Request(RequestSpec(i, 0.5 * i, 10 + i, 3))
        r.status = status
        if status is Status.FINISHED:
            r.first_token_s, r.finish_s, r.replica = 1.0 + i, 2.0 + i, 0
        else:
            r.reject_reason = "too_long"
        return r

    cols = RequestColumns()
    rows = cols.take([req(3, Status.FINISHED), req(0, Status.REJECTED)])
    assert list(rows["request_id"]) == [3, 0] and rows["finish_s"][0] == 5.0
    cols.take([req(1, Status.FINISHED)])
    first, _ = cols.table()
    assert list(first["request_id"]) == [0, 1, 3]
    assert list(first["status"]) == ["rejected", "finished", "finished"]
    assert first["num_prompt_tokens"].dtype == np.int64 and first["arrival_s"].dtype == np.float64
    assert np.isnan(first["finish_s"][0]) and list(first["finish_s"][1:]) == [3.0, 5.0]
    cols.take([req(2, Status.FINISHED)])               # after a table: joins the sorted rows
    again, _ = cols.table()
    assert list(again["request_id"]) == [0, 1, 2, 3]
    assert list(again["reject_reason"]) == ["too_long", "", "", ""]
    assert list(again["num_prompt_tokens"]) == [10, 11, 12, 13]
    assert cols.num_rows == 4 and cols.num_batches == 3


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1,
                max_size=60),
       st.sampled_from([1e-3, 1.0, 1e3]), st.booleans())
def test_median_is_numpys_bit_for_bit(values, scale, with_nan):
    """summary.median (which spares the summary numpy.ma's import) gives np.median's bits:
    odd and even lengths, repeated values, a NaN anywhere."""
    from simserve.metrics.summary import median
    x = np.asarray(values) * scale
    if with_nan:
        x[len(x) // 3] = NAN
    got, want = median(x.copy()), np.median(x)
    assert (np.isnan(got) and np.isnan(want)) or got.tobytes() == want.tobytes()
    assert isinstance(got, np.float64)


def test_median_of_two_middle_values_is_their_mean():
    # even length: sorted 0.1, 0.2, 0.3, 9.0 -> the mean of 0.2 and 0.3, (0.2 + 0.3) / 2 = 0.25
    from simserve.metrics.summary import median
    assert median(np.array([0.3, 0.1, 9.0, 0.2])) == (0.2 + 0.3) / 2 == 0.25
    assert median(np.array([5.0, 1.0, 3.0])) == 3.0


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1,
                max_size=60),
       st.one_of(st.sampled_from([0, 1, 25, 50, 90, 99, 99.9, 100]),
                 st.floats(min_value=0, max_value=100)),
       st.booleans(), st.booleans())
def test_percentile_is_numpys_bit_for_bit(values, q, repeat, with_nan):
    """summary.percentile gives np.percentile's bits (linear method): any q in [0, 100],
    lengths 1 to 60, repeated values, a NaN anywhere."""
    from simserve.metrics.summary import percentile
    x = np.asarray(values)
    if repeat:
        x = np.repeat(x, 3)
    if with_nan:
        x[len(x) // 2] = NAN
    got, want = percentile(x.copy(), q), float(np.percentile(x, q))
    assert (np.isnan(got) and np.isnan(want)) or \
        np.float64(got).tobytes() == np.float64(want).tobytes()


def test_percentile_interpolates_from_the_nearer_end():
    # x = 0, 10, 20, 30: q = 50 -> index 1.5, between 10 and 20, g = 0.5 -> 20 - 10 * 0.5 = 15;
    # q = 10 -> index 0.3 -> 0 + 10 * 0.3 = 3; q = 100 -> the largest, 30
    from simserve.metrics.summary import percentile
    x = np.array([30.0, 0.0, 20.0, 10.0])
    assert percentile(x, 50) == 15.0
    assert percentile(x, 10) == 10 * ((4 - 1) * (10 / 100))
    assert percentile(x, 100) == 30.0 and percentile(x, 0) == 0.0


def test_summary_bits_do_not_depend_on_blas_threads(tmp_path):
    """np.dot hands long float vectors to BLAS, whose sum order follows its thread count: the
    summary of a run of 20,000+ steps came out different in its last bits with one OpenBLAS
    thread (`simserve run`) and two (a notebook on this VM). The metrics' weighted sums no
    longer use it: two processes with 1 and 4 BLAS threads write the same summary."""
    import os
    import subprocess
    import sys
    code = ("import json, simserve\n"
            "from simserve.config import parse_scenario\n"
            "raw = {'model': 'Llama-2-7B', 'hardware': 'A100-80GB', 'seed': 1,\n"
            "       'latency': {'model': 'roofline'},\n"
            "       'workload': {'arrival': 'poisson', 'rate': 3, 'num_requests': 2000,\n"
            "                    'prompt': {'dist': 'uniform', 'low': 10, 'high': 900},\n"
            "                    'output': {'dist': 'uniform', 'low': 10, 'high': 900}}}\n"
            "print(json.dumps(simserve.run(parse_scenario(raw)).summary, sort_keys=True))\n")
    out = []
    for threads in ("1", "4"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        out.append(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=env, check=True).stdout)
    assert out[0] == out[1] and '"num_steps"' in out[0]


def test_tpot_is_defined_once_by_hand():
    """metrics.summary.tpot, which runner.collect, live/replay.py and the summaries all call:
    (E2EL − TTFT) / (out − 1) for a finished request with more than one token, else NaN."""
    import math

    from simserve.metrics.summary import tpot
    ttft, e2el = np.array([1.0, 1.0, 1.0, 2.0]), np.array([5.0, 5.0, 1.0, 3.0])
    out = np.array([5, 3, 1, 3])
    got = tpot(ttft, e2el, out, np.array([True, False, True, True]))
    # 4 s over 4 gaps; unfinished; one token; 1 s over 2 gaps
    assert got[0] == 1.0 and math.isnan(got[1]) and math.isnan(got[2]) and got[3] == 0.5
    assert tpot(ttft, e2el, out)[1] == 2.0           # without the finished mask
