"""Sanity of the physics: policies rank the way the serving literature says they should.

At moderate load with long prompts (Sarathi-Serve, OSDI'24, Fig. 1/7): prefill-first vLLM v0
gives the lowest TTFT but stalls running decodes behind whole prompts, so its TPOT tail is
worse than chunked, decode-first vLLM v1 / Sarathi; static batching has the worst throughput.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import simserve

SCENARIO = Path(__file__).resolve().parents[1] / "data" / "physics.yaml"


@pytest.fixture(scope="module")
def summaries():
    return {label: r.summary for label, r in simserve.compare(SCENARIO).items()}


def test_prefill_first_has_lower_ttft(summaries):
    v0 = summaries["vllm_v0"]
    for chunked in ("vllm_v1-2048", "sarathi-2048"):
        assert v0["median_ttft_ms"] < summaries[chunked]["median_ttft_ms"]


def test_chunked_decode_first_has_lower_tpot_tail(summaries):
    v0 = summaries["vllm_v0"]
    for chunked in ("vllm_v1-2048", "sarathi-2048"):
        assert summaries[chunked]["p99_tpot_ms"] < 0.9 * v0["p99_tpot_ms"]


def test_static_has_the_worst_throughput(summaries):
    static = summaries["static"]["output_throughput"]
    assert all(static < s["output_throughput"] for k, s in summaries.items() if k != "static")
    assert summaries["static"]["median_ttft_ms"] > 5 * summaries["vllm_v0"]["median_ttft_ms"]


def test_everyone_finishes(summaries):
    assert all(s["completed"] == 300 and s["num_rejected"] == 0 for s in summaries.values())
