"""The profiler's MoE block and MLA decode (issue #18), on a tiny MoE shape on this CPU."""

from __future__ import annotations

import io

import pytest
import torch

from dataclasses import replace

from simserve.cards import ModelCard
from profiler.measure import Grid, Options, run_profile
from profiler.moe import (MoEBlock, MoEShapes, expected_experts_hit, measure_mla_decode,
                          mla_decode)
from simserve.latency.schema import model_mismatch, validate

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

MOE = MoEShapes(hidden_size=64, num_experts=8, experts_per_token=2, expert_intermediate=32,
                shared_expert_intermediate=16)
TOY = ModelCard(name="toy-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1,
                head_dim=16, intermediate_size=128, vocab_size=500, max_position_embeddings=4096,
                num_experts=8, experts_per_token=2, expert_intermediate=32,
                shared_expert_intermediate=16)
DENSE = replace(TOY, name="toy-dense", num_experts=0, experts_per_token=0, expert_intermediate=0,
                shared_expert_intermediate=0)


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_grouped_block_equals_the_per_token_loop(tokens):
    block = MoEBlock(MOE, torch.float32, "cpu", seed=3)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    y, hit = block.forward(x)
    torch.testing.assert_close(y, block.reference(x), rtol=1e-4, atol=1e-4)
    assert 2 <= hit <= min(8, 2 * tokens)


def test_one_token_touches_exactly_top_k_experts():
    block = MoEBlock(MOE, torch.bfloat16, "cpu")
    for seed in range(5):
        x = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed)).bfloat16()
        assert block.forward(x)[1] == 2
    assert expected_experts_hit(128, 8, 1) == pytest.approx(8.0)
    assert expected_experts_hit(128, 8, 16) == pytest.approx(82.4, abs=0.05)


def test_params_count_router_experts_shared():
    # router 64·8 + 8 experts × 3·64·32 + shared 3·64·16
    assert MOE.params == 512 + 8 * 6144 + 3072


def test_mla_decode_matches_dense_attention():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 24, generator=gen)
    lat = torch.randn(2, 7, 24, generator=gen)
    got = mla_decode(q, lat, 16, 24 ** -0.5)
    for b in range(2):
        for h in range(4):
            w = torch.softmax(lat[b] @ q[b, h] * 24 ** -0.5, dim=0)
            torch.testing.assert_close(got[b, h], w @ lat[b, :, :16], rtol=1e-5, atol=1e-5)


class _Stat:
    median = p10 = p90 = 1e-3


def test_mla_decode_grid_shape():
    out = measure_mla_decode(4, 16, 8, [1, 2], [5, 9], lambda fn: (fn(), _Stat())[1],
                             dtype=torch.float32, device="cpu")
    assert out["seconds"] == [[1e-3, 1e-3], [1e-3, 1e-3]]


def test_run_profile_with_an_moe_block():
    grid = Grid(tokens=(1, 16), prefill_chunk=(8, 32), prefill_ctx=(0, 40), decode_batch=(1, 3),
                decode_ctx=(5, 50), lm_seqs=(1, 4), heldout=1, heldout_max_decodes=4,
                heldout_max_ctx=60, warmup=0, repeats=3, point_budget_s=0.1)
    opts = Options(attention="reference", compile=False, max_num_batched_tokens=32,
                   grid_override=grid, command="test")
    p = run_profile(TOY, opts, stream=io.StringIO(), moe=MOE)
    validate(p)
    moe = p["moe"]
    assert moe["tokens"] == [1, 16, 32]
    assert all(s > 0 for s in moe["seconds"])
    assert moe["experts_hit"][0] == 2 and moe["experts_hit"][-1] <= 8
    assert p["model"]["num_experts"] == 8
    # weights: the layers without a dense MLP, plus each layer's MoE block
    dense = run_profile(DENSE, opts, stream=io.StringIO())
    elt = 2
    mlp = 3 * 64 * 128 * elt
    assert p["memory"]["weights_bytes"] == (dense["memory"]["weights_bytes"]
                                            + 2 * (MOE.params * elt - mlp))
    assert model_mismatch(dense, {"num_experts": 8}) == ["num_experts: profile 0, model 8"]


def test_profile_latency_prices_the_moe_block():
    from simserve.latency.profile import ProfileLatency
    from simserve.sched.plan import StepPlan
    grid = Grid(tokens=(1, 16), prefill_chunk=(8, 16), prefill_ctx=(0, 40), decode_batch=(1, 3),
                decode_ctx=(5, 50), lm_seqs=(1, 4), heldout=1, heldout_max_decodes=4,
                heldout_max_ctx=60, warmup=0, repeats=2, point_budget_s=0.1)
    opts = Options(attention="reference", compile=False, max_num_batched_tokens=16,
                   grid_override=grid, command="test")
    p = run_profile(TOY, opts, stream=io.StringIO(), moe=MOE)
    plan = StepPlan((1,), (16,), (16,), (0,), (), 1)    # 16 tokens: a grid point
    one = ProfileLatency(p).breakdown(plan)
    assert one["moe"] == 2 * p["moe"]["seconds"][1]      # two layers, one block each
    # EP over 2 ranks with balancedness 0.5: half the rows per rank, the busiest twice the mean
    ep = ProfileLatency(p, tensor_parallel_size=2, enable_expert_parallel=True,
                        expert_balancedness=0.5, allreduce_s=lambda n: 0.0).breakdown(plan)
    assert ep["moe"] == pytest.approx(one["moe"] * 0.5 / 0.5)
    tp = ProfileLatency(p, tensor_parallel_size=2, allreduce_s=lambda n: 0.0).breakdown(plan)
    assert tp["moe"] == pytest.approx(one["moe"] / 2)
    assert sum(one.values()) == ProfileLatency(p).step_time(plan)
