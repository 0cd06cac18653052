"""The seed papers' baselines as they were: Orca's reservation modes on a buddy allocator
(the vLLM paper's §6.1 definitions) and static batching's padding. Hand-checked."""

from __future__ import annotations

import pytest

from simserve.kv.buddy import BuddyBlockManager, pow2_at_least
from simserve.sched import SchedulerLimits
from simserve.sched.orca import Orca, OrcaParams
from simserve.kv.blocks import BlockManager
from tests.helpers import make_request, step


def test_pow2_at_least():
    assert [pow2_at_least(n) for n in (1, 2, 3, 25, 32, 33)] == [1, 2, 4, 32, 32, 64]


def test_buddy_rounds_up_splits_and_merges():
    # 12 blocks = aligned regions 8 @ 0 and 4 @ 8
    bm = BuddyBlockManager(12, block_size=4)
    assert bm.largest_free() == 8
    assert bm.allocate(1, 9) == 4          # 9 tokens = 3 blocks -> chunk of 4 from the 4 @ 8
    assert bm.num_free == 8 and bm.largest_free() == 8
    assert bm.allocate(1, 16) == 0         # within its chunk
    assert bm.allocate(1, 17) is None      # a chunk never grows
    assert bm.allocate(2, 4) == 1          # 1 block: splits 8 -> 4 + 2 + 1 + 1
    assert bm.largest_free() == 4 and bm.num_free == 7
    # 5 blocks -> a chunk of 8: 7 blocks free in all, but no region of 8 (external frag.)
    assert not bm.can_allocate(3, 20) and bm.allocate(3, 20) is None and bm.num_free == 7
    assert bm.free(2) == 1                 # merges back into 8 @ 0
    assert bm.largest_free() == 8 and bm.allocate(3, 20) == 8 and bm.num_free == 0
    assert bm.free(1) == 4 and bm.free(3) == 8 and bm.num_free == 12


def orca(mode: str, allocator: str = "buddy", blocks: int = 64, max_len: int = 64):
    limits = SchedulerLimits(max_num_seqs=16, max_num_batched_tokens=1000,
                             enable_chunked_prefill=False, max_model_len=max_len)
    return Orca(limits, BlockManager(blocks, 1), OrcaParams(reservation=mode,
                                                            allocator=allocator))


@pytest.mark.parametrize("mode, reserved", [("oracle", 10 + 25), ("pow2", 10 + 32),
                                            ("max", 64)])
def test_orca_reservations_are_the_vllm_papers(mode, reserved):
    # prompt 10, true output 25 ("if the true output length is 25, it reserves 32")
    s = orca(mode, allocator="paged")
    assert s.reservation(make_request(0, 10, 25)) == reserved
    s.add(make_request(0, 10, 25))
    step(s)
    assert s.blocks.num_used == reserved          # block size 1: blocks = tokens


def test_orca_pow2_never_exceeds_the_max_length_nor_goes_below_the_true_length():
    s = orca("pow2", allocator="paged", max_len=40)
    assert s.reservation(make_request(0, 10, 25)) == 40    # 42 capped at 40
    s = orca("max", allocator="paged", max_len=0)           # no max length: the true length
    assert s.reservation(make_request(0, 10, 25)) == 35


def test_orca_buddy_admits_fewer_than_the_free_blocks_allow():
    # 64 one-token blocks; each request prompt 10 + output 6 = 16 tokens
    # oracle: chunk 16 -> four fit; pow2: 10 + 8 = 18 -> chunk 32 -> two fit;
    # max (64): chunk 64 -> one fits
    for mode, fits in (("oracle", 4), ("pow2", 2), ("max", 1)):
        s = orca(mode)
        for i in range(6):
            s.add(make_request(i, 10, 6))
        step(s)
        assert len(s.running) == fits, mode
        assert s.blocks.num_used == 64 // fits * fits


def test_orca_buddy_replaces_the_pool_and_refuses_a_prefix_cache():
    from simserve.kv.prefix import PrefixBlockManager
    s = orca("oracle")
    assert isinstance(s.blocks, BuddyBlockManager) and s.blocks.num_blocks == 64
    assert s.blocks.block_size == 1
    # a pool that caches prefixes, or one already in use, cannot be swapped for the buddy one
    limits = SchedulerLimits(max_num_seqs=16, max_num_batched_tokens=1000,
                             enable_chunked_prefill=False, max_model_len=64)
    used = BlockManager(64, 1)
    used.allocate(7, 3)
    for pool in (PrefixBlockManager(64, 16), used):
        with pytest.raises(ValueError, match="buddy allocator needs an empty, non-caching"):
            Orca(limits, pool, OrcaParams(reservation="oracle", allocator="buddy"))
    # the paged allocator keeps the pool it is given
    paged = BlockManager(64, 1)
    assert Orca(limits, paged, OrcaParams(allocator="paged")).blocks is paged


def test_buddy_reservation_larger_than_any_region_takes_the_empty_pool():
    bm = BuddyBlockManager(12, block_size=1)          # regions 8 + 4
    assert bm.allocate(1, 2) == 2
    assert not bm.can_allocate(2, 10) and bm.allocate(2, 10) is None   # 16 > 8: pool not empty
    assert bm.free(1) == 2 and bm.largest_free() == 8
    assert bm.can_allocate(2, 10) and bm.allocate(2, 10) == 12 and bm.num_free == 0
    assert bm.free(2) == 12 and bm.largest_free() == 8 and bm.num_free == 12


# ---------------------------------------------------------------- inputs of the papers

def test_exponential_lengths_capped_and_truncated():
    import numpy as np
    from pathlib import Path
    from simserve.fields import Fields
    from simserve.workload.config import LengthDist
    from simserve.workload.synthetic import sample_lengths
    rng = np.random.default_rng(0)
    capped = LengthDist.from_fields(Fields({"dist": "exponential", "mean": 128, "max": 32}, "o"))
    x = sample_lengths(capped, 20000, rng, Path("."), "o")
    # P(X > 32) = e^-0.25 = 0.7788: that mass sits at the cap
    assert x.max() == 32 and abs((x == 32).mean() - np.exp(-0.25)) < 0.015
    trunc = LengthDist.from_fields(Fields({"dist": "truncated_exponential", "mean": 128,
                                           "max": 32}, "o"))
    y = sample_lengths(trunc, 20000, rng, Path("."), "o")
    # E[X | X <= c] = m - c·e^(-c/m) / (1 - e^(-c/m)) = 128 - 32·0.7788/0.2212 = 15.33
    assert y.max() <= 32 and abs(y.mean() - 15.33) < 0.3
    free = LengthDist.from_fields(Fields({"dist": "exponential", "mean": 128}, "o"))
    assert abs(sample_lengths(free, 20000, rng, Path("."), "o").mean() - 128) < 3


def test_truncated_exponential_needs_a_cap():
    from simserve.errors import ConfigError
    from simserve.fields import Fields
    from simserve.workload.config import LengthDist
    with pytest.raises(ConfigError, match=r"o\.max"):
        LengthDist.from_fields(Fields({"dist": "truncated_exponential", "mean": 128}, "o"))


@pytest.mark.parametrize("name, params_b, kv_bytes", [
    # digest papers-17 §6, [D] from the config.json shapes
    ("OPT-13B", 12.85, 819_200), ("OPT-66B", 65.72, 2_359_296), ("OPT-175B", 174.60, 4_718_592),
    ("Mistral-7B-v0.2", 7.24, 131_072), ("Yi-34B", 34.39, 245_760),
    ("Falcon-180B", 178.56, 163_840)])
def test_paper_model_cards(name, params_b, kv_bytes):
    from simserve.cards import load_model
    card = load_model(name)
    assert round(card.num_params / 1e9, 2) == params_b
    assert card.kv_bytes_per_token == kv_bytes


def test_opt_layer_by_hand():
    from simserve.cards import load_model
    c = load_model("OPT-13B")
    h, i = 5120, 20480
    # q, k, v, o with biases; fc1, fc2 with biases; two LayerNorms (weight + bias)
    assert c.layer_params == 4 * h * h + 4 * h + 2 * h * i + i + h + 2 * 2 * h
    # embedding 50272·h + positions 2050·h + 40 layers + final LayerNorm; head tied
    assert c.num_params == 50272 * h + 2050 * h + 40 * c.layer_params + 2 * h


def test_plain_mlp_roofline_reads_two_matrices():
    import dataclasses
    from simserve.cards import load_hardware, load_model
    from simserve.latency import RooflineModel
    opt = load_model("OPT-13B")
    gated = dataclasses.replace(opt, mlp="gated")
    hw = load_hardware("A100-40GB")
    plain_w = sum(w for _, w, _ in RooflineModel(opt, hw)._linear)
    gated_w = sum(w for _, w, _ in RooflineModel(gated, hw)._linear)
    # one h × I matrix fewer, read at 0.8 · 1.555 TB/s
    assert gated_w - plain_w == pytest.approx(5120 * 20480 * 2 / (0.8 * 1.555e12))


# ---------------------------------------------------------------- the papers' criteria

def _summary(slo):
    import pandas as pd
    from simserve.metrics.summary import summarize
    # two requests: A arrives 0, first scheduled 0.5, tokens at 1, 2, 4 (gaps 1, 2);
    # B arrives 1, scheduled 1.0, tokens at 2, 2.5 (gap 0.5)
    req = pd.DataFrame({
        "status": ["finished", "finished"], "arrival_s": [0.0, 1.0],
        "first_scheduled_s": [0.5, 1.0], "first_token_s": [1.0, 2.0], "finish_s": [4.0, 2.5],
        "num_prompt_tokens": [10, 10], "num_output_tokens": [3, 2], "num_preemptions": [0, 0],
        "reject_reason": ["", ""], "replica": [0, 0]})
    steps = pd.DataFrame({k: [] for k in ("replica", "start_s", "duration_s", "kv_blocks_used",
                                          "kv_blocks_total", "num_running", "num_waiting",
                                          "num_batched_tokens")})
    import numpy as np
    return summarize(req, [np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.5])], steps, slo)


def test_run_level_criteria_by_hand():
    from simserve.metrics.slo import SloConfig
    s = _summary(SloConfig(tbt_ms=1900, tbt_percentile=50, scheduling_delay_ms=300,
                           normalized_latency_ms=1000))
    # normalized: A 4 s / 3 = 1333.3 ms, B 1.5 s / 2 = 750 ms: mean 1041.7 ms
    assert s["mean_normalized_latency_ms"] == pytest.approx(1041.6667, rel=1e-6)
    # scheduling delay: A 0.5 s, B 0 s: median 250 ms
    assert s["median_scheduling_delay_ms"] == pytest.approx(250)
    # pooled gaps 1, 2, 0.5 s: median 1000 ms
    assert s["slo_tbt_ms"] == pytest.approx(1000)
    assert s["slo_scheduling_delay_ms"] == pytest.approx(250)
    assert s["slo_normalized_latency_ms"] == pytest.approx(1041.6667, rel=1e-6)
    assert s["slo_attainment"] == 1.0        # no per-request limit: every finished one counts
    assert s["slo_met"] is False             # 1041.7 > 1000
    ok = _summary(SloConfig(tbt_ms=2100, scheduling_delay_ms=300, normalized_latency_ms=1100))
    # P99 of gaps (0.5, 1, 2): 2 - 0.02·(2 - 1) = 1.98 s
    assert ok["slo_tbt_ms"] == pytest.approx(1980) and ok["slo_met"] is True


def test_run_level_criteria_name_their_percentile_and_limit():
    from simserve.metrics.slo import SloConfig
    from simserve.metrics.summary import format_summary
    s = _summary(SloConfig(tbt_ms=1900, tbt_percentile=50, scheduling_delay_ms=300,
                           scheduling_delay_percentile=90, normalized_latency_ms=1000))
    assert (s["slo_tbt_percentile"], s["slo_tbt_limit_ms"]) == (50, 1900)
    assert (s["slo_scheduling_delay_percentile"], s["slo_scheduling_delay_limit_ms"]) == (90, 300)
    assert s["slo_normalized_latency_limit_ms"] == 1000
    lines = format_summary(s).splitlines()
    assert any(x.startswith("SLO median TBT (ms):") and x.endswith("1000.00 (limit 1900)")
               for x in lines)
    assert any(x.startswith("SLO P90 scheduling delay (ms):") and x.endswith("(limit 300)")
               for x in lines)
    assert any(x.startswith("SLO normalized latency (ms/token):")
               and x.endswith("1041.67 (limit 1000)") for x in lines)
    p99 = format_summary(_summary(SloConfig(tbt_ms=1900)))
    assert "SLO P99 TBT (ms):" in p99 and "1980.00 (limit 1900)" in p99
    # a summary written before the percentile and limit were kept: the value alone
    old = {k: v for k, v in s.items() if not k.endswith(("_percentile", "_limit_ms"))}
    assert any(x.startswith("SLO TBT (ms):") and x.endswith(" 1000.00")
               for x in format_summary(old).splitlines())


def test_run_level_criteria_parse_and_validate():
    from simserve.errors import ConfigError
    from simserve.fields import Fields
    from simserve.metrics.slo import SloConfig
    slo = SloConfig.from_fields(Fields({"tbt_ms": 100, "scheduling_delay_ms": 2000}, "slo"))
    assert slo.tbt_percentile == 99 and slo.scheduling_delay_percentile == 50
    assert slo.to_dict()["tbt_ms"] == 100 and not slo.is_empty and not slo.has_request_limits
    with pytest.raises(ConfigError, match=r"slo\.tbt_percentile"):
        SloConfig.from_fields(Fields({"tbt_ms": 100, "tbt_percentile": 120}, "slo"))


# ---------------------------------------------------------------- FastServe's overlapped swaps

def test_overlapped_swaps_cost_only_what_outlasts_the_step():
    from simserve.cards import load_hardware, load_model
    from simserve.latency import RooflineModel
    from simserve.sched.plan import StepPlan
    roof = RooflineModel(load_model("Llama-3.1-8B"), load_hardware("H100-SXM"))
    blk = roof._swap_block_s          # 16 tokens x 128 KiB / 64 GB/s = 32.8 µs
    base = StepPlan((1,), (1,), (), (), (500,), 1)
    t0 = roof.step_time(base)
    # 10 blocks on the critical path add 10 transfers
    assert roof.step_time(base._replace(swap_in_blocks=10)) == pytest.approx(t0 + 10 * blk)
    # the same 10 moved alongside: hidden under a ~7.6 ms step
    side = base._replace(swap_out_blocks=4, swap_in_blocks=6, overlapped_swap_blocks=10)
    assert roof.step_time(side) == t0
    # 1000 blocks alongside (32.8 ms) outlast the step: the step lasts as long as the link
    big = base._replace(swap_out_blocks=1000, overlapped_swap_blocks=1000)
    assert roof.step_time(big) == pytest.approx(1000 * blk)
    assert sum(roof.breakdown(big).values()) == pytest.approx(roof.step_time(big))
    assert roof.decode_stretch(big)(0, 2) == [
        roof.step_time(big._replace(decode_ctx=(500 + i,))) for i in range(2)]


def test_fastserve_keeps_a_reserve_and_prefetches_alongside():
    from simserve.sched import SchedulerLimits
    from simserve.sched.fastserve import FastServe, FastServeParams
    from simserve.kv.blocks import BlockManager
    from simserve.sched.request import Status
    from tests.helpers import tokens
    limits = SchedulerLimits(max_num_seqs=2, max_num_batched_tokens=100,
                             enable_chunked_prefill=False, preemption_mode="swap")
    # 10 device blocks of 4 tokens, 20 on the host; keep 3 free
    s = FastServe(limits, BlockManager(10, 4, 20),
                  FastServeParams(quantum_unit="iterations", skip_join_tokens=4,
                                  reserve_blocks=3))
    a, b = make_request(0, 12, 8), make_request(1, 12, 8)   # 12 > 4·2: skip-join level 2
    s.add(a), s.add(b)
    p = step(s)                       # A, B prefill: 3 blocks each, 4 free >= 3: nothing moved
    assert tokens(p) == {0: 12, 1: 12} and p.overlapped_swap_blocks == 0
    c = make_request(2, 4, 8)         # 4 tokens: level 0, ahead of A and B
    s.add(c)
    p = step(s)
    # C prefills (1 block), A decodes (13 tokens: a 4th block): 2 free < 3, so B (paused,
    # lowest ranked, 3 blocks) is swapped out alongside the step: 5 free
    assert tokens(p) == {2: 4, 0: 1}
    assert p.swap_out_blocks == p.overlapped_swap_blocks == 3 and p.num_preempted == 1
    assert b.status is Status.SWAPPED and s.blocks.num_free == 5
    # with a reserve of 1: C decodes (a 2nd block: 4 free), A decodes (within its 4 blocks);
    # 4 free >= 1, nothing to swap out, so B (3 blocks, 3 + 1 <= 4) is swapped back in
    # alongside a step it does not run in
    import dataclasses
    s.params = dataclasses.replace(s.params, reserve_blocks=1)
    p = step(s)
    assert tokens(p) == {2: 1, 0: 1} and b.status is Status.RUNNING and b in s.paused
    assert p.swap_in_blocks == p.overlapped_swap_blocks == 3 and p.swap_out_blocks == 0
    while 1 not in tokens(p):         # when B runs, its KV is already resident
        assert b.status is Status.RUNNING
        p = step(s)
    assert p.swap_in_blocks == 0
