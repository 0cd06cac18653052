"""KV offload to a host tier (issue #18): capacity, write-through, loads, conservation."""

from __future__ import annotations

import random

import pytest

from simserve.kv.offload import OffloadingBlockManager, host_blocks


def test_host_blocks_from_vllm_size():
    # 1 GiB over TP 2, blocks of 24,576 B per rank: 2^30 / 2 / 24,576 = 21,845.3
    assert host_blocks(1.0, 2, 24_576) == 21_845


def _admit(m, rid, prompt, ids):
    m.register(rid, prompt, ids)
    cached = m.cached_tokens(rid, prompt)
    assert m.can_hold(rid, prompt, cached)
    assert m.allocate_cached(rid, prompt, cached) is not None if cached else \
        m.allocate(rid, prompt) is not None
    return cached


def test_evicted_prefix_is_served_from_the_host_tier():
    # 4 device blocks of 4 tokens, 8 host blocks; source blocks of 4 tokens (one id each)
    m = OffloadingBlockManager(4, 4, 8, source_block_size=4)
    assert _admit(m, 1, 13, [1, 2, 3, 4]) == 0        # 13 tokens: 4 blocks, 3 full ones cached
    assert m.num_stored == 3 and m.num_host_used == 3  # written through to the host
    m.free(1)
    assert _admit(m, 2, 13, [9, 8, 7, 6]) == 0         # other content evicts all of request 1's
    m.free(2)
    m.register(3, 13, [1, 2, 3, 4])
    # device holds request 2's blocks now; the host still holds 1's three: 12 tokens cached
    assert m.cached_tokens(3, 13) == 12
    assert _admit(m, 3, 13, [1, 2, 3, 4]) == 12
    assert m.take_loaded() == 3 and m.take_loaded() == 0 and m.num_loaded == 3
    # the loaded blocks are device-cached again: a fourth request hits them on the device
    m.free(3)
    m.register(4, 13, [1, 2, 3, 4])
    assert _admit(m, 4, 13, [1, 2, 3, 4]) == 12 and m.take_loaded() == 0


def test_host_tier_is_bounded_and_lru():
    m = OffloadingBlockManager(8, 4, 2, source_block_size=4)
    _admit(m, 1, 13, [1, 2, 3])            # 3 full blocks stored, capacity 2: oldest evicted
    assert m.num_host_used == 2 and m.num_host_evicted == 1 and m.num_stored == 3


def test_blocks_are_conserved_under_random_traffic():
    rng = random.Random(5)
    m = OffloadingBlockManager(40, 4, 25, source_block_size=4)
    live = {}
    for rid in range(400):
        if live and (rng.random() < 0.5 or len(live) > 6):
            victim = rng.choice(sorted(live))
            m.free(victim)
            del live[victim]
        prompt = rng.randint(2, 30)
        ids = [rng.randint(0, 5) for _ in range(8)]
        m.register(rid, prompt, ids)
        cached = m.cached_tokens(rid, prompt)
        if not m.can_hold(rid, prompt, cached):
            continue
        got = (m.allocate_cached(rid, prompt, cached) if cached
               else m.allocate(rid, prompt))
        assert got is not None
        live[rid] = prompt
        m.take_loaded()
        # device: free + held (distinct blocks) = total; host within capacity
        m.check()
        held = {b for t in m._tables.values() for b in t}   # with identities, and anonymous
        anon = sum(h - len(m._tables.get(r, ())) for r, h in m.blocks_held.items())
        assert m.num_free + len(held) + anon == 40
        assert 0 <= m.num_host_used <= 25
        assert all(m.held(r) * 4 >= p for r, p in live.items())
    assert m.num_loaded > 0 and m.num_host_evicted > 0


def test_host_hits_are_loaded_in_the_admitting_step_and_priced_on_the_host_link():
    from simserve.cards import load_hardware, load_model
    from simserve.latency.roofline import RooflineModel
    from simserve.sched import POLICIES, SchedulerLimits
    from simserve.workload.spec import RequestSpec
    from simserve.sched.request import Request
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64,
                             enable_chunked_prefill=True)
    m = OffloadingBlockManager(5, 4, 16, source_block_size=4)
    s = POLICIES["vllm_v1"](limits, m)

    def serve(rid, ids, out=1):
        req = Request(RequestSpec(rid, 0.0, 13, out, tuple(ids)))
        s.add(req)
        plans = []
        while s.has_work:
            plans.append(s.schedule())
            s.complete(plans[-1], 0.0)
        return req, plans

    serve(1, [1, 2, 3, 4])                   # stores its 3 full blocks on the host
    serve(2, [5, 6, 7, 8])
    # request 2's 4 blocks came from the pool's head: the never-used block, request 1's
    # partial block, then its cached blocks tail first (vLLM's order): its first block
    # survives on the device, the next two are only on the host
    req, plans = serve(3, [1, 2, 3, 4])
    # 12 of 13 prompt tokens cached: 1 block on the device, 2 loaded, 1 token computed
    assert req.num_cached_tokens == 12 and plans[0].swap_in_blocks == 2 == m.num_loaded
    assert plans[0].prefill_lens == (1,) and plans[0].prefill_ctx == (12,)
    tiny = load_model("tiny-llama-45m")
    roof = RooflineModel(tiny, load_hardware("H100-SXM"), block_size=4)
    # 2 blocks × 4 tokens × 8,192 B/token over 64 GB/s
    assert roof.breakdown(plans[0])["swap"] == pytest.approx(2 * 4 * 8192 / 64e9)


def test_offload_needs_prefix_caching_and_native_backend():
    from simserve.config import parse_scenario
    from simserve.errors import ConfigError
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512, "kv_offloading_size": 1.0},
           "workload": {"num_requests": 2, "rate": 1, "prompt": {"dist": "fixed", "value": 8},
                        "output": {"dist": "fixed", "value": 4}}}
    with pytest.raises(ConfigError, match="enable_prefix_caching") as e:
        parse_scenario(raw)
    assert e.value.field == "engine.kv_offloading_size"
    raw["engine"]["enable_prefix_caching"] = True
    raw["engine"]["kv_offloading_backend"] = "lmcache"
    with pytest.raises(ConfigError, match="not modelled"):
        parse_scenario(raw)
    raw["engine"]["kv_offloading_backend"] = "native"
    s = parse_scenario(raw)
    # 1 GiB over 1 rank, 16 tokens × 8,192 B per block
    assert s.replica.num_offload_blocks == 2**30 // (16 * 8192)
    raw["engine"]["kv_offloading_size"] = -1
    with pytest.raises(ConfigError) as e:
        parse_scenario(raw)
    assert e.value.field == "engine.kv_offloading_size"


# ---------------------------------------------------------------- through the scheduler

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def offload_cases(draw):
    from simserve.workload.spec import RequestSpec
    block_size = draw(st.sampled_from([4, 8, 16]))
    num_blocks = draw(st.integers(20, 80))
    host = draw(st.integers(0, 200))
    n = draw(st.integers(1, 30))
    specs, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0, 0.02))
        prompt = draw(st.integers(1, 150))
        ids = tuple(draw(st.lists(st.integers(0, 2), min_size=-(-prompt // 8),
                                  max_size=-(-prompt // 8))))
        specs.append(RequestSpec(i, t, prompt, draw(st.integers(1, 30)), ids))
    return block_size, num_blocks, host, specs, draw(st.sampled_from(["vllm_v1", "sarathi"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offload_cases())
def test_offload_runs_keep_blocks_and_tokens(case):
    from simserve.engine import Replica, round_robin, simulate
    from simserve.sched import POLICIES, SchedulerLimits
    block_size, num_blocks, host, specs, policy = case
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=128,
                             enable_chunked_prefill=True, max_model_len=256)

    def run(fast_forward):
        m = OffloadingBlockManager(num_blocks, block_size, host, source_block_size=8)
        sched = POLICIES[policy](limits, m, None, 0)
        sched.record_tokens = True
        original = sched.schedule
        calls = []

        def checked():
            plan = original()
            calls.append(plan)
            assert 0 <= m.num_used <= num_blocks and 0 <= m.num_host_used <= host
            assert plan.swap_in_blocks <= num_blocks
            for rid, n in zip(plan.request_ids, plan.num_new_tokens):
                req = next(q for q in sched.running if q.id == rid)
                assert m.held(rid) * block_size >= req.num_computed_tokens + n
            return plan

        sched.schedule = checked
        rec = simulate(specs, [Replica(0, sched, _Toy(), 256)], round_robin(),
                       fast_forward=fast_forward)
        # the checks above ran (they pass vacuously if the engine goes around schedule)
        assert calls or all(r.status.value == "rejected" for r in rec.requests)
        return rec, m

    fast, m = run(True)
    slow, _ = run(False)
    assert sorted(r.id for r in fast.requests) == sorted(s.request_id for s in specs)  # all here
    assert [(r.id, r.status, r.token_times) for r in fast.requests] == \
        [(r.id, r.status, r.token_times) for r in slow.requests]
    for r in fast.requests:
        assert r.status.value in ("finished", "rejected")
        if r.status.value == "finished":
            assert len(r.token_times) == r.num_output_tokens
    assert m.num_used == 0                       # every block back in the pool
    assert m.num_loaded <= m.num_stored or host == 0


class _Toy:
    label = "toy"

    def step_time(self, plan) -> float:
        return 1e-3 + 2e-5 * plan.num_batched_tokens + 1e-4 * plan.swap_in_blocks
