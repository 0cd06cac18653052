"""The profile-backed latency model: exact on grid points, interpolating between them, explicit
about extrapolation, and refusing profiles of other models or malformed files."""

from __future__ import annotations

import json

import pytest

import simserve
from simserve.latency.schema import ProfileError, dump
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
    # the grid's formulas are linear along each axis, so extrapolation continues them: per
    # layer (4), linear 1 ms + 0.01 ms x 512 and prefill attention 512 x 1e-6 + 512 x 1024 x
    # 1e-8 s; embedding 0.001 ms x 512; the LM head's one sequence, inside its grid, 0.3 ms
    assert TINY.num_layers == 4
    assert t == pytest.approx(4 * (1e-3 + 1e-5 * 512) + 4 * (512e-6 + 1e-8 * 512 * 1024)
                              + 1e-6 * 512 + 3e-4, rel=1e-12)
    # each part beyond its grid counted once, the LM head not at all; counted again per lookup
    said = [w.split("): ", 1)[1] for w in m.warnings()]
    assert said == [f"{part} extrapolated beyond the measured grid in 1 lookups"
                    for part in ("attn_prefill", "embedding", "linear")]
    m.step_time(plan(prefill=[(512, 1024)], sampled=1))
    assert [w.rsplit(" in ", 1)[1] for w in m.warnings()] == ["2 lookups"] * 3


def test_swap_priced_by_host_link():
    p = synthetic_profile()
    m = ProfileLatency(p, host_link_bandwidth=1e9)
    base = m.step_time(plan(decode=[16], sampled=1))
    with_swap = m.step_time(plan(decode=[16], sampled=1, swap_out=3))
    assert with_swap - base == pytest.approx(3 * p["memory"]["block_bytes"] / 1e9)


@pytest.mark.parametrize("block_size, tp", [(16, 1), (32, 1), (32, 2), (8, 4)])
def test_swap_priced_from_the_scenarios_blocks_not_the_profiles(block_size, tp):
    """A swapped block holds the scenario's block_size tokens of K and V on one rank, whatever
    block size the profile was measured with (16 tokens for the H100 profile): with 32-token
    blocks a swap moves twice the bytes of a profile block."""
    from simserve.kv.capacity import kv_block_bytes
    from simserve.engine.build import build_latency
    s = parse_scenario({
        "model": "Llama-3.1-8B", "hardware": "H100-SXM",
        "engine": {"block_size": block_size, "tensor_parallel_size": tp,
                   "preemption_mode": "swap", "num_gpu_blocks": 1000, "max_model_len": 4096},
        "latency": {"model": "profile", "path": "Llama-3.1-8B_H100-SXM_bf16"},
        "workload": {"arrival": "poisson", "rate": 1, "num_requests": 1,
                     "prompt": {"dist": "fixed", "value": 10},
                     "output": {"dist": "fixed", "value": 10}}})
    m = build_latency(s)
    block = kv_block_bytes(s.model, block_size, tp)   # 2 x 32 layers x 8 KV heads / tp x 128 x 2 B
    assert block == block_size * 2 * 32 * (8 // tp) * 128 * 2
    assert m.profile["settings"]["block_size"] == 16
    p = plan(decode=[100], sampled=1, swap_out=3)
    assert m.breakdown(p)["swap"] == pytest.approx(3 * block / s.hardware.host_link_bandwidth)


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


@pytest.mark.parametrize("section, field, value, message", [
    ("memory", "gpu_memory_utilization", 1.5, "must be a fraction in \\(0, 1\\], got 1.5"),
    ("memory", "gpu_memory_utilization", 0, "must be a fraction in \\(0, 1\\], got 0"),
    ("attention", "self_check_rel_err", -0.1, "must be >= 0, got -0.1"),
])
def test_informational_fields_out_of_range_are_refused(tmp_path, section, field, value,
                                                       message):
    # fields the simulator does not read are still checked: a file with them out of range
    # was not written by the profiler, and reading it silently would hide that
    bad = synthetic_profile()
    bad[section][field] = value
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=f"{section}.{field}: {message}"):
        simserve.run(scenario(tmp_path, "bad.json"))


# --------------------------------------------------------------------------------------------
# Decode attention of a batch with spread-out contexts


def curved_decode_profile() -> dict:
    """Decode attention not linear in context (as on a CPU, where long K/V leaves the cache):
    D(b, c) = b * g(c), g = 1e-5, 2e-5, 9.2e-4 s at contexts 0, 100, 1000 (slopes 1e-7, then
    1e-6 per token)."""
    p = synthetic_profile()
    g = [1e-5, 2e-5, 9.2e-4]
    p["attn_decode"] = {"batch": [1, 8], "ctx": [0, 100, 1000],
                        "seconds": [[b * x for x in g] for b in (1, 8)],
                        "p10": [[0.0] * 3] * 2, "p90": [[1.0] * 3] * 2}
    return p


def test_decode_prices_each_sequence_at_its_own_context():
    m = ProfileLatency(curved_decode_profile())
    # contexts 50 and 600 (batch 2): g(50) = 1e-5 + 50 * 1e-7 = 1.5e-5,
    # g(600) = 2e-5 + 500 * 1e-6 = 5.2e-4; D(2, c) / 2 = g(c), so per layer
    # (D(2, 50) + D(2, 600)) / 2 = g(50) + g(600) = 5.35e-4, and 4 layers
    got = m.breakdown(plan(decode=[50, 600]))["attn_decode"]
    assert got == pytest.approx(4 * 5.35e-4, rel=1e-12)
    # the batch's mean context (325) would say 2 * g(325) = 2 * 2.45e-4 = 4.9e-4 per layer
    assert got > 4 * 4.9e-4 * 1.05
    # a uniform batch is the grid itself
    assert m.breakdown(plan(decode=[100] * 8))["attn_decode"] == pytest.approx(4 * 8 * 2e-5)
    assert not m.warnings()


def test_decode_contexts_beyond_the_grid_are_extrapolated_and_counted():
    m = ProfileLatency(curved_decode_profile())
    # 1200 is past the last context: the last segment's slope (1e-6) carries on
    got = m.breakdown(plan(decode=[1200]))["attn_decode"]
    assert got == pytest.approx(4 * (9.2e-4 + 200 * 1e-6), rel=1e-12)
    assert m.warnings() == [f"{m.label}: attn_decode extrapolated beyond the measured grid in "
                            "1 lookups"]


@pytest.mark.parametrize("calibrated", [False, True])
def test_decode_stretch_is_bit_identical_to_step_time(calibrated):
    import random
    prof = curved_decode_profile()
    if calibrated:
        prof["calibration"] = {"scale": 1.3, "attention_scale": 0.7, "step_overhead_s": 1e-3,
                               "per_output_token_s": 1e-5}
    rng = random.Random(3)
    for _ in range(30):
        ctx = [rng.randint(0, 1100) for _ in range(rng.randint(1, 12))]   # some beyond 1000
        p = plan(decode=ctx, sampled=len(ctx))
        fast, slow = ProfileLatency(prof), ProfileLatency(prof)
        prices = fast.decode_stretch(p)
        for i in range(0, 200, 7):
            expected = [slow.step_time(p._replace(decode_ctx=tuple(c + m for c in ctx)))
                        for m in (i, i + 1, i + 2)]
            assert prices(i, 3) == expected, (ctx, i)
        assert fast.extrapolated == slow.extrapolated


def test_fast_forward_and_stepping_agree_on_a_profile(tmp_path):
    dump(curved_decode_profile(), tmp_path / "p.json")
    s = scenario(tmp_path, "p.json")
    fast, slow = simserve.run(s), simserve.run(s, fast_forward=False)
    assert fast.steps["duration_s"].tolist() == slow.steps["duration_s"].tolist()
    assert fast.summary == slow.summary


def test_extrapolation_warning_reaches_the_run_summary(tmp_path):
    dump(synthetic_profile(), tmp_path / "p.json")     # tokens up to 256, prompts up to 200
    s = parse_scenario({
        "model": "tiny-llama-45m", "hardware": "cpu-epyc-2core",
        "engine": {"num_gpu_blocks": 256, "max_model_len": 2048, "max_num_batched_tokens": 512},
        "latency": {"model": "profile", "path": "p.json"},
        "workload": {"arrival": "poisson", "rate": 5, "num_requests": 10,
                     "prompt": {"dist": "fixed", "value": 400},
                     "output": {"dist": "fixed", "value": 4}},
    }, base_dir=tmp_path)
    r = simserve.run(s)
    assert r.summary["completed"] == 10
    assert any("linear extrapolated" in w for w in r.summary["warnings"])


# --------------------------------------------------------------------------------------------
# The shipped profile


SHIPPED = "tiny-llama-45m_cpu-epyc-2core_bf16_1t"
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_shipped_profile_validates_and_matches_its_card():
    from simserve.latency.schema import load_profile, model_mismatch
    from simserve.latency.profile import PROFILES_DIR, list_profiles
    assert SHIPPED in list_profiles()
    p = load_profile(PROFILES_DIR / f"{SHIPPED}.json")
    assert model_mismatch(p, TINY) == []
    prov = p["provenance"]
    assert prov["device"] == "cpu" and prov["threads"] == 1 and prov["dtype"] == "bf16"
    assert prov["command"].split()[:3] in (["python", "-m", "profiler"], ["simserve", "profile",
                                                                         "--model"])
    assert p["settings"]["block_size"] == 32 and p["settings"].get("method") == "in_step"
    # what the ground-truth vLLM server's knobs need, inside the grids
    assert p["linear"]["tokens"][-1] >= 512 and p["attn_prefill"]["ctx"][-1] >= 2048
    assert p["attn_decode"]["batch"][-1] >= 32 and p["attn_decode"]["ctx"][-1] >= 2048


GPU_SHIPPED = ("Llama-3.1-8B_H100-SXM_bf16", "Qwen2.5-7B_H100-SXM_bf16")


@pytest.mark.parametrize("name", GPU_SHIPPED)
def test_shipped_gpu_profiles_are_measured_on_an_h100_with_graphs_and_match_their_cards(name):
    from simserve.latency.schema import load_profile, model_mismatch
    from simserve.cards import load_model
    from simserve.latency.profile import PROFILES_DIR, ProfileLatency
    p = load_profile(PROFILES_DIR / f"{name}.json")
    card = load_model(name.split("_")[0])
    assert model_mismatch(p, card) == []
    prov = p["provenance"]
    assert prov["device"] == "cuda" and "H100" in prov["device_name"]
    assert prov["cuda_version"] and prov["torch_version"] and prov["date"].startswith("2026-")
    assert prov["command"].startswith("python -m profiler --model") and "--grid full" in \
        prov["command"]
    assert "CUDA graph replays" in prov["execution"] and "timed eagerly" not in prov["execution"]
    assert p["settings"]["timer"] == "cuda_graph_replay" and p["settings"]["block_size"] == 16
    assert p["attention"]["fallback"] is None and p["attention"]["self_check_rel_err"] < 2e-2
    # the knobs of scenarios/quickstart.yaml fit inside the grids
    assert p["linear"]["tokens"][-1] == 8192 and p["attn_decode"]["batch"][-1] == 256
    assert p["attn_prefill"]["ctx"][-1] == 8192 and p["attn_decode"]["ctx"][-1] == 8192
    # composing the profile's own held-out whole steps from its grids: within 40 %, median 10 %
    model = ProfileLatency(p, source=name)
    errs = sorted(abs(model.step_time(plan(map(tuple, h["prefill"]), h["decode_ctx"],
                                           h["num_sampled"])) - h["seconds"]) / h["seconds"]
                  for h in p["heldout"])
    assert len(errs) == 12 and errs[len(errs) // 2] < 0.10 and errs[-1] < 0.40


def test_bare_shipped_name_resolves_and_unknown_name_lists_the_shipped(tmp_path):
    from simserve.latency.profile import resolve_profile_path
    assert resolve_profile_path(SHIPPED, tmp_path).name == f"{SHIPPED}.json"
    assert resolve_profile_path(f"{SHIPPED}.json", tmp_path).name == f"{SHIPPED}.json"
    # a file beside the scenario wins over a shipped profile of the same name
    dump(synthetic_profile(), tmp_path / f"{SHIPPED}.json")
    assert resolve_profile_path(f"{SHIPPED}.json", tmp_path) == tmp_path / f"{SHIPPED}.json"
    assert resolve_profile_path("no-such-profile", tmp_path) is None
    with pytest.raises(simserve.ConfigError, match=f"latency.path.*shipped: .*{SHIPPED}"):
        simserve.run(scenario(tmp_path, "no-such-profile"))


def test_shipped_scenario_runs_from_the_command_line(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "simserve", "run",
                        str(REPO / "scenarios" / "tiny_cpu_profile.yaml"), "--out",
                        str(tmp_path / "out"), "--no-report", "--quiet"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json as _json
    summary = _json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["latency_model"].startswith("profile (tiny-llama-45m on ")
    assert summary["completed"] == summary["num_requests"] > 0


def test_mismatched_profile_is_one_clear_error_on_the_command_line(tmp_path, capsys):
    from simserve.cli import main
    dump(synthetic_profile(), tmp_path / "p.json")
    path = tmp_path / "s.yaml"
    import yaml
    path.write_text(yaml.safe_dump({
        "model": "Llama-3.1-8B", "hardware": "H100-SXM",
        "latency": {"model": "profile", "path": "p.json"},
        "workload": {"arrival": "poisson", "rate": 5, "num_requests": 5,
                     "prompt": {"dist": "fixed", "value": 10},
                     "output": {"dist": "fixed", "value": 2}}}))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "other model shapes" in err[0]
    assert "num_layers: profile 4, model 32" in err[0]


def test_h100_scenario_prices_the_quickstart_load_by_roofline_and_by_the_measured_profile():
    """The measured H100 profile is never faster than the constant-efficiency roofline (every
    kernel at 60 % / 80 % of peak). The `h100` curve set, derived from this profile, lands near
    it (above by about the 2 ms per-step overhead the profile variant leaves out: 24.4 against
    20.9 ms median TPOT when written). The default roofline on H100 (`h100-vllm`, fitted to vLLM's
    runs, issue #29) is about 2x faster than the profile's FlexAttention kernels (11.0 ms median
    TPOT when written); the scenario runs the default and the profile."""
    import dataclasses
    from simserve.config import load_variants
    path = REPO / "scenarios" / "h100_profile_vs_roofline.yaml"
    variants = load_variants(path)
    assert [label for label, _ in variants] == ["roofline", "h100-profile"]
    results = {label: simserve.run(s) for label, s in variants}
    roof, prof = results["roofline"].summary, results["h100-profile"].summary
    s = variants[0][1]
    const = simserve.run(s.replace(latency=dataclasses.replace(s.latency,
                                                               efficiency="constant"))).summary
    h100 = dict(load_variants(path, ["hardware={spec: H100-SXM, efficiency: h100}"]))
    derived = simserve.run(h100["roofline"]).summary
    assert roof["completed"] == prof["completed"] == const["completed"] == 1000
    assert derived["completed"] == 1000
    assert prof["median_tpot_ms"] > const["median_tpot_ms"]
    assert prof["median_ttft_ms"] > const["median_ttft_ms"]
    for key in ("median_tpot_ms", "median_ttft_ms"):
        assert 1.0 < derived[key] / prof[key] < 1.25, key
    assert 1.5 <= prof["median_tpot_ms"] / roof["median_tpot_ms"] <= 2.5
    assert "h100-vllm" in roof["latency_model"] and "h100-vllm" not in derived["latency_model"]
    assert "efficiency curves" in derived["latency_model"]
    assert "H100" in results["h100-profile"].summary["latency_model"]


def test_model_section_is_written_from_the_card_as_the_shipped_profiles_have_it():
    # ModelCard is the one definition of the shapes: the profile's model section is built from
    # it with the same keys, in the same order, as the shipped (measured) profiles
    from simserve.cards import load_model
    from simserve.latency.schema import MODEL_KEYS, load_profile, model_card, model_shapes
    shipped = load_profile(REPO / "simserve" / "data" / "profiles"
                           / "tiny-llama-45m_cpu-epyc-2core_bf16_1t.json")
    card = load_model("tiny-llama-45m")
    written = model_shapes(card, shipped["model"]["dtype_bytes"])
    assert list(written.items()) == list(shipped["model"].items())
    assert set(MODEL_KEYS) < set(written) and "max_position_embeddings" not in written
    back = model_card(shipped["model"], max_position_embeddings=card.max_position_embeddings)
    assert model_shapes(back, written["dtype_bytes"]) == written


def test_steps_a_stretch_prices_and_drops_are_not_counted():
    """A stretch prices a step or two past the next arrival and drops them (stepping prices
    them once, in the plan that admits the arrival): the grid lookups of the dropped steps
    are taken back, so the warnings read the same fast-forwarded and stepped. A (prompt
    12,000) decodes past the Llama-3.1-8B profile's contexts: every decode extrapolates; B
    arrives exactly as A's step 5 starts, then at points inside steps."""
    from simserve.engine import Replica, round_robin, simulate
    from simserve.kv.blocks import BlockManager
    from simserve.sched import POLICIES, SchedulerLimits
    from simserve.workload.spec import RequestSpec
    limits = SchedulerLimits(max_num_seqs=64, max_num_batched_tokens=16384,
                             enable_chunked_prefill=True)
    path = "simserve/data/profiles/Llama-3.1-8B_H100-SXM_bf16.json"

    def run(specs, fast):
        latency = ProfileLatency.from_file(path)
        sched = POLICIES["vllm_v1"](limits, BlockManager(5000, 16), None, 0)
        rec = simulate(specs, [Replica(0, sched, latency, 32768)], round_robin(),
                       fast_forward=fast)
        return rec.columns()["start_s"].tolist(), latency.extrapolated

    a = RequestSpec(0, 0.0, 12000, 300)
    starts, alone = run([a], False)
    assert alone["attn_decode"] == 299          # every decode step of A's 300 tokens but one
    for t in (starts[5], starts[5] + 1e-4, starts[40] - 1e-4, starts[41]):
        specs = [a, RequestSpec(1, t, 9000, 5)]
        (fast_starts, fast), (slow_starts, slow) = run(specs, True), run(specs, False)
        assert fast_starts == slow_starts and fast == slow, t


def test_forget_prices_takes_back_what_a_stretch_counted():
    m = ProfileLatency(curved_decode_profile())
    p = plan(decode=[1100, 1150], sampled=2)          # beyond the grid: each step counts
    prices = m.decode_stretch(p)
    prices(0, 5)
    assert m.extrapolated["attn_decode"] == 5
    m.forget_prices(prices, 3, 2)                     # steps 3 and 4 dropped
    assert m.extrapolated["attn_decode"] == 3
    m.forget_prices(prices, 0, 3)
    assert not m.extrapolated and not m.warnings()


def test_cpu_part_is_the_breakdowns_engine_costs():
    """``cpu_s`` (what async scheduling overlaps with the step before) is the breakdown's
    overhead + admission + output_tokens: the scenario's and the calibration's step overhead,
    a request admitted (a chunk at context 0), a sampled row, padded rows included."""
    prof = curved_decode_profile()
    prof["calibration"] = {"step_overhead_s": 1e-3, "per_output_token_s": 2e-5,
                           "admission_s": 3e-4}
    m = ProfileLatency(prof, step_overhead_s=5e-4, per_output_token_s=1e-5)
    for p in (plan(prefill=[(16, 0), (8, 40)], decode=[100, 200], sampled=3),
              plan(decode=[100, 200], sampled=2)._replace(padding=3)):
        parts = m.breakdown(p)
        want = parts["overhead"] + parts["admission"] + parts["output_tokens"]
        assert m.cpu_s(p) == pytest.approx(want, rel=1e-12)
    # by hand: overhead 1.5 ms, one admission 0.3 ms, 3 sampled rows at 30 µs
    assert m.cpu_s(plan(prefill=[(16, 0), (8, 40)], decode=[100, 200], sampled=3)) == \
        pytest.approx(1.5e-3 + 3e-4 + 3 * 3e-5)
    assert m.cpu_s(plan()) == 0.0


def test_a_profile_of_another_device_is_named_in_the_runs_warnings():
    # an H100 profile on hardware A100-80GB ran with the H100's step times and said nothing
    import simserve
    from simserve.cards import load_hardware
    from simserve.latency.profile import other_device
    h100 = "NVIDIA H100 80GB HBM3"
    assert other_device("cuda", h100, load_hardware("H100-SXM")) == ""
    assert other_device("cpu", "AMD EPYC", load_hardware("cpu-epyc-2core")) == ""
    for card in ("A100-80GB", "H200", "L40S", "cpu-epyc-2core"):
        assert other_device("cuda", h100, load_hardware(card)).startswith(
            f"latency.path: the profile was measured on {h100}, but hardware is {card}")
    assert other_device("cpu", "AMD EPYC", load_hardware("H100-SXM"))
    # an inline card is matched by the shipped card it is made from, not its own name; the
    # family is a whole word of the device's name (GH200 is not an H200)
    assert other_device("cuda", h100, load_hardware({"spec": "H100-SXM", "name": "mine"})) == ""
    assert other_device("cuda", h100, load_hardware({"spec": "A100-80GB", "name": "nvidia-x"}))
    assert other_device("cuda", "NVIDIA GH200 480GB", load_hardware("H200"))
    # the form factor and, where both name one, the memory size set cards of a family apart
    # (device names as torch.cuda.get_device_name gives them)
    for card, device, same in [
            ("H100-SXM", "NVIDIA H100 PCIe", False), ("H100-SXM", "NVIDIA H100 NVL", False),
            ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
            ("A100-40GB", "NVIDIA A100-SXM4-80GB", False),
            ("A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", True),
            ("A100-80GB-PCIe", "NVIDIA A100-SXM4-80GB", False),
            ("A100-80GB", "NVIDIA A100 80GB PCIe", False), ("H200", "NVIDIA H200", True),
            ("L40S", "NVIDIA L40S", True), ("L40S", "NVIDIA L40", False)]:
        assert (other_device("cuda", device, load_hardware(card)) == "") is same, (card, device)
    quick = ["workload.num_requests=30", "latency.model=profile",
             "latency.path=Llama-3.1-8B_H100-SXM_bf16"]
    from pathlib import Path
    quickstart = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
    r = simserve.run(quickstart, overrides=[*quick, "hardware=A100-80GB"])
    assert r.warnings[0].startswith(f"latency.path: the profile was measured on {h100}, but "
                                    "hardware is A100-80GB")
    assert r.summary["warnings"] == r.warnings
    same = simserve.run(quickstart, overrides=quick)
    assert not any("measured on" in w for w in same.warnings)
