"""Issue #17's efficiency curves composed with issue #18's models: MoE layers, MLA, FP8 GEMMs,
speculative verifies, and #17's padding and overlapped swaps, priced on the curves exactly as
the constant roofline prices them, each term divided by its class's η (hand-checked); cards
that mix both branches' fields; fast-forward == stepping on a curved MoE roofline."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cards import ModelCard, load_hardware, load_model, serving_card
from simserve.errors import ConfigError
from simserve.latency import RooflineModel
from simserve.latency.efficiency import Curve1D, Curve2D, EfficiencyCurves, load_curves
from simserve.sched.plan import StepPlan

TOY_MOE = {"name": "toy-moe", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
           "head_dim": 16, "intermediate": 128, "vocab": 1000, "max_position_embeddings": 2048,
           "experts": 4, "experts_per_token": 2, "expert_intermediate": 32}
TOY_HW = {"name": "toy-gpu", "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e11,
          "mem_bytes": 10_000_000, "interconnect_bandwidth": 1e10, "host_link_bandwidth": 1e9,
          "peak_flops_fp8": 2e12}
H100 = load_hardware("H100-SXM")
H100_CURVES = load_curves("h100")


def _flat(eta: float = 1.0, gemm: Curve1D | None = None, **kw) -> EfficiencyCurves:
    """A curve set with the same η everywhere (or a given GEMM curve): terms by hand."""
    one = Curve1D((0.0,), (eta,))
    grid = Curve2D((0.0,), (0.0,), ((eta,),))
    return EfficiencyCurves("flat", "test", gemm or one, grid, grid, one,
                            kw.get("layer_s", 0.0), kw.get("pw_eta", 1.0), 10e-6)


def _toy(card=None, curves=None, **kw):
    return RooflineModel(card or load_model(TOY_MOE), load_hardware(TOY_HW), curves=curves,
                         **kw)


def _decode(ctx, q=None):
    ids = tuple(range(len(ctx)))
    return StepPlan(ids, tuple(q or (1,) * len(ctx)), (), (), tuple(ctx), len(ctx),
                    decode_q=tuple(q or ()))


# ---------------------------------------------------------------- MoE on the curves

def test_moe_terms_are_the_constant_terms_over_the_gemm_curve():
    """Router and shared expert at the GEMM curve's η for the step's tokens, the grouped
    expert GEMMs at its η for the rows one touched expert computes, the all-to-all as is."""
    # GEMM η = 0.25 at one row, 0.5 at 2 and beyond (log2 axis: sizes 1 and 2)
    gemm = Curve1D((0.0, 1.0), (0.25, 0.5))
    card = dataclasses.replace(load_model(TOY_MOE), shared_expert_intermediate=32)
    const = _toy(card, flops_efficiency=1.0, bandwidth_efficiency=1.0,
                 data_parallel_size=2, enable_expert_parallel=True)
    curved = _toy(card, _flat(gemm=gemm), data_parallel_size=2, enable_expert_parallel=True)
    # one token per DP rank: N = 2 tokens, 4 routed rows, 2 on this rank (EP 2, 2 experts);
    # touched = 2 · (1 − (1 − 2/4)^2) = 1.5 experts → 2 / 1.5 = 1.33 rows each:
    # η = 0.25 + 0.25 · log2(1.333) = 0.3538
    c, k = const.moe_terms(1), curved.moe_terms(1)
    eta_rows = 0.25 + 0.25 * math.log2(2 / 1.5)
    assert k["experts"] == pytest.approx(c["experts"] / eta_rows, rel=1e-12)
    assert k["router"] == pytest.approx(c["router"] / 0.25, rel=1e-12)     # 1 token
    assert k["shared"] == pytest.approx(c["shared"] / 0.25, rel=1e-12)
    assert k["all2all"] == c["all2all"] > 0                                  # the link
    # 1000 tokens: every η at 0.5 (rows per expert ≥ 2)
    c, k = const.moe_terms(1000), curved.moe_terms(1000)
    for term in ("experts", "router", "shared"):
        assert k[term] == pytest.approx(c[term] / 0.5, rel=1e-12)


def test_moe_linear_sums_attention_dense_and_moe_layers_on_the_curves():
    """An MoE card with a dense first layer: attention linears in both layers, the dense MLP
    in the first, the MoE block in the second; every GEMM over η(n)."""
    card = dataclasses.replace(load_model(TOY_MOE), first_dense_layers=1)
    const = _toy(card, flops_efficiency=1.0, bandwidth_efficiency=1.0)
    curved = _toy(card, _flat(0.5))
    n = 7
    ops = [max(n * f, w + n * a) for f, w, a in const._linear]
    moe = const.moe_terms(n)
    expected = (2 * sum(ops[:2]) / 0.5 + sum(ops[2:]) / 0.5
                + (moe["router"] + moe["shared"] + moe["experts"]) / 0.5 + moe["all2all"])
    assert curved._linear_s(n) == pytest.approx(expected, rel=1e-12)


def test_fp8_gemms_run_at_the_fp8_peak_on_the_curves():
    """W8A8 linears: FLOPs at peak_flops_fp8 (2e12 here) and 1-byte weights, then over η."""
    fp8 = serving_card(load_model(TOY_MOE), "fp8_per_tensor")
    curved = _toy(fp8, _flat(0.5))
    # one linear op (QKV) of a compute-bound step: 2 · n · W / 2e12 / 0.5
    f, w, a = curved._linear[0]
    W = 64 * (64 + 2 * 32)
    assert f == pytest.approx(2 * W / 2e12, rel=1e-12)
    assert w == pytest.approx(W * 1 / 1e11, rel=1e-12)                      # 1 B per weight
    bf16 = _toy(None, _flat(0.5))
    assert curved.moe_terms(10_000)["experts"] == pytest.approx(
        bf16.moe_terms(10_000)["experts"] / 2, rel=1e-12)                   # compute bound


def test_mla_decode_and_prefill_on_the_curves():
    """DeepSeek-V3's absorbed decode and up-projecting prefill, each over its curve."""
    card = load_model("DeepSeek-V3")
    kw = dict(tensor_parallel_size=8, enable_expert_parallel=True)
    const = RooflineModel(card, H100, flops_efficiency=1.0, bandwidth_efficiency=1.0, **kw)
    curved = RooflineModel(card, H100, curves=_flat(0.5), **kw)
    assert curved._dec_flop_s == const._dec_flop_s and curved._ctx_flop_s == const._ctx_flop_s
    d = _decode([1000, 3000])
    assert curved.breakdown(d)["attention_decode"] == pytest.approx(
        const.breakdown(d)["attention_decode"] / 0.5, rel=1e-12)
    chunk = StepPlan((1,), (512,), (512,), (1024,), (), 1)
    assert curved.breakdown(chunk)["attention_prefill"] == pytest.approx(
        const.breakdown(chunk)["attention_prefill"] / 0.5, rel=1e-12)
    # the pointwise term writes one latent row (576 values) per token and layer, not K and V
    h, H, r = 7168, 128 // 8, 64
    per_token = (10 * h + 2 * (H * r + r) + 2 * (1536 + 512)) * 2 + 576 * (2 + 2)
    assert curved._pw_tok_s == pytest.approx(61 * per_token / 3.35e12, rel=1e-12)


# ---------------------------------------------------------------- speculative verify

def test_verify_step_on_the_curves_is_the_constant_verify_over_eta():
    const = _toy(None, flops_efficiency=1.0, bandwidth_efficiency=1.0)
    curved = _toy(None, _flat(0.5))
    v = _decode([100, 20], q=[4, 2])
    c, k = const.breakdown(v), curved.breakdown(v)
    # 6 tokens through the GEMMs, 6 rows scored (every verified position), q-token chunks
    for term in ("linear", "attention_decode", "lm_head"):
        assert k[term] == pytest.approx(c[term] / 0.5, rel=1e-12)
    assert k["pointwise"] == pytest.approx(6 * curved._pw_tok_s, rel=1e-12)


def test_verify_of_one_token_prices_as_a_decode_on_the_shipped_curves():
    roof = RooflineModel(load_model("Qwen3-30B-A3B"), H100, curves=H100_CURVES)
    assert roof.step_time(_decode([300, 50], q=[1, 1])) == roof.step_time(_decode([300, 50]))
    assert roof.step_time(_decode([300, 50], q=[3, 1])) > roof.step_time(_decode([300, 50]))


# ---------------------------------------------------------------- padding, overlapped swaps

def test_padding_and_overlapped_swaps_on_a_curved_moe_roofline():
    roof = RooflineModel(load_model("Qwen3-30B-A3B"), H100, curves=H100_CURVES)
    padded = _decode([700])._replace(padding=2)
    assert roof.step_time(padded) == roof.step_time(
        StepPlan((1, 2, 3), (1, 1, 1), (), (), (700,) * 3, 3))
    # overlapped swaps hidden behind the step cost nothing; a long transfer what it outlasts
    step = roof.step_time(_decode([700]))
    assert roof.step_time(_decode([700])._replace(swap_out_blocks=1,
                                                  overlapped_swap_blocks=1)) == step
    many = _decode([700])._replace(swap_out_blocks=10_000, overlapped_swap_blocks=10_000)
    assert roof.step_time(many) == pytest.approx(10_000 * roof._swap_block_s, rel=1e-12)
    # stretches of those shapes are priced step by step, bit-identical
    for p in (padded, many):
        assert roof.decode_stretch(p)(0, 3) == [
            roof.step_time(p._replace(decode_ctx=tuple(c + i for c in p.decode_ctx)))
            for i in range(3)]


def test_padded_verify_rows_feed_one_token_each():
    p = _decode([100], q=[3])._replace(padding=2)
    full = p.as_computed()
    assert full.decode_ctx == (100, 100, 100) and full.decode_q == (3, 1, 1)
    assert full.num_sampled == 3 and full.padding == 0


@settings(max_examples=30, deadline=None)
@given(decode=st.lists(st.integers(0, 5000), min_size=1, max_size=30),
       tp=st.sampled_from([1, 2]), steps=st.integers(1, 20),
       prefill=st.sampled_from([(), ((64, 0),), ((700, 300),)]),
       mla=st.booleans())
def test_curved_moe_stretch_is_bit_identical_to_step_time(decode, tp, steps, prefill, mla):
    card = load_model("DeepSeek-V3") if mla else serving_card(
        load_model("Qwen3-30B-A3B"), "fp8_per_block", "fp8")
    roof = RooflineModel(card, H100, curves=H100_CURVES, tensor_parallel_size=tp,
                         enable_expert_parallel=tp > 1 and not mla)
    n = len(prefill) + len(decode)
    p = StepPlan(tuple(range(n)), tuple(q for q, _ in prefill) + (1,) * len(decode),
                 tuple(q for q, _ in prefill), tuple(c for _, c in prefill), tuple(decode), n)
    expected = [roof.step_time(p._replace(decode_ctx=tuple(c + i for c in decode)))
                for i in range(steps)]
    assert roof.decode_stretch(p)(0, steps) == expected
    if not prefill:
        assert roof.decode_stretch_sum(len(decode), sum(decode))(0, steps) == expected


@settings(max_examples=40, deadline=None)
@given(decode=st.lists(st.integers(0, 30000), min_size=1, max_size=40),
       curves=st.sampled_from(["h100", "a100"]), tp=st.sampled_from([1, 1, 2]),
       steps=st.integers(1, 300), prompt=st.integers(1, 5000))
def test_dense_stretch_and_join_steps_are_bit_identical_to_step_time(decode, curves, tp, steps,
                                                                     prompt):
    """The dense roofline's fast paths (``_curve_decode_prices``' memory-bound loop, which
    keeps the curve's bracket from step to step; ``mixed_step_sum``) against ``step_time``,
    from contexts below the curve's first point to past its last."""
    hw = load_hardware({"h100": "H100-SXM", "a100": "A100-80GB"}[curves])
    roof = RooflineModel(load_model("Llama-2-7B"), hw, curves=load_curves(curves),
                         tensor_parallel_size=tp)
    b = len(decode)
    p = StepPlan(tuple(range(b)), (1,) * b, (), (), tuple(decode), b)
    expected = [roof.step_time(p._replace(decode_ctx=tuple(c + i for c in decode)))
                for i in range(steps)]
    # (a stretch elsewhere on the curve first: the loop keeps its bracket from call to call;
    # it too prices as stepping does)
    other = (3 * decode[0] + 7, *(3 * c for c in decode[1:]))
    assert roof.decode_stretch_sum(b, sum(other))(0, 3) == [
        roof.step_time(p._replace(decode_ctx=tuple(c + i for c in other))) for i in range(3)]
    fast = roof.decode_stretch_sum(b, sum(decode))
    assert tp > 1 or fast.func.__name__ == "memory_bound"      # (the loop under test)
    assert fast(0, steps) == expected
    assert [d for i in range(0, steps, 7) for d in fast(i, min(7, steps - i))] == expected
    assert roof.decode_stretch_sum(b, sum(decode))(steps // 2, steps - steps // 2) == \
        expected[steps // 2:]
    mixed = StepPlan(tuple(range(b + 1)), (1,) * b + (prompt,), (prompt,), (0,), tuple(decode),
                     b + 1)
    assert roof.mixed_step_sum(b, sum(decode), (prompt,), (0,)) == roof.step_time(mixed)
    plain = RooflineModel(load_model("Llama-2-7B"), hw, tensor_parallel_size=tp)
    assert plain.mixed_step_sum(b, sum(decode), (prompt,), (0,)) == plain.step_time(mixed)
    two = StepPlan(tuple(range(b + 2)), (1,) * b + (prompt, 7), (prompt, 7), (0, 0),
                   tuple(decode), b + 2)
    assert roof.mixed_step_sum(b, sum(decode), (prompt, 7), (0, 0)) == roof.step_time(two)


# ---------------------------------------------------------------- fast-forward == stepping

from tests.property.test_properties import _by_replica, run_checked, scenarios  # noqa: E402


def _curved_moe():
    return RooflineModel(serving_card(load_model("Qwen3-30B-A3B"), "fp8_per_block", "fp8"),
                         H100, tensor_parallel_size=2, enable_expert_parallel=True,
                         expert_balancedness=0.8, curves=H100_CURVES)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_stepping_on_the_curved_moe_roofline(case):
    fast, _, _ = run_checked(*case, fast_forward=True, latency=_curved_moe())
    slow, _, _ = run_checked(*case, fast_forward=False, latency=_curved_moe())
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.finish_s == b.finish_s and a.token_times == b.token_times


# ---------------------------------------------------------------- cards of both branches

def _card(**kw) -> ModelCard:
    return load_model({**TOY_MOE, **kw})


def test_dense_layer_counts_plain_mlp_biases_layernorm_and_attention_variants():
    """OPT's plain MLP, all-linear biases and LayerNorm together with Qwen3's q/k norms and
    gpt-oss's sinks, in the dense first layer of an MoE card, counted by hand."""
    c = _card(first_dense_layers=1, mlp="plain", norm="layer", linear_bias=True,
              qk_norm=True, attention_sinks=True, learned_positions=10)
    h, i, q, kv = 64, 128, 64, 32
    attention = h * (q + 2 * kv) + q * h
    small = (q + 2 * kv) + h + 2 * 16 + 4      # qkv and o biases, q/k norms, 4 sinks
    assert c.attention_small_params == small
    mlp = 2 * h * i + i + h                     # fc1, fc2 and their biases
    assert c.layer_params == attention + small + mlp + 2 * 2 * h   # two LayerNorms
    expert = 3 * h * 32
    moe = attention + small + h * 4 + 4 * expert + 2 * 2 * h
    assert c.moe_layer_params == moe
    assert c.num_params == 1000 * h + 10 * h + c.layer_params + moe + 2 * h + 1000 * h
    # weight bytes: attention and the dense MLP's matrices as linears, the rest at 2 B
    assert c.weight_bytes == c.num_params * 2
    fp8 = serving_card(c, "fp8_per_tensor")
    linear = 2 * attention + 2 * h * i
    assert fp8.weight_bytes == round(linear * 1 + 4 * expert * 1 + (c.num_params - linear
                                                                    - 4 * expert) * 2)


def test_card_round_trips_with_both_sets_of_optional_keys():
    c = _card(first_dense_layers=1, mlp="plain", norm="layer", linear_bias=True,
              learned_positions=10, qk_norm=True, shared_expert_intermediate=16,
              weight_dtype="bf16")
    d = c.to_dict()
    for key in ("mlp", "norm", "linear_bias", "learned_positions", "experts", "qk_norm",
                "shared_expert_intermediate", "first_dense_layers", "weight_dtype"):
        assert key in d
    assert load_model(d) == c
    plain = load_model("Llama-3.1-8B").to_dict()
    assert not {"mlp", "norm", "experts", "attention"} & set(plain)     # defaults unwritten


def test_hardware_round_trips_efficiency_and_fp8_keys():
    from simserve.cards import load_hardware
    h100 = load_hardware("H100-SXM")
    assert h100.efficiency == "h100-vllm" and h100.peak_flops_fp8 == 1979e12
    d = h100.to_dict()
    assert d["efficiency"] == "h100-vllm" and d["scaleout_bandwidth"] == 50e9
    assert load_hardware(d) == h100
    assert "efficiency" not in load_hardware(TOY_HW).to_dict()


@pytest.mark.parametrize("change, field, words", [
    ({"mlp": "plain"}, "model.mlp", "routed experts are gated"),
    ({"mlp": "swiglu"}, "model.mlp", "swiglu"),
    ({"attention": "mla", "kv_heads": 1, "head_dim": 24, "kv_lora_rank": 16,
      "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "linear_bias": True},
     "model.linear_bias", "MLA"),
])
def test_bad_combinations_are_named(change, field, words):
    with pytest.raises(ConfigError) as e:
        load_model({**TOY_MOE, **change}, "model")
    assert e.value.field == field and words in e.value.message
