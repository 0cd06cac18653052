"""Invariants that must hold for every policy, workload and knob setting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cards import load_hardware, load_model
from simserve.engine import Replica, round_robin, simulate
from simserve.cluster.routing import make_router
from simserve.latency.roofline import RooflineModel
from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched import ENGINE_POLICIES, POLICIES, PREFIX_CACHING_POLICIES, SchedulerLimits, \
    Status
from simserve.workload.spec import RequestSpec


class ToyLatency:
    """Deterministic, cheap, and sensitive to every part of the plan."""

    label = "toy"

    def step_time(self, plan) -> float:
        ctx = sum(plan.decode_ctx) + sum(plan.prefill_ctx)
        return 1e-3 + 2e-5 * plan.num_batched_tokens + 1e-7 * ctx + 1e-4 * plan.swap_out_blocks \
            + 1e-4 * plan.swap_in_blocks


def draw_params(draw, cls, max_model_len):
    """Random knobs for a policy's params dataclass (None if it has none). Token caps are kept
    >= max_model_len, as TGI's launcher requires, so every request can run."""
    if cls is None:
        return None
    values = {}
    for f in dataclasses.fields(cls):
        kind = str(f.type).replace(" ", "")
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if f.name.startswith("max_batch_"):
            values[f.name] = draw(st.one_of(st.none(), st.integers(max_model_len, 700)))
        elif kind.startswith("int"):
            values[f.name] = draw(st.integers(lo or 0, (lo or 0) + 40))
        elif kind.startswith("float"):
            values[f.name] = draw(st.floats(lo or 0.0, hi if hi is not None else (lo or 0.0) + 3))
        elif kind.startswith("str"):
            values[f.name] = draw(st.sampled_from(f.metadata["choices"]))
    return cls(**values)


@st.composite
def scenarios(draw):
    policy = draw(st.sampled_from(sorted(set(POLICIES) - set(ENGINE_POLICIES))))
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.integers(16, 256))
    chunked = POLICIES[policy].facts.chunked
    if chunked is None:
        chunked = draw(st.booleans())
    budget = draw(st.integers(8, 512)) if chunked else draw(st.integers(max_model_len, 600))
    min_blocks = -(-max_model_len // block_size)
    num_blocks = draw(st.integers(min_blocks // 2 + 1, min_blocks * 4))
    limits = SchedulerLimits(
        max_num_seqs=draw(st.integers(1, 16)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 64])),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
    )
    host_blocks = draw(st.integers(0, 64))
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0, 0.05), min_size=n, max_size=n))
    # prefix caching (its policies, recompute only): prompts drawn from a few shared prefixes
    prefix = policy in PREFIX_CACHING_POLICIES and limits.preemption_mode == "recompute" \
        and draw(st.booleans())
    specs = []
    t = 0.0
    for i in range(n):
        t += gaps[i]
        prompt = draw(st.integers(1, 200))
        output = draw(st.integers(1, 60))
        ids = tuple(draw(st.lists(st.integers(0, 2), min_size=-(-prompt // 8),
                                  max_size=-(-prompt // 8)))) if prefix else None
        specs.append(RequestSpec(i, t, prompt, output, ids, draw(st.integers(0, 2))))
    replicas = draw(st.integers(1, 2))
    params = draw_params(draw, POLICIES[policy].facts.params_type, max_model_len)
    return (policy, limits, block_size, num_blocks, host_blocks, max_model_len, specs, replicas,
            params, prefix)


def run_checked(policy, limits, block_size, num_blocks, host_blocks, max_model_len, specs,
                num_replicas, params=None, prefix=False, fast_forward=True, latency=None,
                router=None):
    """Run with a scheduler wrapper that checks every plan as it is made (behind
    ``router``, a fresh one each run: round_robin by default)."""
    cls = POLICIES[policy]
    replicas = []
    for i in range(num_replicas):
        blocks = PrefixBlockManager(num_blocks, block_size, source_block_size=8) if prefix \
            else BlockManager(num_blocks, block_size, host_blocks)
        sched = cls(limits, blocks, params, 3)
        sched.record_tokens = True
        replicas.append(Replica(i, sched, latency or ToyLatency(), max_model_len))
    plans = []

    for r in replicas:
        original = r.scheduler.schedule

        def checked(original=original, sched=r.scheduler):
            plan = original()
            plans.append(plan)
            assert plan.num_batched_tokens <= limits.max_num_batched_tokens
            assert plan.num_seqs <= limits.max_num_seqs
            assert len(sched.running) <= limits.max_num_seqs
            assert 0 <= sched.blocks.num_used <= sched.blocks.num_blocks
            assert 0 <= sched.blocks.num_host_free <= sched.blocks.num_host_blocks
            assert len(set(plan.request_ids)) == len(plan.request_ids)
            assert all(n >= 1 for n in plan.num_new_tokens)
            # every scheduled request holds the blocks for what it computes this step (running
            # looked up by id once per plan: a scan per request made this check most of a
            # stepped run's time)
            running = {q.id: q for q in reversed(sched.running)} if plan.request_ids else {}
            for rid, n in zip(plan.request_ids, plan.num_new_tokens):
                req = running[rid]
                assert sched.blocks.held(rid) * block_size >= req.num_computed_tokens + n
                assert req.num_computed_tokens + n <= req.num_tokens
            return plan

        r.scheduler.schedule = checked
    rec = simulate(specs, replicas, router or round_robin(), fast_forward=fast_forward)
    return rec, replicas, plans


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_for_every_policy(case):
    rec, replicas, plans = run_checked(*case)
    check_invariants(case, rec, replicas)
    assert_plans_were_checked(rec, plans)


def assert_plans_were_checked(rec, plans):
    """The per-plan checks of run_checked ran: a run that served anyone made plans through
    the wrapped ``schedule`` (they would pass vacuously if the engine went around it)."""
    served = {r.id for r in rec.requests if r.status is Status.FINISHED}
    assert plans or not served
    assert {rid for p in plans for rid in p.request_ids} <= {r.id for r in rec.requests}


def as_async(case):
    """The case with engine.async_scheduling: a vLLM v1 policy (the drawn one if it is one),
    recompute preemption."""
    policy, limits, *rest = case
    if policy not in ("vllm_v1", "priority"):
        policy = "vllm_v1"
        rest[7] = None                      # (the drawn policy's params)
    limits = dataclasses.replace(limits, preemption_mode="recompute", async_scheduling=True)
    return (policy, limits, *rest)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_with_async_scheduling(case):
    """A batch queue of two (sched/core.py launch/deliver, engine/loops.py batch_queue_loop):
    the same conservation and KV accounting; and nothing is left in flight at the end."""
    case = as_async(case)
    rec, replicas, _ = run_checked(*case)
    check_invariants(case, rec, replicas)
    for r in replicas:
        assert r.scheduler.steps_in_flight == 0
        assert all(q.num_in_flight == q.num_pending == 0 for q in rec.requests)


def check_invariants(case, rec, replicas):
    policy, limits, block_size, num_blocks, host_blocks, max_model_len, specs, nrep, *_ = case
    # every arrived request ends finished or rejected, and none is lost
    assert len(rec.requests) == len(specs)
    assert {r.id for r in rec.requests} == {s.request_id for s in specs}
    for req in rec.requests:
        too_long = req.max_tokens > max_model_len or -(-req.max_tokens // block_size) > num_blocks
        if too_long:
            assert req.status is Status.REJECTED and req.reject_reason
            continue
        assert req.status is Status.FINISHED, (req.status, req.reject_reason)
        # each output token produced exactly once, at non-decreasing times
        assert len(req.token_times) == req.num_output_tokens == req.num_generated
        assert np.all(np.diff(req.token_times) >= 0)
        assert req.spec.arrival_s <= req.first_scheduled_s < req.token_times[0]
        assert req.finish_s == req.token_times[-1]
    # all KV returned at the end
    for r in replicas:
        assert r.blocks.num_used == 0 and r.blocks.num_host_free == r.blocks.num_host_blocks
        assert not r.scheduler.has_work
    # steps of one replica never overlap and time only moves forward
    starts = {}
    cols = rec.columns()
    for i in range(len(cols["start_s"])):
        rep = cols["replica"][i]
        start, dur = cols["start_s"][i], cols["duration_s"][i]
        assert dur > 0
        assert start >= starts.get(rep, 0.0) - 1e-12
        starts[rep] = start + dur
    # tokens computed add up: prompt + generated-before-last, plus recomputation
    computed = int(rec.columns()["num_batched_tokens"].sum())
    finished_work = sum(r.max_tokens - 1 for r in rec.requests if r.status is Status.FINISHED)
    cached = sum(r.num_cached_tokens for r in rec.requests)   # prefix-cache hits: not computed
    if all(r.num_preemptions == 0 for r in rec.requests):
        assert computed + cached == finished_work
    elif not cached:
        assert computed >= finished_work


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_same_input_same_schedule(case):
    rec1, _, plans1 = run_checked(*case)
    rec2, _, plans2 = run_checked(*case)
    assert_plans_were_checked(rec1, plans1)
    assert plans1 == plans2
    assert [r.token_times for r in rec1.requests] == [r.token_times for r in rec2.requests]


def _roofline(per_output_token_s=0.0):
    return RooflineModel(load_model("Llama-3.1-8B"), load_hardware("H100-SXM"),
                         per_output_token_s=per_output_token_s)


def _by_replica(rec):
    """Each replica's steps as (start, duration, batched, running, waiting, kv) in time order."""
    s = {c: v.tolist() for c, v in rec.columns().items()}
    rows = {}
    for i in range(len(s["start_s"])):
        rows.setdefault(s["replica"][i], []).append(
            (s["start_s"][i], s["duration_s"][i], s["num_batched_tokens"][i],
             s["num_decode_seqs"][i], s["num_running"][i], s["num_waiting"][i],
             s["kv_blocks_used"][i], s["num_preempted"][i]))
    return {k: sorted(v) for k, v in rows.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_stepping(case):
    """Fast-forwarded and stepwise runs: identical steps and identical per-request times."""
    fast, _, _ = run_checked(*case, fast_forward=True)
    slow, _, _ = run_checked(*case, fast_forward=False)
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.id == b.id and a.status == b.status and a.reject_reason == b.reject_reason
        assert a.num_preemptions == b.num_preemptions
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.token_times == b.token_times


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([0.0, 7e-4]))
def test_fast_forward_equals_stepping_on_the_roofline(case, per_token):
    """As above, priced by the roofline model, whose stretches take its own fast paths
    (``decode_stretch``, and ``decode_stretch_sum`` for the segments after a finish), with
    or without a CPU cost per sampled sequence."""
    fast, _, _ = run_checked(*case, fast_forward=True, latency=_roofline(per_token))
    slow, _, _ = run_checked(*case, fast_forward=False, latency=_roofline(per_token))
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.token_times == b.token_times


@st.composite
def joining_scenarios(draw):
    """vLLM v1 or Sarathi on one replica (the solo loop, whose stretches let arrivals join them,
    for the policies with ``joins_stretch``): arrivals while others decode, KV from tight to
    ample, budgets and thresholds that sometimes cut a prompt, swap preemption with a small
    host tier now and then, and a request too long for max_model_len (rejected when it
    arrives); with priority scheduling, priorities that reorder arrivals."""
    policy = draw(st.sampled_from(["vllm_v1", "sarathi", "priority"]))
    block_size = draw(st.sampled_from([1, 4, 16, 16]))
    max_model_len = 512
    chunked = draw(st.booleans())
    budget = draw(st.integers(8, 700)) if chunked else draw(st.integers(max_model_len, 700))
    min_blocks = -(-max_model_len // block_size)
    num_blocks = draw(st.integers(min_blocks, min_blocks * draw(st.sampled_from([4, 40]))))
    limits = SchedulerLimits(
        max_num_seqs=draw(st.integers(1, 64)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 0, 5, 64])),
        reserve_full_sequence=draw(st.booleans()),
        preemption_mode=draw(st.sampled_from(["recompute", "recompute", "swap"])),
    )
    host_blocks = draw(st.integers(0, 64)) if limits.preemption_mode == "swap" else 0
    n = draw(st.integers(2, 60))
    scale = draw(st.sampled_from([0.03, 0.1, 0.1, 0.3]))     # from saturated to light
    gaps = draw(st.lists(st.floats(0, scale), min_size=n, max_size=n))
    specs = []
    t = 0.0
    for i in range(n):
        t += gaps[i]
        prompt = draw(st.integers(1, 300)) if draw(st.integers(0, 19)) else 520  # (rejected)
        specs.append(RequestSpec(i, t, prompt, draw(st.integers(1, 200)), None,
                                 draw(st.integers(0, 2)) if policy == "priority" else 0))
    return policy, limits, block_size, num_blocks, host_blocks, max_model_len, specs, 1


def _curved_roofline(name, per_output_token_s=0.0, model="Llama-3.1-8B"):
    from simserve.latency.efficiency import load_curves
    hw = {"h100": "H100-SXM", "a100": "A100-80GB", "h100-vllm": "H100-SXM"}[name]
    return RooflineModel(load_model(model), load_hardware(hw), curves=load_curves(name),
                         per_output_token_s=per_output_token_s)


def _fitted_moe():
    """The fitted H100 set (a step's and an MoE layer's fixed device times) on an MoE card."""
    return _curved_roofline("h100-vllm", model="Llama-4-Scout-17B-16E-FP8")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joining_scenarios(),
       st.sampled_from(["toy", "roofline", "h100", "a100", "roofline+cpu", "h100+cpu",
                        "h100-vllm", "h100-vllm-moe"]))
def test_stretches_that_arrivals_join_equal_stepping(case, prices):
    """Arrivals that join a stretch (sched/stretch.py, ``join``): the same steps, times and
    tokens as stepping, whichever latency model prices them (the toy model through
    ``step_time`` of the join step's plan; the roofline, with or without efficiency curves and
    a CPU cost per sampled sequence, through its ``mixed_step_sum``). That joins happen at
    all is checked over the examples (``test_arrivals_join_stretches``)."""
    latency = {"toy": lambda: None, "roofline": _roofline, "h100": lambda: _curved_roofline(
        "h100"), "a100": lambda: _curved_roofline("a100"),
        "roofline+cpu": lambda: _roofline(7e-4),
        "h100+cpu": lambda: _curved_roofline("h100", 7e-4),
        "h100-vllm": lambda: _curved_roofline("h100-vllm"), "h100-vllm-moe": _fitted_moe,
    }[prices]()
    fast, _, _ = run_checked(*case, fast_forward=True, latency=latency)
    slow, _, _ = run_checked(*case, fast_forward=False, latency=latency)
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.status == b.status and a.num_preemptions == b.num_preemptions
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.first_token_s == b.first_token_s
        assert a.token_times == b.token_times


@pytest.mark.parametrize("policy", ["vllm_v1", "sarathi", "priority"])
def test_arrivals_join_stretches(policy):
    """The joining scenarios do exercise joins: many stretches take arrivals in, and a run
    with them equals stepping (a fixed case with ample KV and budget), for each policy with
    ``joins_stretch``."""
    from simserve.sched.stretch import Stretch
    joins = []
    price = Stretch.price

    def counted(self, *args, **kwargs):
        price(self, *args, **kwargs)
        joins.append(len(self.joins))

    limits = SchedulerLimits(max_num_seqs=32, max_num_batched_tokens=2048,
                             enable_chunked_prefill=True)
    specs = [RequestSpec(i, 0.03 * i, 50 + (37 * i) % 200, 40 + (53 * i) % 150, None, i % 3)
             for i in range(200)]
    case = (policy, limits, 16, 4000, 0, 512, specs, 1)
    Stretch.price = counted
    try:
        fast, _, _ = run_checked(*case, fast_forward=True, latency=_roofline())
    finally:
        Stretch.price = price
    slow, _, _ = run_checked(*case, fast_forward=False, latency=_roofline())
    assert _by_replica(fast) == _by_replica(slow)
    assert [r.token_times for r in fast.requests] == [r.token_times for r in slow.requests]
    assert sum(joins) > 150            # most arrivals joined a stretch (200 requests)
    assert len(joins) < 20             # ... so there are few stretches


# -- fast-forward with async scheduling ----------------------------------------------------------

def _async_latency(name):
    """Latency models for the async cases: ones with a CPU part (a fixed step overhead, a cost
    per sampled row) that async scheduling overlaps, and one without."""
    return {"toy": lambda: None, "roofline": _roofline, "roofline+cpu": lambda: _roofline(7e-4),
            "h100-vllm": lambda: _curved_roofline("h100-vllm"),
            "h100+cpu": lambda: _curved_roofline("h100", 7e-4)}[name]()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joining_scenarios(), st.sampled_from(["toy", "roofline", "roofline+cpu", "h100-vllm",
                                             "h100+cpu"]))
def test_async_stretches_equal_stepping(case, prices):
    """Async scheduling on one replica (engine/loops.py's async_solo_loop, its decode
    stretches: sched/async_stretch.py) against the batch queue loop stepping: the same steps
    (times, counts, KV blocks used, running), the same per-request times and tokens, and
    nothing left in flight."""
    policy, limits, *rest = case
    case = ("priority" if policy == "priority" else "vllm_v1",
            dataclasses.replace(limits, preemption_mode="recompute", async_scheduling=True),
            *rest)
    fast, reps, _ = run_checked(*case, fast_forward=True, latency=_async_latency(prices))
    slow, _, _ = run_checked(*case, fast_forward=False, latency=_async_latency(prices))
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.status == b.status and a.num_preemptions == b.num_preemptions
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.first_token_s == b.first_token_s
        assert a.token_times == b.token_times
    check_invariants(case, fast, reps)
    assert reps[0].scheduler.steps_in_flight == 0
    assert all(q.num_in_flight == q.num_pending == 0 for q in fast.requests)


@pytest.mark.parametrize("policy", ["vllm_v1", "priority"])
def test_async_runs_fast_forward_decode_stretches(policy):
    """The async cases do take stretches, arrivals join them, and they equal stepping (fixed
    cases with a CPU part: ample KV, where most arrivals join; and KV that runs out now and
    then, where the stretches' room checks keep them out)."""
    from simserve.sched.async_stretch import AsyncStretch
    apply = AsyncStretch.apply
    limits = SchedulerLimits(max_num_seqs=32, max_num_batched_tokens=2048,
                             enable_chunked_prefill=True, async_scheduling=True)
    for gap, num_blocks in ((0.15, 4000), (0.05, 400)):
        specs = [RequestSpec(i, gap * i, 50 + (37 * i) % 200, 40 + (53 * i) % 150, None, i % 3)
                 for i in range(200)]
        sizes, joins = [], []

        def counted(self, sizes=sizes, joins=joins):
            sizes.append(self.num_steps)
            joins.append(sum(n for _, n in self.joins.values()))
            return apply(self)

        case = (policy, limits, 16, num_blocks, 0, 512, specs, 1)
        AsyncStretch.apply = counted
        try:
            fast, _, _ = run_checked(*case, fast_forward=True, latency=_roofline(7e-4))
        finally:
            AsyncStretch.apply = apply
        slow, _, _ = run_checked(*case, fast_forward=False, latency=_roofline(7e-4))
        assert _by_replica(fast) == _by_replica(slow)
        assert [r.token_times for r in fast.requests] == [r.token_times for r in slow.requests]
        steps = len(slow.columns()["start_s"])
        assert steps == len(fast.columns()["start_s"]) > 0
        if num_blocks == 4000:
            # most arrivals (one every 0.15 s) join a stretch going on (a stretch ends when
            # its longest member when planned is done): most steps in a few stretches
            assert sum(joins) > 150 and len(sizes) < 60 and sum(sizes) > steps * 3 // 4
        else:
            assert any(r.num_preemptions for r in slow.requests)   # (the KV does run out)
            assert len(sizes) > 20


# -- fast-forward with prefix caching (issue #31) ---------------------------------------------

def _cache_state(blocks):
    """What a prefix cache holds, as later hits and evictions would see it: the free pool in
    LRU order, each block's key, the cached copies of each key, the evictions so far."""
    return (blocks.free_order(), list(blocks._key), dict(blocks._cached), blocks.num_evicted,
            {rid: list(t) for rid, t in blocks._tables.items()})


@st.composite
def caching_scenarios(draw):
    """Prefix caching on a vLLM v1 policy or Sarathi on one replica (the solo loop: stretches
    past finishes that arrivals join), or priority (stretches that end at a finish): groups of
    users sharing a system prompt, each user's prompt recurring (inference-perf's
    shared_prefix), or distinct prompts; a KV cache from a few blocks more than one request
    needs (evictions all the time) to ample; sometimes two replicas (the run-ahead loop)."""
    policy = draw(st.sampled_from(["vllm_v1", "vllm_v1", "sarathi", "priority"]))
    block_size = draw(st.sampled_from([1, 4, 16, 16]))
    max_model_len = 256
    chunked = POLICIES[policy].facts.chunked
    if chunked is None:
        chunked = draw(st.booleans())
    budget = draw(st.integers(8, 600)) if chunked else draw(st.integers(max_model_len, 600))
    min_blocks = -(-max_model_len // block_size)
    num_blocks = draw(st.integers(min_blocks, min_blocks * draw(st.sampled_from([2, 4, 40]))))
    limits = SchedulerLimits(
        max_num_seqs=draw(st.integers(1, 48)),
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 0, 5, 64])),
        reserve_full_sequence=draw(st.booleans()),
    )
    groups, users = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    system = draw(st.integers(0, 80))
    questions = [draw(st.integers(1, 120)) for _ in range(groups * users)]
    distinct = draw(st.integers(0, 3)) == 0            # every prompt its own
    n = draw(st.integers(2, 70))
    scale = draw(st.sampled_from([0.005, 0.03, 0.1, 0.3]))
    gaps = draw(st.lists(st.floats(0, scale), min_size=n, max_size=n))
    specs = []
    t = 0.0
    for i in range(n):
        t += gaps[i]
        u = draw(st.integers(0, groups * users - 1)) if draw(st.booleans()) \
            else i % (groups * users)
        prompt = system + questions[u]
        # one id per 8 tokens: the group's system prompt, then the user's question
        ids = [1000 + u // users] * (system // 8) + [(u + 1) * 100 + b for b in range(
            -(-prompt // 8) - system // 8)]
        if distinct:
            ids = [(i + 1) * 10_000 + b for b in range(len(ids))]
        specs.append(RequestSpec(i, t, prompt, draw(st.integers(1, 80)), tuple(ids),
                                 draw(st.integers(0, 2))))
    replicas = 2 if draw(st.integers(0, 4)) == 0 else 1
    return (policy, limits, block_size, num_blocks, 0, max_model_len, specs, replicas, None,
            True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caching_scenarios(), st.sampled_from(["toy", "roofline", "h100", "h100-vllm-moe"]))
def test_fast_forward_with_prefix_caching_equals_stepping(case, prices):
    """With prefix caching, stretches (blocks filled by decodes cached, finished requests' blocks
    freed tail first into the LRU pool) and the arrivals that join them (their cache hits taken
    off the pool, only their uncached tails computed) give the same steps, times, tokens and
    cache hits as stepping, and leave the cache exactly as stepping does (pool order, keys,
    copies, evictions)."""
    latency = {"toy": lambda: None, "roofline": _roofline,
               "h100": lambda: _curved_roofline("h100"), "h100-vllm-moe": _fitted_moe}[prices]()
    _cached_runs_equal(case, latency)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caching_scenarios(), st.integers(2, 4),
       st.sampled_from(["least_outstanding", "least_kv", "jsq_tokens", "prefix_aware"]),
       st.sampled_from(["toy", "roofline", "h100"]))
def test_clusters_with_prefix_caching_behind_counting_routers_equal_stepping(
        case, replicas, router, prices):
    """Prefix caching on 2-4 replicas behind a router that reads what a stretch in flight can
    tell at each of its steps (engine/loops.py's counted loop: stretches past arrivals and
    finishes, cut back where a request is routed, the named blocks' operations replayed as far
    as the router looks): each request goes where stepping sends it, and the same steps,
    times, tokens and cache hits, and caches left, as stepping."""
    latency = {"toy": lambda: None, "roofline": _roofline,
               "h100": lambda: _curved_roofline("h100")}[prices]()
    _cached_runs_equal((*case[:7], replicas, *case[8:]), latency, router)


def _cached_runs_equal(case, latency, router=None):
    """``case`` fast-forwarded and stepped, with prefix caching (behind ``router``, by name;
    round_robin by default): the same steps, per-request times, tokens and cache hits, and
    the caches left alike."""
    fast, fast_replicas, _ = run_checked(*case, fast_forward=True, latency=latency,
                                         router=router and make_router(router))
    slow, slow_replicas, _ = run_checked(*case, fast_forward=False, latency=latency,
                                         router=router and make_router(router))
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.replica == b.replica
        assert a.status == b.status and a.num_preemptions == b.num_preemptions
        assert a.num_cached_tokens == b.num_cached_tokens
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.token_times == b.token_times
    for f, s in zip(fast_replicas, slow_replicas):
        assert _cache_state(f.blocks) == _cache_state(s.blocks)
        assert f.blocks.cache_limits == s.blocks.cache_limits == {}
    check_invariants(case, fast, fast_replicas)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caching_scenarios(), st.sampled_from(["toy", "roofline+cpu", "h100-vllm"]))
def test_async_stretches_with_prefix_caching_equal_stepping(case, prices):
    """Async scheduling with prefix caching (sched/async_stretch.py with the cache replay, each
    member's free a step late): the same steps, times, tokens and cache hits as the stepped
    batch queue, and the cache left exactly as stepping leaves it (pool order, keys, copies,
    evictions), on one replica (the async solo loop) and on two (stepped)."""
    policy, limits, *rest = case
    case = ("priority" if policy == "priority" else "vllm_v1",
            dataclasses.replace(limits, async_scheduling=True), *rest)
    _cached_runs_equal(case, _async_latency(prices))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(joining_scenarios(), caching_scenarios()), st.integers(2, 4),
       st.sampled_from(["toy", "roofline+cpu", "h100-vllm", "h100+cpu"]),
       st.sampled_from(["least_outstanding", "least_kv", "jsq_tokens", "prefix_aware"]))
def test_async_clusters_behind_counting_routers_equal_stepping(case, replicas, prices, router):
    """Async scheduling on 2-4 replicas behind least_outstanding, least_kv, jsq_tokens or
    prefix_aware (engine/loops.py's async_counted_loop: async stretches past arrivals and
    finishes, held as flights that a request routed to the replica cuts back to the steps
    scheduled before it came; the finishes delivered before an arrival counted off first, and
    the KV use, tokens of work left or prefix cache the router reads those of the step each
    flight is at), with and without prefix caching, against the batch queue loop stepping
    every replica: each request goes where stepping sends it, with the same steps,
    per-request times and tokens, and caches left."""
    policy, limits, *rest = case
    if len(rest) == 6:                       # (joining_scenarios: no params, no caching)
        rest += [None, False]
    rest[5] = replicas
    case = ("priority" if policy == "priority" else "vllm_v1",
            dataclasses.replace(limits, preemption_mode="recompute", async_scheduling=True),
            *rest[:6], None, rest[7])
    fast, reps, _ = run_checked(*case, fast_forward=True, latency=_async_latency(prices),
                                router=make_router(router))
    slow, slow_reps, _ = run_checked(*case, fast_forward=False, latency=_async_latency(prices),
                                     router=make_router(router))
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.replica == b.replica and a.status == b.status
        assert a.num_preemptions == b.num_preemptions
        assert a.num_cached_tokens == b.num_cached_tokens
        assert a.first_scheduled_s == b.first_scheduled_s and a.finish_s == b.finish_s
        assert a.token_times == b.token_times
    for f, s in zip(reps, slow_reps):
        assert f.scheduler.steps_in_flight == 0
        if case[9]:
            assert _cache_state(f.blocks) == _cache_state(s.blocks)


def test_async_prefix_caching_runs_take_stretches():
    """The async cache cases do take stretches, and arrivals join them with their cache hits: a
    shared-prefix chat load (groups of users sharing a system prompt, each user's prompt
    recurring) with a tight cache, fast-forwarded and stepped alike, with hits and
    evictions."""
    from simserve.sched.async_stretch import AsyncStretch
    sizes, joins = [], []
    apply = AsyncStretch.apply

    def counted(self):
        if self.cache is not None:
            sizes.append(self.num_steps)
            joins.append(sum(n for _, n in self.joins.values()))
        return apply(self)

    limits = SchedulerLimits(max_num_seqs=16, max_num_batched_tokens=512,
                             enable_chunked_prefill=True, async_scheduling=True)
    specs = []
    for i in range(150):
        u = (7 * i) % 12                     # 12 users in 3 groups, prompts recurring
        ids = [1000 + u // 4] * 6 + [(u + 1) * 100 + b for b in range(4)]
        specs.append(RequestSpec(i, 0.2 * i, 80, 30 + (13 * i) % 60, tuple(ids)))
    case = ("vllm_v1", limits, 16, 60, 0, 256, specs, 1, None, True)
    AsyncStretch.apply = counted
    try:
        fast, fast_replicas, _ = run_checked(*case, fast_forward=True, latency=_roofline(7e-4))
    finally:
        AsyncStretch.apply = apply
    slow, slow_replicas, _ = run_checked(*case, fast_forward=False, latency=_roofline(7e-4))
    assert _by_replica(fast) == _by_replica(slow)
    assert [(r.num_cached_tokens, r.token_times) for r in fast.requests] == \
        [(r.num_cached_tokens, r.token_times) for r in slow.requests]
    assert _cache_state(fast_replicas[0].blocks) == _cache_state(slow_replicas[0].blocks)
    steps = len(slow.columns()["start_s"])
    assert len(sizes) > 10 and sum(sizes) > steps // 2 and sum(joins) > 50
    assert sum(r.num_cached_tokens for r in slow.requests) > 0          # hits
    assert slow_replicas[0].blocks.num_evicted > 0                        # and evictions


@pytest.mark.parametrize("policy", ["vllm_v1", "sarathi", "priority"])
@pytest.mark.parametrize("num_blocks", [150, 4000])
def test_arrivals_with_cache_hits_join_stretches(policy, num_blocks):
    """Shared-prefix chat (9 groups x 5 users, each user's prompt recurring): arrivals join
    stretches with their cache hits, under eviction pressure (150 blocks of 16: about four
    requests' worth, so cached prefixes are evicted all the time) and with ample KV; the run
    equals stepping, cache and all."""
    from simserve.sched.stretch import Stretch
    joins, hit_joins = [], []
    price = Stretch.price

    def counted(self, *args, **kwargs):
        price(self, *args, **kwargs)
        joins.append(len(self.joins))
        hit_joins.extend(m[0].num_cached_tokens > 0 for m in self.members[self.planned:])

    limits = SchedulerLimits(max_num_seqs=32, max_num_batched_tokens=2048,
                             enable_chunked_prefill=True, reserve_full_sequence=True)
    specs = []
    for i in range(300):
        u = i % 45
        specs.append(RequestSpec(i, 0.02 * i, 100 + 47 + u, 20 + (13 * i) % 60, tuple(
            [1000 + u // 5] * 12 + [(u + 1) * 100 + b for b in range(7)])))
    case = (policy, limits, 16, num_blocks, 0, 512, specs, 1, None, True)
    Stretch.price = counted
    try:
        fast, fr, _ = run_checked(*case, fast_forward=True, latency=_roofline())
    finally:
        Stretch.price = price
    slow, sr, _ = run_checked(*case, fast_forward=False, latency=_roofline())
    assert _by_replica(fast) == _by_replica(slow)
    assert [(r.token_times, r.num_cached_tokens) for r in fast.requests] == \
        [(r.token_times, r.num_cached_tokens) for r in slow.requests]
    assert _cache_state(fr[0].blocks) == _cache_state(sr[0].blocks)
    if num_blocks == 150:     # stretches are short (their blocks bound them), joins rarer
        assert sum(hit_joins) > 5 and fr[0].blocks.num_evicted > 1000
    else:
        assert sum(joins) > 150             # most arrivals joined a stretch
        assert sum(hit_joins) > 100         # ... with prefix-cache hits
        assert fr[0].blocks.num_evicted == 0


def test_arrivals_that_would_share_blocks_cached_at_their_step_are_stepped():
    """Two requests with the same prompt arrive together while a stretch runs: the second's
    hit would be lengthened by the blocks the first caches at that very step, which the
    stretch cannot know beforehand (``_CacheReplay.hits``), so the stretch ends there and that
    step is stepped; the second request finds the first's blocks as stepping does."""
    from simserve.sched.stretch import _CacheReplay
    refused = []
    hits = _CacheReplay.hits

    def counted(self, specs, *args):
        got = hits(self, specs, *args)
        refused.append(len(specs) > 1 and got is None)
        return got

    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1024,
                             enable_chunked_prefill=True)
    same = tuple(range(7, 7 + 8))                      # 64 tokens of shared content
    specs = [RequestSpec(0, 0.0, 40, 200, (1, 2, 3, 4, 5)),
             RequestSpec(1, 0.5, 64, 20, same), RequestSpec(2, 0.5, 64, 20, same)]
    case = ("vllm_v1", limits, 4, 400, 0, 512, specs, 1, None, True)
    _CacheReplay.hits = counted
    try:
        fast, fr, _ = run_checked(*case, fast_forward=True, latency=_roofline())
    finally:
        _CacheReplay.hits = hits
    slow, sr, _ = run_checked(*case, fast_forward=False, latency=_roofline())
    assert _by_replica(fast) == _by_replica(slow)
    assert [(r.token_times, r.num_cached_tokens) for r in fast.requests] == \
        [(r.token_times, r.num_cached_tokens) for r in slow.requests]
    assert _cache_state(fr[0].blocks) == _cache_state(sr[0].blocks)
    assert any(refused)
    # the second takes the first's whole blocks, cached in the step both were admitted in
    assert [r.num_cached_tokens for r in slow.requests] == [0, 0, 60]
