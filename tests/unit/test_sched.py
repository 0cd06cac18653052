"""Hand-stepped scheduler tests: exact token counts per step, arithmetic in the comments."""

from __future__ import annotations

import pytest

from simserve.sched import Status
from tests.helpers import make_request, make_scheduler, step, tokens


# -- vLLM v1 ---------------------------------------------------------------------------------

def test_v1_chunked_prefill_mixes_with_decodes():
    s = make_scheduler("vllm_v1", budget=10)
    a, b = make_request(0, 16, 3), make_request(1, 6, 2)
    s.add(a), s.add(b)
    # step 1: A wants 16, budget 10 -> chunk of 10; budget 0 so B is not admitted
    p = step(s)
    assert tokens(p) == {0: 10} and p.prefill_lens == (10,) and p.prefill_ctx == (0,)
    assert p.num_sampled == 0 and a.num_computed_tokens == 10 and len(s.waiting) == 1
    # step 2: A's last 6 prompt tokens (samples its 1st token); B admitted with 10-6 = 4
    p = step(s)
    assert tokens(p) == {0: 6, 1: 4} and p.prefill_ctx == (10, 0) and p.num_sampled == 1
    assert a.num_generated == 1 and b.num_computed_tokens == 4
    # step 3: A decodes (ctx 16); B finishes its prompt with 2 tokens and samples
    p = step(s)
    assert tokens(p) == {0: 1, 1: 2} and p.decode_ctx == (16,) and p.prefill_lens == (2,)
    assert p.num_sampled == 2
    # step 4: both decode; A reaches 3 outputs, B 2 outputs: both finish
    p = step(s)
    assert p.decode_ctx == (17, 6) and p.num_batched_tokens == 2
    assert a.status is Status.FINISHED and b.status is Status.FINISHED
    assert s.blocks.num_used == 0 and not s.has_work


def test_v1_long_prefill_threshold_caps_each_chunk():
    s = make_scheduler("vllm_v1", budget=10, threshold=4)
    s.add(make_request(0, 16, 1)), s.add(make_request(1, 6, 1))
    # A capped to 4 by the threshold, B also capped to 4 (budget left 6): 8 tokens
    p = step(s)
    assert tokens(p) == {0: 4, 1: 4} and p.num_batched_tokens == 8


def test_v1_without_chunking_waits_for_budget():
    s = make_scheduler("vllm_v1", budget=10, chunked=False)
    s.add(make_request(0, 8, 2)), s.add(make_request(1, 6, 1))
    # A (8) fits; B (6) > 10 - 8 = 2 left, and may not be chunked: waits
    p = step(s)
    assert tokens(p) == {0: 8}
    # A decodes 1; B's 6 fit in the 9 left
    p = step(s)
    assert tokens(p) == {0: 1, 1: 6}


def test_v1_max_num_seqs_caps_admission():
    s = make_scheduler("vllm_v1", budget=100, max_num_seqs=2)
    for i in range(3):
        s.add(make_request(i, 5, 2))
    p = step(s)
    assert tokens(p) == {0: 5, 1: 5} and len(s.waiting) == 1


def test_v1_recompute_preemption_evicts_newest():
    # 4 blocks of 4 tokens = 16 slots; A and B: prompt 7, 4 outputs each
    s = make_scheduler("vllm_v1", num_blocks=4, block_size=4)
    a, b = make_request(0, 7, 4), make_request(1, 7, 4)
    s.add(a), s.add(b)
    p = step(s)                      # both prefill 7 tokens: 2 blocks each, 0 free
    assert tokens(p) == {0: 7, 1: 7} and s.blocks.num_free == 0
    p = step(s)                      # decode: 8 tokens still fit in 2 blocks each
    assert p.decode_ctx == (7, 7)
    # step 3: A needs 9 tokens = 3 blocks; none free -> evict the newest (B), then A fits
    p = step(s)
    assert tokens(p) == {0: 1} and p.num_preempted == 1
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert s.waiting[0] is b and s.blocks.held(1) == 0
    # step 4: A decodes (10 tokens, 3 blocks held); B must recompute 7 + 2 = 9 tokens = 3
    # blocks but only 1 is free -> not admitted. A finishes (4 outputs) and frees 3 blocks.
    p = step(s)
    assert tokens(p) == {0: 1} and a.status is Status.FINISHED
    # step 5: B re-prefills prompt + its 2 generated tokens in one chunk and samples token 3
    p = step(s)
    assert tokens(p) == {1: 9} and p.prefill_lens == (9,) and b.num_generated == 3
    p = step(s)
    assert p.decode_ctx == (9,) and b.status is Status.FINISHED


def test_v1_swap_preemption_moves_blocks_to_host():
    s = make_scheduler("vllm_v1", num_blocks=4, block_size=4, mode="swap", host_blocks=10)
    a, b = make_request(0, 7, 4), make_request(1, 7, 4)
    s.add(a), s.add(b)
    step(s), step(s)
    # step 3: as with recompute, but B's 2 blocks go to host memory and keep their tokens
    p = step(s)
    assert p.swap_out_blocks == 2 and b.status is Status.SWAPPED
    assert b.num_computed_tokens == 8 and s.blocks.num_host_free == 8
    # step 4: A decodes (3 blocks); B needs 2 device blocks, 1 free -> stays swapped
    p = step(s)
    assert tokens(p) == {0: 1} and p.swap_in_blocks == 0 and a.status is Status.FINISHED
    # step 5: B swaps in (2 blocks) and decodes its 9th token: 3 blocks
    p = step(s)
    assert p.swap_in_blocks == 2 and p.decode_ctx == (8,) and s.blocks.held(1) == 3
    step(s)
    assert b.status is Status.FINISHED and s.blocks.num_host_free == 10


# -- vLLM v0 ---------------------------------------------------------------------------------

def test_v0_prefill_first_never_mixes():
    s = make_scheduler("vllm_v0", budget=64)
    a = make_request(0, 10, 5)
    s.add(a)
    p = step(s)
    assert tokens(p) == {0: 10}
    p = step(s)
    assert p.decode_ctx == (10,)
    # B arrives: the next step is B's whole prompt alone; A's decode waits
    s.add(make_request(1, 20, 2))
    p = step(s)
    assert tokens(p) == {1: 20} and p.decode_ctx == ()
    # then both decode together
    p = step(s)
    assert p.decode_ctx == (11, 20) and p.prefill_lens == ()


def test_v0_admits_whole_prompts_within_budget():
    s = make_scheduler("vllm_v0", budget=30)
    for i, n in enumerate((12, 12, 12)):
        s.add(make_request(i, n, 1))
    # 12 + 12 = 24 <= 30; the third would make 36 > 30: prompts are never chunked
    p = step(s)
    assert tokens(p) == {0: 12, 1: 12}


def test_v0_watermark_holds_back_prompts_while_running():
    # 100 blocks, watermark = ceil(1 % of 100) = 1 block kept free while anything runs
    s = make_scheduler("vllm_v0", budget=1000, num_blocks=100, block_size=4)
    s.add(make_request(0, 4 * 60, 5))   # 60 blocks
    step(s)
    s.add(make_request(1, 4 * 40, 1))   # 40 blocks: 60 + 40 = 100 leaves 0 < 1 -> held back
    p = step(s)
    assert p.prefill_lens == () and p.decode_ctx == (240,)


# -- Sarathi-Serve ---------------------------------------------------------------------------

def test_sarathi_decodes_never_stall_behind_a_partial_prefill():
    # Running order [A (partial prefill, 4 of 20 done), C (decoding)], budget 4.
    for policy, expected in (("sarathi", {1: 1, 0: 3}), ("vllm_v1", {0: 4})):
        s = make_scheduler(policy, budget=4)
        a, c = make_request(0, 20, 2), make_request(1, 1, 5)
        for r in (a, c):
            r.status = Status.RUNNING
            s.running.append(r)
        a.num_computed_tokens = 4
        s.blocks.allocate(0, 4)
        c.num_computed_tokens, c.num_generated = 1, 1
        s.blocks.allocate(1, 1)
        p = step(s)
        # sarathi: C's decode first (1), A gets the remaining 3; v1 walks running in order:
        # A takes all 4 and C's decode stalls this step
        assert tokens(p) == expected, policy


def test_sarathi_fills_budget_with_new_prompt_chunks():
    s = make_scheduler("sarathi", budget=8)
    s.add(make_request(0, 2, 5)), s.add(make_request(1, 20, 2))
    p = step(s)           # C: 2 (whole prompt), A: chunk of 8 - 2 = 6
    assert tokens(p) == {0: 2, 1: 6}
    p = step(s)           # decode 1 first, then A's next chunk of 7
    assert tokens(p) == {0: 1, 1: 7} and p.decode_ctx == (2,) and p.prefill_ctx == (6,)


# -- Orca and static -------------------------------------------------------------------------

def test_orca_reserves_full_length_and_never_preempts():
    # 4 blocks x 4 tokens. A, B: prompt 4 + 8 outputs = 12 tokens = 3 blocks reserved each
    s = make_scheduler("orca", num_blocks=4, block_size=4)
    a, b = make_request(0, 4, 8), make_request(1, 4, 8)
    s.add(a), s.add(b)
    p = step(s)
    assert tokens(p) == {0: 4} and s.blocks.held(0) == 3   # B: 3 > 1 free block, waits
    for _ in range(7):
        p = step(s)
        assert tokens(p) == {0: 1} and p.num_preempted == 0
    assert a.status is Status.FINISHED
    p = step(s)
    assert tokens(p) == {1: 4}


def test_orca_mixes_new_prompts_into_running_batch():
    s = make_scheduler("orca", budget=100)
    s.add(make_request(0, 5, 3))
    step(s)
    s.add(make_request(1, 7, 2))
    p = step(s)           # A decodes and B's whole prompt joins the same iteration
    assert tokens(p) == {0: 1, 1: 7}


def test_static_prefills_the_whole_batch_before_decoding():
    # budget 10: prompts 6, 6, 3 -> step 1 packs A (6) and stops at B (6 > 4 left);
    # step 2: B (6) + C (3) = 9; only then do all three decode together
    s = make_scheduler("static", budget=10)
    for i, n in enumerate((6, 6, 3)):
        s.add(make_request(i, n, 2))
    assert tokens(step(s)) == {0: 6}
    assert tokens(step(s)) == {1: 6, 2: 3}
    p = step(s)
    assert tokens(p) == {0: 1, 1: 1, 2: 1} and p.decode_ctx == (6, 6, 3)


def test_static_batch_drains_before_new_admissions():
    s = make_scheduler("static", budget=100)
    a, b = make_request(0, 4, 3), make_request(1, 4, 1)
    s.add(a), s.add(b)
    p = step(s)
    assert tokens(p) == {0: 4, 1: 4} and b.status is Status.FINISHED
    s.add(make_request(2, 4, 1))
    assert tokens(step(s)) == {0: 1}      # C waits while the batch (A) is still running
    assert tokens(step(s)) == {0: 1} and a.status is Status.FINISHED
    assert tokens(step(s)) == {2: 4}


def test_block_manager_query_command_pairs():
    from simserve.kv.blocks import BlockManager
    bm = BlockManager(num_blocks=3, block_size=4)
    assert bm.allocate(1, 5) == 2 and bm.num_free == 1      # ceil(5/4) = 2
    assert bm.allocate(1, 8) == 0                           # still 2 blocks
    assert bm.allocate(2, 9) is None and bm.num_free == 1   # 3 blocks needed: nothing changes
    assert bm.can_allocate(2, 4) and not bm.can_allocate(2, 4, reserve=1)
    assert bm.free(1) == 2 and bm.num_free == 3


@pytest.mark.parametrize("prefix", [False, True])
def test_block_manager_bulk_growth_is_all_or_nothing(prefix):
    from simserve.kv.blocks import BlockManager
    from simserve.kv.prefix import PrefixBlockManager
    bm = (PrefixBlockManager if prefix else BlockManager)(num_blocks=6, block_size=4)
    assert bm.allocate(1, 4) == 1 and bm.allocate(2, 6) == 2 and bm.num_free == 3
    # 1 holds 4 tokens in 1 full block: its 5th needs a block; 2 holds 6 in 2: the 7th fits
    assert bm.grow_decodes([1, 2], [4, 6]) and bm.held(1) == 2 and bm.held(2) == 2
    assert bm.num_free == 2 and dict(bm.blocks_held) == {1: 2, 2: 2}
    # 1 to 13 tokens (+2 blocks) and 2 to 12 (+1): 3 > 2 free, so nothing changes
    assert bm.allocate_all([(1, 13), (2, 12)]) is None
    assert bm.held(1) == 2 and bm.held(2) == 2 and bm.num_free == 2
    assert bm.allocate_all([(1, 12), (2, 8)]) == 1 and bm.held(1) == 3 and bm.num_free == 1
    assert not bm.grow_decodes([1, 2], [12, 8]) and bm.num_free == 1   # needs 2, 1 free
    with pytest.raises(TypeError):
        bm.blocks_held[1] = 5                               # a read-only view


def test_result_counts_steps_without_building_the_table():
    import simserve
    from simserve.config import load_scenario
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    r = simserve.run(load_scenario(root / "scenarios" / "quickstart.yaml"))
    n = r.num_steps
    assert r._steps is None and n > 0
    assert n == len(r.steps)


@pytest.mark.parametrize("policy", ["vllm_v0", "vllm_v1", "sarathi"])
def test_stretches_start_with_mixed_steps_and_match_stepping(policy, monkeypatch):
    """Poisson arrivals while others decode: stretches start with the step that admits the
    newcomer (for v0 a prefill-only step in which the running requests wait, offset 1), or,
    with vLLM v1 and Sarathi, the newcomer joins the stretch going on; the run equals
    stepping, step for step and in every metric (ITL included)."""
    import simserve
    from simserve.config import parse_scenario
    from simserve.sched.stretch import Stretch
    raw = {"model": "Llama-2-7B", "hardware": "A100-80GB", "seed": 3,
           "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 4096, "block_size": 16,
                      "max_model_len": 4096},
           "scheduler": {"policy": policy}, "latency": {"model": "roofline"},
           "workload": {"arrival": "poisson", "rate": 4, "num_requests": 300,
                        "prompt": {"dist": "uniform", "low": 20, "high": 1500},
                        "output": {"dist": "uniform", "low": 1, "high": 300}}}
    starts, joins = [], []
    plan_stretch, price = Stretch.plan, Stretch.price

    def spy(sched, plan, max_steps, past_finish=False):
        stretch = plan_stretch(sched, plan, max_steps, past_finish)
        if stretch is not None and plan.prefill_lens:
            starts.append(len(sched.running) - len(plan.request_ids))   # requests that wait
        return stretch

    def priced(self, *args, **kwargs):
        price(self, *args, **kwargs)
        joins.append(sum(n for _, n in self.joins.values()))

    monkeypatch.setattr(Stretch, "plan", staticmethod(spy))
    monkeypatch.setattr(Stretch, "price", priced)
    fast = simserve.run(parse_scenario(raw))
    slow = simserve.run(parse_scenario(raw), fast_forward=False)
    assert fast.summary == slow.summary
    assert fast.steps.equals(slow.steps) and fast.requests.equals(slow.requests)
    # a newcomer's prefill starts a stretch or, with vLLM v1 and Sarathi (joins_stretch),
    # joins one already going (vLLM v0's never join: its prefill-only steps make decodes wait)
    assert len(starts) + sum(joins) > 100
    assert sum(joins) > 100 if policy != "vllm_v0" else sum(joins) == 0
    if policy == "vllm_v0":
        assert sum(w > 0 for w in starts) > 50    # prefill-only first steps, others waiting
    else:
        assert not any(starts)                    # chunked: every running request takes part


@pytest.mark.parametrize("policy, budget, threshold, joins, a_end, b_times", [
    ("vllm_v1", 64, 0, {3: (3, 1)}, 0.10, [0.04, 0.05, 0.06]),
    ("sarathi", 64, 0, {3: (3, 1)}, 0.10, [0.04, 0.05, 0.06]),
    ("vllm_v1", 3, 0, {}, 0.11, [0.05, 0.06, 0.07]),
    ("sarathi", 3, 0, {}, 0.11, [0.05, 0.06, 0.07]),
    ("vllm_v1", 64, 2, {}, 0.10, [0.05, 0.06, 0.07]),
    ("sarathi", 64, 2, {}, 0.11, [0.05, 0.06, 0.07])])
def test_an_arrival_joins_the_stretch_it_arrives_in(policy, budget, threshold, joins, a_end,
                                                    b_times, monkeypatch):
    """vLLM v1, 10 ms steps, block size 4. A (prompt 4, 10 tokens) arrives at 0; B (prompt 3,
    3 tokens) at 25 ms. Step 0 [0, 10 ms) is A's prefill (its 1st token); a stretch starts
    there. Step 3 is the first to start after B's arrival (30 ms >= 25 ms): schedule() would
    decode A and admit B whole (budget 64 - 1 decode >= 3, 2 <= max_num_seqs), so B joins the
    stretch at step 3, a mixed step (A's decode at ctx 3 + 3 = 6, B's prompt 3); B's tokens
    end steps 3, 4, 5 (40, 50, 60 ms), A's steps 0 .. 9 (10 .. 100 ms): one stretch for all.
    KV blocks after scheduling each step: A holds ceil((4 + i) / 4) at step i (1 2 2 2 2 3 3
    3 3 4), B ceil(3 / 4) = 1 at step 3, 1 at step 4 (4 tokens), 2 at step 5 (5 tokens).
    With a budget of 3, A's prompt takes steps 0 and 1 (3 + 1 tokens: its tokens end steps
    1 .. 10, 20 .. 110 ms) and at step 3 B cannot come in whole (3 - 1 decode = 2 < 3: a chunk
    of 2, its last token at step 4): the stretch ends before step 3 and B's tokens end steps
    4, 5, 6 (50, 60, 70 ms), as stepping has them. Sarathi makes the same steps (A decodes
    first, then B's prompt from the budget left). With long_prefill_token_threshold 2, B's
    prompt 3 is cut to 2 at step 3 (two requests, so vLLM v1 applies it too): no join, B's
    tokens end steps 4, 5, 6; A's prompt 4 alone at step 0 is whole for vLLM v1 (it lifts
    the threshold with nobody else to starve: A ends at 100 ms) but chunked 2 + 2 by Sarathi
    (steps 0 and 1: A ends at 110 ms)."""
    from simserve.engine import Replica, round_robin, simulate
    from simserve.latency import ConstantLatency
    from simserve.sched.stretch import Stretch
    from simserve.workload.spec import RequestSpec
    priced = []
    price = Stretch.price

    def spy(self, *args, **kwargs):
        price(self, *args, **kwargs)
        priced.append(dict(self.joins))

    monkeypatch.setattr(Stretch, "price", spy)
    specs = [RequestSpec(0, 0.0, 4, 10), RequestSpec(1, 0.025, 3, 3)]
    runs = {}
    for fast in (True, False):
        sched = make_scheduler(policy, budget=budget, threshold=threshold)
        sched.record_tokens = True
        rec = simulate(specs, [Replica(0, sched, ConstantLatency(0.01), 64)], round_robin(),
                       fast_forward=fast)
        runs[fast] = rec
    fast, slow = runs[True], runs[False]
    cols = {c: v.tolist() for c, v in fast.columns().items()}
    assert cols == {c: v.tolist() for c, v in slow.columns().items()}
    a, b = fast.requests
    assert [r.token_times for r in fast.requests] == [r.token_times for r in slow.requests]
    assert a.finish_s == pytest.approx(a_end) and b.token_times == pytest.approx(b_times)
    if joins:
        assert priced == [joins]                      # one stretch, B joined at step 3
        assert b.first_scheduled_s == pytest.approx(0.03)
        assert cols["kv_blocks_used"] == [1, 2, 2, 3, 3, 5, 3, 3, 3, 4]
        assert cols["num_prefill_tokens"] == [4, 0, 0, 3, 0, 0, 0, 0, 0, 0]
        assert cols["num_running"] == [1, 1, 1, 2, 2, 2, 1, 1, 1, 1]
    else:
        assert all(not j for j in priced) and len(priced) >= 2


def test_static_prices_the_rows_of_finished_members():
    # prompts 6, 6, 3 with outputs 2, 3, 1 (padding on, the default): C's one token comes with
    # its prefill, so C never decodes but keeps its row; after A finishes, two padded rows
    s = make_scheduler("static", budget=10)
    for i, (n, out) in enumerate(((6, 2), (6, 3), (3, 1))):
        s.add(make_request(i, n, out))
    assert step(s).padding == 0                      # prefill steps are not padded
    assert step(s).padding == 0
    p = step(s)                                      # A, B decode; C's row is padding
    assert tokens(p) == {0: 1, 1: 1} and p.decode_ctx == (6, 6) and p.padding == 1
    assert p.padded_ctx == (6, 6, 6) and p.num_batched_tokens == 2
    p = step(s)                                      # B alone, A's and C's rows padded
    assert tokens(p) == {1: 1} and p.decode_ctx == (7,) and p.padding == 2


def test_padding_is_priced_as_decodes_at_the_longest_context():
    from simserve.cards import load_hardware, load_model
    from simserve.latency import RooflineModel
    from simserve.sched.plan import StepPlan
    roof = RooflineModel(load_model("Llama-3.1-8B"), load_hardware("A100-80GB"))
    padded = StepPlan((1,), (1,), (), (), (700,), 1, padding=2)
    full = StepPlan((1, 2, 3), (1, 1, 1), (), (), (700, 700, 700), 3)
    assert roof.step_time(padded) == roof.step_time(full)
    assert roof.decode_stretch(padded)(0, 3) == [
        roof.step_time(padded._replace(decode_ctx=(700 + i,))) for i in range(3)]


def test_static_padded_batch_reserves_rows_times_the_longest_prompt_plus_output():
    # 12 blocks of 4 tokens. A (prompt 4, out 2), B (8, 6), C (4, 10), FIFO:
    #   A alone: 1 row x ceil((4 + 2) / 4) = 2 blocks <= 12
    #   + B: longest prompt 8 + longest output 6 = 14 -> 2 rows x 4 blocks = 8 <= 12
    #   + C: 8 + 10 = 18 -> 3 rows x 5 blocks = 15 > 12: C waits for the next batch
    s = make_scheduler("static", num_blocks=12)
    a, b, c = make_request(0, 4, 2), make_request(1, 8, 6), make_request(2, 4, 10)
    s.add(a), s.add(b), s.add(c)
    assert tokens(step(s)) == {0: 4, 1: 8}
    assert s.blocks.held(0) == s.blocks.held(1) == 4 and s.waiting[0] is c
    # padding: false reserves each member's own length: 2 + 4 + ceil(14 / 4) = 10 <= 12
    from simserve.sched.static import StaticParams
    s = make_scheduler("static", num_blocks=12)
    s.params = StaticParams(padding=False)
    for r in (make_request(0, 4, 2), make_request(1, 8, 6), make_request(2, 4, 10)):
        s.add(r)
    assert tokens(step(s)) == {0: 4, 1: 8, 2: 4}
    assert [s.blocks.held(i) for i in range(3)] == [2, 4, 4]
