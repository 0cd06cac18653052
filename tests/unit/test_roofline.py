"""Roofline step latency and the hand-computable latency models."""

from __future__ import annotations

import dataclasses

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
    assert model.label == "roofline (H100-SXM spec)"


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
       extra_s=st.sampled_from([0.0, 0.0031]))
def test_decode_stretch_is_bit_identical_to_step_time(decode, tp, steps, prefill, compute_bound,
                                                      extra_s):
    """Step i of a stretch priced at once equals step_time of that step's own plan, to the
    bit, with and without tensor parallelism, on memory-bound decode attention (H100) and on
    compute-bound (a device with 1/1000 of its FLOP/s), where the formulas take other paths,
    with and without a policy's extra step cost; and so does ``decode_stretch_sum`` of a
    plain decode step (the fast-forward equivalence rests on it)."""
    hw = dataclasses.replace(H100, peak_flops=H100.peak_flops / 1000) if compute_bound else H100
    model = RooflineModel(LLAMA, hw, tensor_parallel_size=tp)
    assert (model._kv_tok_s < model._attn_flop_s) == compute_bound
    p = plan(prefill=prefill, decode=decode)._replace(extra_s=extra_s)
    prices = model.decode_stretch(p)
    expected = [model.step_time(p._replace(decode_ctx=tuple(c + i for c in decode)))
                for i in range(steps)]
    assert prices(0, steps) == expected
    assert prices(steps // 2, steps - steps // 2) == expected[steps // 2:]
    if not prefill and not extra_s:
        assert model.decode_stretch_sum(len(decode), sum(decode))(0, steps) == expected
