"""Roofline step latency and the hand-computable latency models."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.cards import load_hardware, load_model
from simserve.errors import ConfigError
from simserve.kv.capacity import kv_block_bytes
from simserve.latency import ConstantLatency, LatencyModel, LinearLatency, RooflineModel
from simserve.sched.plan import StepPlan

LLAMA = load_model("Llama-3.1-8B")
H100 = load_hardware("H100-SXM")
EFF_F, EFF_B, OVERHEAD = 0.6, 0.8, 2e-3  # the documented defaults


def plan(prefill=(), decode=(), sampled=None, swap_out=0, swap_in=0) -> StepPlan:
    """A plan of prefill chunks [(q, ctx)] and decode contexts; every sequence samples."""
    ids = tuple(range(len(prefill) + len(decode)))
    return StepPlan(request_ids=ids,
                    num_new_tokens=tuple(q for q, _ in prefill) + (1,) * len(decode),
                    prefill_lens=tuple(q for q, _ in prefill),
                    prefill_ctx=tuple(c for _, c in prefill), decode_ctx=tuple(decode),
                    num_sampled=len(ids) if sampled is None else sampled,
                    swap_out_blocks=swap_out, swap_in_blocks=swap_in)


ROOF = RooflineModel(LLAMA, H100)


def test_is_a_latency_model_with_label():
    model: LatencyModel = ROOF
    assert model.label == "roofline (H100-SXM spec; estimate)"


def test_empty_plan_costs_nothing():
    assert ROOF.step_time(plan()) == 0.0
    assert sum(ROOF.breakdown(plan()).values()) == 0.0


def test_decode_batch_of_one_reads_the_weights_once():
    # every weight but the embedding table is read once: 16.06 GB − 1.05 GB embedding
    weights_read = LLAMA.weight_bytes - LLAMA.embedding_params * LLAMA.dtype_bytes
    expected = weights_read / (3.35e12 * EFF_B) + OVERHEAD  # ≈ 5.6 ms + 2 ms
    assert ROOF.step_time(plan(decode=[100])) == pytest.approx(expected, rel=0.02)


def test_breakdown_sums_to_step_time():
    p = plan(prefill=[(300, 200)], decode=[10, 500, 4000], swap_in=3)
    assert sum(ROOF.breakdown(p).values()) == pytest.approx(ROOF.step_time(p), rel=1e-12)


def test_long_prefill_is_compute_bound():
    n = 2048
    h, q, kv, i = 4096, 32 * 128, 8 * 128, 14336
    linear_params = h * (q + 2 * kv) + q * h + 3 * h * i
    # linear 2·n·params per layer; causal attention 4·heads·head_dim·n·(n + 1)/2 per layer
    flops = 32 * (2 * n * linear_params + 4 * 32 * 128 * n * (n + 1) / 2)
    compute_s = flops / (989e12 * EFF_F)                   # ≈ 49 ms
    weights_s = LLAMA.weight_bytes / (3.35e12 * EFF_B)     # ≈ 6 ms
    t = ROOF.step_time(plan(prefill=[(n, 0)], sampled=1)) - OVERHEAD
    assert weights_s < 0.15 * compute_s
    # the FLOPs term prices linear ops and attention; only the LM head's weight read is added
    assert compute_s <= t <= compute_s * 1.01


def test_swap_adds_exactly_blocks_times_bytes_over_bandwidth():
    base = plan(decode=[64] * 8)
    swapped = plan(decode=[64] * 8, swap_out=10, swap_in=5)
    expected = 15 * kv_block_bytes(LLAMA, 16) / 64e9
    assert ROOF.step_time(swapped) - ROOF.step_time(base) == pytest.approx(expected, rel=1e-9)
    # a swap-only step still pays the step overhead
    assert ROOF.step_time(plan(swap_out=1)) == pytest.approx(
        kv_block_bytes(LLAMA, 16) / 64e9 + OVERHEAD)


def test_tensor_parallel_is_faster_for_big_batches():
    tp2 = RooflineModel(LLAMA, H100, tensor_parallel_size=2)
    for p in (plan(decode=[2048] * 256), plan(prefill=[(8192, 0)])):
        assert tp2.step_time(p) < 0.7 * ROOF.step_time(p)
        assert tp2.breakdown(p)["allreduce"] > 0


def test_bad_tensor_parallel_size():
    with pytest.raises(ConfigError, match="^engine.tensor_parallel_size:"):
        RooflineModel(LLAMA, H100, tensor_parallel_size=3)


@pytest.mark.parametrize("curves", [None, "h100"])
def test_per_output_token_cost_by_hand(curves):
    """``per_output_token_s``: each sequence a step samples adds exactly that much CPU time (a
    prompt chunk that does not end its prompt samples nothing), in ``step_time``, in the
    breakdown's overhead, and in ``mixed_step_sum``'s price of a join step."""
    from simserve.latency.efficiency import load_curves
    kw = {"curves": load_curves(curves)} if curves else {}
    base = RooflineModel(LLAMA, H100, **kw)
    cpu = RooflineModel(LLAMA, H100, per_output_token_s=5e-4, **kw)
    # three decodes and a prompt chunk that does not finish its prompt: 3 sampled
    p = plan(prefill=[(256, 0)], decode=[100, 200, 300], sampled=3)
    assert cpu.step_time(p) - base.step_time(p) == pytest.approx(3 * 5e-4, abs=1e-12)
    assert cpu.breakdown(p)["overhead"] == pytest.approx(2e-3 + 3 * 5e-4, abs=1e-15)
    assert sum(cpu.breakdown(p).values()) == pytest.approx(cpu.step_time(p), rel=1e-12)
    # the CPU part async scheduling overlaps with the step before: the same overhead
    assert cpu.cpu_s(p) == cpu.breakdown(p)["overhead"] and base.cpu_s(p) == 2e-3
    # a join step: two decodes (contexts 100 + 300) and one whole prompt of 64 tokens
    joined = plan(prefill=[(64, 0)], decode=[400, 0])
    assert cpu.mixed_step_sum(2, 400, (64,), (0,)) == cpu.step_time(joined)
    assert cpu.mixed_step_sum(2, 400, (64, 32), (0, 0)) == cpu.step_time(
        plan(prefill=[(64, 0), (32, 0)], decode=[400, 0]))
    assert cpu.step_time(joined) - base.step_time(joined) == pytest.approx(1.5e-3, abs=1e-12)
    # a padded plan (static batching's finished rows, still computed) pays for its padded
    # rows as the plan the device computes does
    padded = plan(decode=[100, 200])._replace(padding=6)
    assert cpu.step_time(padded) == cpu.step_time(padded.as_computed())
    assert cpu.breakdown(padded)["overhead"] == pytest.approx(2e-3 + 8 * 5e-4, abs=1e-15)
    with pytest.raises(ValueError, match="per_output_token_s"):
        RooflineModel(LLAMA, H100, per_output_token_s=-1e-3)


def test_scenario_per_output_token_field():
    """``latency.per_output_token_ms`` reaches the roofline and the profile model; a negative
    or non-numeric value names the field."""
    from simserve.config import parse_scenario
    from simserve.engine.build import build_latency
    base = {"model": "Llama-3.1-8B", "hardware": "H100-SXM",
            "workload": {"num_requests": 1, "rate": 1.0, "prompt": {"dist": "fixed", "value": 10},
                         "output": {"dist": "fixed", "value": 10}}}
    assert build_latency(parse_scenario(base)).per_output_token_s == 0.0
    s = parse_scenario({**base, "latency": {"per_output_token_ms": 0.7}})
    assert build_latency(s).per_output_token_s == pytest.approx(7e-4)
    s = parse_scenario({**base, "latency": {"model": "profile", "per_output_token_ms": 0.7,
                                            "path": "Llama-3.1-8B_H100-SXM_bf16"}})
    assert build_latency(s).per_output_token_s == pytest.approx(7e-4)
    for bad in (-0.1, "fast", 1e20, float("nan")):
        with pytest.raises(ConfigError, match=r"^latency\.per_output_token_ms"):
            parse_scenario({**base, "latency": {"per_output_token_ms": bad}})
    with pytest.raises(ConfigError, match=r"latency\.per_output_token_ms"):
        parse_scenario({**base, "latency": {"model": "constant", "step_ms": 1,
                                            "per_output_token_ms": 0.5}})


def test_cpu_default_overhead_and_explicit_overhead():
    cpu = load_hardware("cpu-epyc-2core")
    tiny = load_model("tiny-llama-45m")
    assert RooflineModel(tiny, cpu).step_overhead_s == 8.4e-3
    assert RooflineModel(tiny, cpu, step_overhead_s=0.0).step_time(plan(decode=[1])) > 0


# ---------------------------------------------------------------- monotonicity

chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=4)
contexts = st.lists(st.integers(0, 32768), max_size=64)


@settings(max_examples=200, deadline=None)
@given(chunks, contexts, st.integers(0, 3), st.integers(1, 512))
def test_monotone_in_tokens_context_and_batch(prefill, decode, which, more):
    before = ROOF.step_time(plan(prefill, decode))
    if which == 0 and prefill:    # a longer prefill chunk
        prefill = [(prefill[0][0] + more, prefill[0][1])] + prefill[1:]
    elif which == 1 and prefill:  # more cached context under a chunk
        prefill = [(prefill[0][0], prefill[0][1] + more)] + prefill[1:]
    elif which == 2 and decode:   # a longer decode context
        decode = [decode[0] + more] + decode[1:]
    else:                         # one more decode sequence
        decode = decode + [more]
    assert ROOF.step_time(plan(prefill, decode)) >= before


# ---------------------------------------------------------------- simple models


def test_constant_latency():
    model = ConstantLatency(0.01)
    assert model.label == "constant"
    assert model.step_time(plan(decode=[1, 2, 3])) == 0.01
    assert model.step_time(plan()) == 0.0


def test_linear_latency():
    model = LinearLatency(base_s=0.005, per_token_s=1e-4, per_seq_s=1e-3)
    assert model.label == "linear"
    # 100 + 2 = 102 tokens, 3 sequences: 5 ms + 10.2 ms + 3 ms
    assert model.step_time(plan(prefill=[(100, 0)], decode=[7, 9])) == pytest.approx(0.0182)
    assert model.step_time(plan()) == 0.0


@settings(max_examples=60, deadline=None)
@given(decode=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
       tp=st.sampled_from([1, 2, 4]), steps=st.integers(1, 40),
       prefill=st.sampled_from([(), ((64, 0),)]), compute_bound=st.booleans(),
       extra_s=st.sampled_from([0.0, 0.0031]), per_token=st.sampled_from([0.0, 7e-4]))
def test_decode_stretch_is_bit_identical_to_step_time(decode, tp, steps, prefill, compute_bound,
                                                      extra_s, per_token):
    """Step i of a stretch priced at once equals step_time of that step's own plan, to the
    bit, with and without tensor parallelism, on memory-bound decode attention (H100) and on
    compute-bound (a device with 1/1000 of its FLOP/s), where the formulas take other paths,
    with and without a policy's extra step cost or a CPU cost per sampled sequence; and so
    does ``decode_stretch_sum`` of a plain decode step (the fast-forward equivalence rests on
    it)."""
    hw = dataclasses.replace(H100, peak_flops=H100.peak_flops / 1000) if compute_bound else H100
    model = RooflineModel(LLAMA, hw, tensor_parallel_size=tp, per_output_token_s=per_token)
    assert (model._kv_tok_s < model._attn_flop_s) == compute_bound
    p = plan(prefill=prefill, decode=decode)._replace(extra_s=extra_s)
    prices = model.decode_stretch(p)
    expected = [model.step_time(p._replace(decode_ctx=tuple(c + i for c in decode)))
                for i in range(steps)]
    assert prices(0, steps) == expected
    assert prices(steps // 2, steps - steps // 2) == expected[steps // 2:]
    if not prefill and not extra_s:
        assert model.decode_stretch_sum(len(decode), sum(decode))(0, steps) == expected


# ---------------------------------------------------------------- efficiency curves

from pathlib import Path  # noqa: E402

from simserve.errors import DataError  # noqa: E402
from simserve.latency.efficiency import Curve1D, Curve2D, load_curves, parse_curves  # noqa: E402

H100_CURVES = load_curves("h100")
CURVED = RooflineModel(LLAMA, H100, curves=H100_CURVES)


def test_curve_interpolates_in_log2_and_clamps():
    c = Curve1D((0.0, 2.0), (0.2, 0.6))          # sizes 1 and 4
    assert c(2) == pytest.approx(0.4)             # log2 2 = 1: half way
    assert c(0.5) == 0.2 and c(1) == 0.2          # clamped below
    assert c(1000) == 0.6                          # clamped above
    g = Curve2D((0.0, 1.0), (0.0, 1.0), ((0.1, 0.3), (0.5, 0.7)))   # sizes 1, 2; ctx 0, 1
    assert g(1, 0) == 0.1 and g(2, 1) == 0.7
    # size √2 (log2 0.5), ctx √2 − 1 (log2(1 + ctx) = 0.5): mean of the four corners
    assert g(2 ** 0.5, 2 ** 0.5 - 1) == pytest.approx(0.4)


def test_curves_price_an_op_at_roofline_over_eta():
    """A one-sequence decode step, every term by hand: each op's roofline at 100 % over its
    class's efficiency at its size."""
    L, h, d = 32, 4096, 2
    q, kv, i, v = 4096, 1024, 14336, 128256
    bw, c = 3.35e12, H100_CURVES
    gemm = L * (h * (q + 2 * kv) + q * h + 2 * h * i + i * h) * d   # weight bytes (n = 1:
    gemm += L * ((h + q + 2 * kv) + (q + h) + (h + 2 * i) + (2 * i + h)) * d   # + activations)
    ctx = 999                                       # attends 1000 tokens
    attn = L * (2 * kv * 1000 + 2 * q + 2 * kv) * d  # K, V read; Q, out, new K, V
    lm = (h * v * d + h * d + v * (d + 4))
    pw = L * (10 * h + 2 * (q + kv) + 4 * kv) * d
    expected = (gemm / bw / c.gemm(1) + attn / bw / c.attn_decode(8, 999)
                + lm / bw / c.lm_head(1) + L * c.pointwise_layer_s + pw / bw / c.pointwise_eta
                + 2e-3)
    assert CURVED.step_time(plan(decode=[ctx])) == pytest.approx(expected, rel=1e-9)
    assert CURVED.label == "roofline (H100-SXM spec, h100 efficiency curves; estimate)"


def test_curves_are_slower_than_the_constant_roofline_on_small_work():
    # a decode of one short sequence: small GEMMs ~70 % of HBM rate, short attention ~1 %
    small = plan(decode=[100])
    assert CURVED.step_time(small) > ROOF.step_time(small)
    b = CURVED.breakdown(small)
    assert set(b) == {"linear", "attention_prefill", "attention_decode", "lm_head",
                      "allreduce", "swap", "pointwise", "overhead"}
    assert sum(b.values()) == pytest.approx(CURVED.step_time(small), rel=1e-12)


# a curve set whose decode attention has one context column: η by batch alone
ONE_COLUMN = dataclasses.replace(H100_CURVES, attn_decode=Curve2D(
    H100_CURVES.attn_decode.rows, (0.0,), tuple((r[3],) for r in H100_CURVES.attn_decode.eta)))


@settings(max_examples=60, deadline=None)
@given(decode=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
       tp=st.sampled_from([1, 2, 4]), steps=st.integers(1, 30),
       prefill=st.sampled_from([(), ((64, 0),), ((700, 300),)]),
       extra_s=st.sampled_from([0.0, 0.0031]),
       start=st.sampled_from([0, 0, 7, 40_000, 300_000]),   # past the grid: clamped η
       curves=st.sampled_from([H100_CURVES, H100_CURVES, ONE_COLUMN]),
       per_token=st.sampled_from([0.0, 7e-4]))
def test_curves_decode_stretch_is_bit_identical_to_step_time(decode, tp, steps, prefill,
                                                             extra_s, start, curves, per_token):
    """The stretch prices (decode η, roofline and step sum written out in one loop) equal
    step_time step for step, from any step of the stretch on, with or without a CPU cost
    per sampled sequence."""
    model = RooflineModel(LLAMA, H100, tensor_parallel_size=tp, curves=curves,
                          per_output_token_s=per_token)
    p = plan(prefill=prefill, decode=decode)._replace(extra_s=extra_s)
    expected = [model.step_time(p._replace(decode_ctx=tuple(c + i for c in decode)))
                for i in range(start, start + steps)]
    assert model.decode_stretch(p)(start, steps) == expected
    if not prefill and not extra_s:
        assert model.decode_stretch_sum(len(decode), sum(decode))(start, steps) == expected


def test_shipped_curves_are_valid_and_bad_ones_are_refused():
    for name in ("a100", "h100"):
        c = load_curves(name)
        assert 0 < min(c.gemm.eta) and max(c.gemm.eta) <= 1
        assert "derive_efficiency.py" in c.source
    raw = json.loads((Path(__file__).resolve().parents[2] / "simserve/data/efficiency/h100.json")
                     .read_text())
    raw["gemm"]["eta"][0] = 1.5
    with pytest.raises(DataError, match="not in"):
        parse_curves(raw, "bad.json")


def test_shipped_curves_are_reproduced_from_their_sources():
    """The data files are derived, never edited: re-deriving gives the same bytes (the a100
    set needs Vidur's profiles under /work/shared, read-only; skipped where absent)."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "benchmarks/derive_efficiency.py", "--check"],
                         cwd=root, capture_output=True, text=True)
    assert "h100.json: same" in out.stdout, out.stdout + out.stderr
    if Path("/work/shared/vidur-profiles").exists():
        assert out.returncode == 0 and "a100.json: same" in out.stdout, out.stdout


def test_scenario_efficiency_field():
    from simserve.config import parse_scenario
    from simserve.engine.build import build_latency
    base = {"model": "Llama-3.1-8B", "hardware": "H100-SXM",
            "workload": {"num_requests": 1, "rate": 1.0, "prompt": {"dist": "fixed", "value": 10},
                         "output": {"dist": "fixed", "value": 10}}}
    s = parse_scenario(base)
    assert "efficiency curves" in build_latency(s).label            # the default
    s = parse_scenario({**base, "latency": {"efficiency": "constant"}})
    assert build_latency(s).label == "roofline (H100-SXM spec; estimate)"
    s = parse_scenario({**base, "latency": {"flops_efficiency": 0.5}})   # implies constant
    assert build_latency(s).label == "roofline (H100-SXM spec; estimate)"
    with pytest.raises(ConfigError, match=r"latency\.flops_efficiency"):
        parse_scenario({**base, "latency": {"efficiency": "curves", "flops_efficiency": 0.5}})
    s = parse_scenario({**base, "hardware": "L40S", "latency": {"efficiency": "curves"}})
    with pytest.raises(ConfigError, match=r"latency\.efficiency"):
        build_latency(s)
    with pytest.raises(ConfigError, match=r"hardware\.efficiency"):
        parse_scenario({**base, "hardware": {"spec": "H100-SXM", "efficiency": "nope"}})


def test_frontend_delay_moves_ttft_and_e2el_not_tpot():
    # latency.frontend_delay_ms: the request reaches the engine 24 ms after it is sent, so
    # every engine time is 24 ms later on the client's clock: TTFT and E2EL +24 ms exactly,
    # TPOT unchanged, the schedule itself unchanged (docs/fidelity.md, runner.collect)
    import simserve
    from simserve.config import parse_scenario
    raw = {"model": "OPT-13B", "hardware": "A100-80GB",
           "workload": {"arrival": "poisson", "rate": 2, "num_requests": 20,
                        "prompt": {"dist": "fixed", "value": 300},
                        "output": {"dist": "fixed", "value": 20}}}
    plain = simserve.run(parse_scenario(raw)).requests
    raw["latency"] = {"model": "roofline", "frontend_delay_ms": 24}
    r = simserve.run(parse_scenario(raw))
    delayed = r.requests
    assert r.summary["frontend_delay_ms"] == pytest.approx(24.0)
    assert (delayed.ttft_s - plain.ttft_s).to_numpy() == pytest.approx([0.024] * 20)
    assert (delayed.e2el_s - plain.e2el_s).to_numpy() == pytest.approx([0.024] * 20)
    assert delayed.tpot_s.to_numpy() == pytest.approx(plain.tpot_s.to_numpy())
    raw["latency"]["frontend_delay_ms"] = -1
    with pytest.raises(ConfigError, match="latency.frontend_delay_ms"):
        parse_scenario(raw)
    raw["latency"] = {"model": "constant", "step_ms": 10, "frontend_delay_ms": 5}
    with pytest.raises(ConfigError, match="frontend_delay_ms"):
        parse_scenario(raw)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 512), mean_ctx=st.floats(0, 400_000),
       curves=st.sampled_from([H100_CURVES, ONE_COLUMN]))
def test_decode_eta_is_the_curves_own_lookup(b, mean_ctx, curves):
    """_decode_eta (the curve lookup written out, as the stretch prices write it) gives the
    curve's own value: the row at b × KV heads, at log2(1 + mean context)."""
    import math
    model = RooflineModel(LLAMA, H100, curves=curves)
    kv_toks = max(b, round(b * (1 + mean_ctx)))
    row = curves.attn_decode.row(b * model._kv_heads)
    assert model._decode_eta(b, kv_toks) == row.at_log2(math.log2(kv_toks / b))


def test_step_terms_add_left_to_right_on_every_python():
    """step_time adds its terms left to right, as the stretch prices do: plain float
    additions. sum() would compensate rounding from Python 3.12 on (1e16 + 1.0 - 1e16 is 0.0
    in doubles, 1.0 compensated), and fast-forward would part from stepping in the last bit."""
    from simserve.latency.roofline_stretch import left_to_right
    assert left_to_right((1e16, 1.0, -1e16, 0.5, 0.25)) == 0.75   # (sum(): 1.75 on 3.12)
    p = plan(prefill=((300, 0),), decode=[100, 2000, 5])
    t = 0.0
    for v in CURVED._curve_parts(p):
        t += v
    assert CURVED.step_time(p) == t + CURVED.step_overhead_s


def test_allreduce_across_nodes_by_hand():
    # allreduce_collective: a TP group within a node keeps NVLink and the fixed latency; one
    # spanning N nodes goes at the scale-out rate and adds 2 (N - 1) scale-out hops (NCCL's
    # ring model: only the inter-node steps pay the network latency)
    from simserve.latency.roofline import allreduce_collective
    pcie = dataclasses.replace(load_hardware("A100-80GB-PCIe"), devices_per_node=4,
                               scaleout_bandwidth=12.5e9)
    assert pcie.scaleout_latency == pytest.approx(42e-6)      # the preset's (nccl-tests #82)
    assert allreduce_collective(pcie, 4, 10e-6) == (300e9, 10e-6)          # one node
    link, fixed = allreduce_collective(pcie, 8, 10e-6)                      # 2 nodes
    assert link == 12.5e9 and fixed == pytest.approx(10e-6 + 2 * 1 * 42e-6)   # 94 µs
    _, fixed16 = allreduce_collective(pcie, 16, 10e-6)                      # 4 nodes
    assert fixed16 == pytest.approx(10e-6 + 2 * 3 * 42e-6)                 # 262 µs
    # no scale-out link declared: priced as within a node (the behaviour before the field)
    bare = dataclasses.replace(pcie, scaleout_bandwidth=None)
    assert allreduce_collective(bare, 8, 10e-6) == (300e9, 10e-6)
    # a scale-out rate without a hop latency (the H100 preset): the rate only
    assert H100.scaleout_latency is None
    assert allreduce_collective(H100, 16, 10e-6) == (50e9, 10e-6)
    # the whole term, Falcon-180B (80 layers, hidden 14,848, bf16) at TP 8 over the 2 nodes,
    # a step of 10 tokens: each all-reduce moves 2 · 7/8 · 10 · 14,848 · 2 B = 519,680 B at
    # 12.5 GB/s = 41.574 µs, + 94 µs fixed = 135.574 µs; 2 a layer: 160 · 135.574 µs
    falcon = load_model("Falcon-180B")
    m = RooflineModel(falcon, pcie, tensor_parallel_size=8, allreduce_latency_s=10e-6)
    assert m.allreduce_s(10) == pytest.approx(160 * (519_680 / 12.5e9 + 94e-6))
    # within a node of 8 (the preset's default devices_per_node), NVLink and 10 µs only
    m8 = RooflineModel(falcon, load_hardware("A100-80GB-PCIe"), tensor_parallel_size=8,
                       allreduce_latency_s=10e-6)
    assert m8.allreduce_s(10) == pytest.approx(160 * (519_680 / 300e9 + 10e-6))


def test_frontend_delay_with_a_client_concurrency_gate():
    # max_concurrency 1, every request due at once: the client sends request k+1 when it has
    # request k's last token, i.e. h = 24 ms after the engine ends it (the engine's clock runs
    # h behind the client's), and request k+1 reaches the engine h after that. So on the
    # client's clock, arrival[k+1] = finish[k] exactly (before: finish[k] - 24 ms, a slot
    # freed at the engine's end), each request runs alone as without the delay (TTFT, E2EL
    # +24 ms, the same engine times), and the scheduling delay (first scheduled - arrival)
    # is the plain one + 24 ms: the engine sees the request h after it is sent.
    import numpy as np

    import simserve
    from simserve.config import parse_scenario
    raw = {"model": "OPT-13B", "hardware": "A100-80GB",
           "workload": {"arrival": "poisson", "rate": "inf", "num_requests": 4,
                        "max_concurrency": 1,
                        "prompt": {"dist": "fixed", "value": 300},
                        "output": {"dist": "fixed", "value": 20}}}
    plain = simserve.run(parse_scenario(raw)).requests.sort_values("arrival_s")
    raw["latency"] = {"model": "roofline", "frontend_delay_ms": 24}
    r = simserve.run(parse_scenario(raw)).requests.sort_values("arrival_s")
    assert np.allclose(r.arrival_s.to_numpy()[1:], r.finish_s.to_numpy()[:-1])
    assert np.allclose(plain.arrival_s.to_numpy()[1:], plain.finish_s.to_numpy()[:-1])
    assert np.allclose(r.ttft_s, plain.ttft_s + 0.024)
    assert np.allclose(r.e2el_s, plain.e2el_s + 0.024)
    assert np.allclose(r.first_scheduled_s - r.arrival_s,
                       plain.first_scheduled_s - plain.arrival_s + 0.024)


def test_a_concurrency_gate_refuses_differing_frontend_delays():
    # the client's gate frees a slot one front-end delay after an end: one delay for all
    import simserve
    from simserve.config import parse_scenario
    raw = {"model": "OPT-13B", "hardware": "A100-80GB",
           "cluster": {"groups": [
               {"name": "a", "latency": {"model": "roofline", "frontend_delay_ms": 24}},
               {"name": "b", "latency": {"model": "roofline", "frontend_delay_ms": 10}}]},
           "workload": {"arrival": "poisson", "rate": "inf", "num_requests": 4,
                        "max_concurrency": 2,
                        "prompt": {"dist": "fixed", "value": 300},
                        "output": {"dist": "fixed", "value": 20}}}
    with pytest.raises(ConfigError, match="one front-end delay") as e:
        simserve.run(parse_scenario(raw))
    assert e.value.field == "workload.max_concurrency"
    raw["cluster"]["groups"][1]["latency"]["frontend_delay_ms"] = 24
    assert len(simserve.run(parse_scenario(raw)).requests) == 4
