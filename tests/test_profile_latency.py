"""The profile-backed latency model: exact on grid points, interpolating between them, explicit
about extrapolation, and refusing profiles of other models or malformed files."""

from __future__ import annotations

import json

import pytest

import simserve
from profiler.schema import ProfileError, dump
from simserve.cards import load_model
from simserve.config import parse_scenario
from simserve.latency.profile import ProfileLatency
from simserve.sched.plan import StepPlan

TINY = load_model("tiny-llama-45m")


def synthetic_profile() -> dict:
    """A hand-made profile for tests (NOT a measurement): values are simple formulas so
    expected step times can be computed by hand."""
    tokens = [1, 16, 64, 256]
    chunk, ctx = [16, 128], [0, 256]
    batch, dctx = [1, 8], [16, 512]
    return {
        "schema_version": 1, "kind": "simserve-profile",
        "provenance": {"device": "cpu", "device_name": "synthetic", "torch_version": "none",
                       "cuda_version": None, "dtype": "bf16", "threads": 1,
                       "date": "2026-01-01T00:00:00Z", "command": "tests", "grid": "quick"},
        "model": {"name": TINY.name, "num_layers": TINY.num_layers,
                  "hidden_size": TINY.hidden_size, "num_heads": TINY.num_heads,
                  "num_kv_heads": TINY.num_kv_heads, "head_dim": TINY.head_dim,
                  "intermediate_size": TINY.intermediate_size, "vocab_size": TINY.vocab_size,
                  "dtype_bytes": 2, "qkv_bias": False, "tie_word_embeddings": False},
        "settings": {"block_size": 16, "max_num_batched_tokens": 256, "warmup": 1, "repeats": 3,
                     "timer": "perf_counter", "sampler": "greedy"},
        "attention": {"backend": "reference", "compiled": False, "compile_seconds": {},
                      "fallback": None, "self_check_rel_err": 0.001, "note": ""},
        # linear: 1 ms + 0.01 ms per token; embedding: 0.001 ms per token
        "linear": {"tokens": tokens, "seconds": [1e-3 + 1e-5 * t for t in tokens],
                   "p10": [1e-3] * 4, "p90": [2e-3] * 4, "ops": {}},
        "embedding": {"tokens": tokens, "seconds": [1e-6 * t for t in tokens],
                      "p10": [0.0] * 4, "p90": [1e-3] * 4},
        # prefill: 1e-6 s per chunk token + 1e-8 s per (chunk token x ctx)
        "attn_prefill": {"chunk": chunk, "ctx": ctx,
                         "seconds": [[1e-6 * q + 1e-8 * q * c for c in ctx] for q in chunk],
                         "p10": [[0.0, 0.0]] * 2, "p90": [[1.0, 1.0]] * 2},
        # decode: 2e-6 s per sequence + 1e-8 s per (sequence x ctx)
        "attn_decode": {"batch": batch, "ctx": dctx,
                        "seconds": [[2e-6 * b + 1e-8 * b * c for c in dctx] for b in batch],
                        "p10": [[0.0, 0.0]] * 2, "p90": [[1.0, 1.0]] * 2},
        "lm_head": {"seqs": [1, 8], "seconds": [3e-4, 1e-3], "p10": [0.0, 0.0],
                    "p90": [1.0, 1.0], "top_p_seconds": [4e-4, 2e-3]},
        "memory": {"weights_bytes": 91235328, "kv_bytes_per_token": TINY.kv_bytes_per_token,
                   "block_bytes": TINY.kv_bytes_per_token * 16, "activation_peak_bytes": 0,
                   "activation_peak_method": "estimated", "total_bytes": None,
                   "free_bytes": None, "gpu_memory_utilization": 0.9, "num_gpu_blocks": None,
                   "note": "synthetic"},
        "heldout": [],
    }


def plan(prefill=(), decode=(), sampled=0, swap_out=0):
    prefill = tuple(prefill)
    return StepPlan(request_ids=tuple(range(len(prefill) + len(decode))),
                    num_new_tokens=tuple(q for q, _ in prefill) + (1,) * len(decode),
                    prefill_lens=tuple(q for q, _ in prefill),
                    prefill_ctx=tuple(c for _, c in prefill), decode_ctx=tuple(decode),
                    num_sampled=sampled, swap_out_blocks=swap_out)


def test_exact_on_grid_points():
    m = ProfileLatency(synthetic_profile())
    # 16-token prefill at ctx 0 (T = 16), sampling 1:
    # embedding 16e-6 + 4 layers x (linear 1e-3 + 16e-5 + prefill 16e-6) + lm_head 3e-4
    expected = 16e-6 + 4 * (1e-3 + 16e-5 + 16e-6) + 3e-4
    assert m.step_time(plan(prefill=[(16, 0)], sampled=1)) == pytest.approx(expected, rel=1e-12)
    # 8 decodes at ctx 512 (T = 8, between grid points 1 and 16 for linear/embedding: linear in
    # t exactly) + 8 sampled
    expected = 8e-6 + 4 * (1e-3 + 8e-5 + 2e-6 * 8 + 1e-8 * 8 * 512) + 1e-3
    assert m.step_time(plan(decode=[512] * 8, sampled=8)) == pytest.approx(expected, rel=1e-12)
    assert not m.warnings()


def test_bilinear_between_grid_points_and_mean_decode_ctx():
    m = ProfileLatency(synthetic_profile())
    # decode batch 4 at contexts 100 and 300 (mean 200), both inside the grid; the synthetic
    # surface is bilinear in (b, ctx), so interpolation is exact
    got = m.step_time(plan(decode=[100, 300, 100, 300]))
    expected = 4e-6 + 4 * (1e-3 + 4e-5 + 2e-6 * 4 + 1e-8 * 4 * 200)
    assert got == pytest.approx(expected, rel=1e-12)


def test_extrapolation_is_counted_and_reported():
    m = ProfileLatency(synthetic_profile())
    t = m.step_time(plan(prefill=[(512, 1024)], sampled=1))    # beyond chunk, ctx and tokens
    assert t > 0
    warnings = m.warnings()
    assert any("attn_prefill" in w for w in warnings) and any("linear" in w for w in warnings)


def test_swap_priced_by_host_link():
    p = synthetic_profile()
    m = ProfileLatency(p, host_link_bandwidth=1e9)
    base = m.step_time(plan(decode=[16], sampled=1))
    with_swap = m.step_time(plan(decode=[16], sampled=1, swap_out=3))
    assert with_swap - base == pytest.approx(3 * p["memory"]["block_bytes"] / 1e9)


def scenario(tmp_path, profile_path, model="tiny-llama-45m"):
    return parse_scenario({
        "model": model, "hardware": "cpu-epyc-2core",
        "engine": {"num_gpu_blocks": 256, "max_model_len": 1024, "max_num_batched_tokens": 256},
        "latency": {"model": "profile", "path": str(profile_path), "step_overhead_ms": 2},
        "workload": {"arrival": "poisson", "rate": 5, "num_requests": 20,
                     "prompt": {"dist": "uniform", "low": 10, "high": 200},
                     "output": {"dist": "uniform", "low": 2, "high": 20}},
    }, base_dir=tmp_path)


def test_scenario_runs_on_a_profile(tmp_path):
    dump(synthetic_profile(), tmp_path / "p.json")
    r = simserve.run(scenario(tmp_path, "p.json"))
    assert r.summary["completed"] == 20
    assert r.latency_label.startswith("profile (tiny-llama-45m")
    # every step costs at least the 2 ms overhead + 4 layers x 1 ms of linear
    assert (r.steps["duration_s"] >= 6e-3).all()


def test_profile_of_another_model_is_refused(tmp_path, capsys):
    dump(synthetic_profile(), tmp_path / "p.json")
    with pytest.raises(simserve.DataError, match="other model shapes"):
        simserve.run(scenario(tmp_path, "p.json", model="Llama-3.1-8B"))


def test_malformed_profiles_give_one_clear_error(tmp_path):
    from simserve.cli import main
    bad = synthetic_profile()
    bad["schema_version"] = 99
    (tmp_path / "new.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match="newer"):
        simserve.run(scenario(tmp_path, "new.json"))
    bad = synthetic_profile()
    del bad["attn_decode"]["seconds"]
    (tmp_path / "missing.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match="attn_decode"):
        simserve.run(scenario(tmp_path, "missing.json"))
    with pytest.raises(simserve.ConfigError, match="latency.path"):
        simserve.run(scenario(tmp_path, "absent.json"))
