"""Hand-stepped tests of ``engine.async_scheduling`` (vLLM's AsyncScheduler, read in vLLM 0.32's
vllm/v1/core/sched/async_scheduler.py, scheduler.py and engine/core.py
``step_with_batch_queue``): step n+1 is scheduled while step n runs, after the output of n-1
is delivered (``Scheduler.launch`` / ``deliver``; engine/loops.py ``batch_queue_loop``)."""

from __future__ import annotations

import pytest

from simserve.config import parse_scenario
from simserve.engine import Replica, round_robin, simulate
from simserve.errors import ConfigError
from simserve.kv.blocks import BlockManager
from simserve.latency import ConstantLatency
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched import POLICIES, SchedulerLimits, Status
from simserve.workload.spec import RequestSpec
from tests.helpers import make_request, tokens


def v1(num_blocks=100, budget=100, block_size=4, policy="vllm_v1", overlap=True,
       prefix=False):
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                             enable_chunked_prefill=True, reserve_full_sequence=True,
                             async_scheduling=overlap)
    blocks = PrefixBlockManager(num_blocks, block_size) if prefix \
        else BlockManager(num_blocks, block_size)
    return POLICIES[policy](limits, blocks)


def test_a_request_whose_last_token_is_in_flight_is_not_scheduled_but_keeps_its_blocks():
    # A: prompt 8, 2 outputs; blocks of 4. Depth 2: schedule n+1 before delivering n.
    s = v1()
    a = make_request(0, 8, 2)
    s.add(a)
    p0 = s.schedule()
    assert tokens(p0) == {0: 8}                 # the prompt (2 blocks)
    f0 = s.launch(p0)
    # counters move at launch: 8 computed, its 1st token counted and pending
    assert (a.num_computed_tokens, a.num_generated, a.num_pending) == (8, 1, 1)
    p1 = s.schedule()                           # while step 0 runs: a decode of the placeholder
    assert tokens(p1) == {0: 1} and p1.decode_ctx == (8,)
    f1 = s.launch(p1)                           # 9 computed (3 blocks), 2nd (last) token pending
    assert (a.num_computed_tokens, a.num_generated, a.num_pending) == (9, 2, 2)
    assert s.deliver(f0, 1.0) == [] and s.sampled == [a]    # 1st token reaches the client
    assert a.num_pending == 1
    # its last token is in flight: vLLM does not schedule it again, it keeps blocks and slot
    assert s.schedule().is_empty
    assert a.status is Status.RUNNING and s.running == [a] and s.blocks.num_free == 100 - 3
    assert s.deliver(f1, 2.0) == [a]            # the 2nd token: done, blocks freed now
    assert a.status is Status.FINISHED and a.finish_s == 2.0 and s.blocks.num_free == 100
    assert not s.has_work and s.steps_in_flight == 0


def test_blocks_a_finish_frees_are_seen_one_step_later():
    # 3 blocks of 4: room for one prompt of 8 at a time.
    for overlap, expected in ((False, [{0: 8}, {0: 1}, {1: 8}]),
                              (True, [{0: 8}, {0: 1}, {}, {1: 8}])):
        s = v1(num_blocks=3, overlap=overlap)
        a, b = make_request(0, 8, 2), make_request(1, 8, 1)
        s.add(a), s.add(b)
        # step 0: A's prompt takes 2 of 3 blocks; B's prompt needs 2: waits.
        # step 1: A decodes (9 tokens: its 3rd block); its last token.
        # sync, step 2: A finished and freed (3 blocks): B's prompt.
        # async: the schedule after A's last launch finds A's token in flight (A skipped)
        # and its blocks still held (B waits: an empty plan); after A's output, B goes in.
        got, in_flight = [], []
        while len(got) < len(expected):
            p = s.schedule()
            got.append(tokens(p))
            if not overlap:
                s.complete(p, 0.0)
                continue
            if not p.is_empty:
                in_flight.append(s.launch(p))
            if len(in_flight) == 2 or p.is_empty and in_flight:
                s.deliver(in_flight.pop(0), 0.0)
        assert got == expected


def test_a_preempted_request_still_gets_its_in_flight_token_and_recomputes_it():
    # 3 blocks of 4, budget 100. A (prompt 4, 6 out), B (prompt 3, 6 out).
    s = v1(num_blocks=3)
    a, b = make_request(0, 4, 6), make_request(1, 3, 6)
    s.add(a), s.add(b)
    f0 = s.launch(p := s.schedule())
    assert tokens(p) == {0: 4, 1: 3}           # 1 block each; both sample their 1st token
    # schedule 1 (step 0 in flight): A decodes at ctx 4 (5 tokens: a 2nd block, the last
    # free one); B decodes at ctx 3 (fits its block)
    f1 = s.launch(p := s.schedule())
    assert tokens(p) == {0: 1, 1: 1}
    s.deliver(f0, 1.0)                          # 1st tokens of both
    # schedule 2 (step 1 in flight, B's 2nd token pending): A at ctx 5 fits; B at ctx 4
    # needs a 2nd block: none free, and B is the newest: B preempts itself
    p2 = s.schedule()
    assert tokens(p2) == {0: 1} and p2.num_preempted == 1
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.num_generated == 2 and b.num_pending == 0 and b.num_in_flight == 1   # stale
    f2 = s.launch(p2)
    # step 1's output: B's stale 2nd token still reaches the client (vLLM delivers it)
    s.deliver(f1, 2.0)
    assert b in s.sampled and b.num_generated == 2 and b.num_in_flight == 0
    # B recomputes prompt + both tokens (3 + 2 = 5 tokens, 2 blocks) once they fit: A holds
    # 2 of the 3 blocks (7 tokens after step 3), so B waits, A decodes alone
    assert tokens(p := s.schedule()) == {0: 1}
    assert b.status is Status.WAITING
    s.launch(p)
    s.deliver(f2, 3.0)
    # A: 4 launches (prompt, 3 decodes), 3 outputs in: 4 tokens counted, 1 of them pending
    assert a.num_generated == 4 and a.num_pending == 1 and a.num_computed_tokens == 7


def test_a_request_preempted_with_its_last_token_in_flight_finishes_from_the_waiting_queue():
    # A (prompt 4, 3 out) and B (prompt 3, 2 out); 3 blocks of 4.
    s = v1(num_blocks=3)
    a, b = make_request(0, 4, 3), make_request(1, 3, 2)
    s.add(a), s.add(b)
    f0 = s.launch(s.schedule())                 # A 4, B 3 (1 block each)
    f1 = s.launch(s.schedule())                 # A ctx 4 (2nd block), B ctx 3: B's last token
    assert b.num_generated == 2 and b.num_pending == 2
    s.deliver(f0, 1.0)
    # schedule 2: A at ctx 5 fits its 2 blocks (A's 3rd, its last, token); B is skipped (its
    # last token is in flight) -- and nobody needs a block, so nobody is preempted
    p2 = s.schedule()
    assert tokens(p2) == {0: 1}
    f2 = s.launch(p2)
    assert s.deliver(f1, 2.0) == [b] and b.status is Status.FINISHED
    assert s.deliver(f2, 3.0) == [a]
    # now force the case: B preempted while its last token is in flight
    s = v1(num_blocks=2)
    a, b = make_request(0, 4, 4), make_request(1, 3, 2)
    s.add(a), s.add(b)
    f0 = s.launch(s.schedule())                 # A 4, B 3: 1 block each, none free
    # schedule 1: A at ctx 4 needs a 2nd block: B (newest) is preempted, with its 1st token
    # in flight (its last but one) -- nothing else: B's 2nd token comes after a recompute
    p1 = s.schedule()
    assert tokens(p1) == {0: 1} and b.status is Status.WAITING and b.num_generated == 1
    f1 = s.launch(p1)
    assert s.deliver(f0, 1.0) == [] and b in s.sampled     # its stale 1st token arrives
    s.launch(s.schedule())
    s.deliver(f1, 2.0)
    # a request whose *last* token is stale: B2 (prompt 3, 1 out) preempted in flight
    s = v1(num_blocks=2)
    a, b = make_request(0, 4, 4), make_request(1, 3, 1)
    s.add(a), s.add(b)
    f0 = s.launch(s.schedule())                 # A 4, B 3 (B's only token in flight)
    p1 = s.schedule()                           # A needs a block; B is skipped (done in
    assert tokens(p1) == {0: 1}                 # flight) but still the newest: preempted
    assert p1.num_preempted == 1 and b.status is Status.WAITING and b in s.waiting
    s.launch(p1)
    finished = s.deliver(f0, 1.0)               # B's token arrives: it finishes, from waiting
    assert finished == [b] and b.status is Status.FINISHED and b.finish_s == 1.0
    assert b not in s.waiting and b not in s.running


def test_a_request_preempted_with_a_step_in_flight_is_skipped_until_that_step_drains():
    # (reachable with a deeper batch queue: here a step is left in flight by hand)
    s = v1(num_blocks=10)
    a, b, c = make_request(0, 4, 3), make_request(1, 4, 3), make_request(2, 4, 1)
    s.add(a)
    f0 = s.launch(s.schedule())
    s.waiting.appendleft(a)                     # as if A had been preempted with step 0 in
    s.running.remove(a)                         # flight: waiting, one step of it undelivered
    a.status, a.num_computed_tokens, a.num_pending = Status.WAITING, 0, 0
    s.blocks.free(a.id)
    s.add(b), s.add(c)
    p = s.schedule()
    assert tokens(p) == {1: 4, 2: 4}            # A skipped, B and C admitted behind it
    assert list(s.waiting) == [a]               # A keeps its place
    s.launch(p)
    s.deliver(f0, 1.0)
    assert a.num_in_flight == 0
    assert tokens(s.schedule())[0] == 4 + 1     # A now recomputes prompt + its token


def test_prefix_blocks_are_cached_only_once_their_tokens_are_known():
    # blocks of 4; A prompt 7, 5 outputs. The decode at ctx 7 feeds A's 1st token (position
    # 7) while it is still being sampled: the block 4..7 is full but its content unknown.
    # vLLM caches up to request.num_tokens (no placeholders) at allocation, and up to
    # num_computed - placeholders when an output is in.
    s = v1(prefix=True)
    a = make_request(0, 7, 5)
    s.add(a)
    f0 = s.launch(s.schedule())                 # prompt 7: block 0 full, cached
    f1 = s.launch(s.schedule())                 # decode at ctx 7: block 1 full, token unknown
    cached = s.blocks.keyed_blocks              # A's leading blocks cached
    assert cached[a.id] == 1                    # block 0 only
    s.deliver(f0, 1.0)      # token 1 in: 8 computed - 1 placeholder = 7 tokens: block 1 not full
    assert cached[a.id] == 1
    s.launch(s.schedule())  # decode at ctx 8: allocation caches up to num_tokens = 7 + 1 = 8
    assert cached[a.id] == 2
    s.deliver(f1, 2.0)
    # synchronously the block is cached at the decode's schedule (its token is known then)
    s = v1(prefix=True, overlap=False)
    a = make_request(0, 7, 5)
    s.add(a)
    s.complete(s.schedule(), 1.0)
    s.schedule()
    assert s.blocks.keyed_blocks[a.id] == 2
    # and a preempted request finds them: its own content, cached
    s.blocks.free(a.id)
    s.blocks.register(a.id, 7, None)
    assert s.blocks.cached_tokens(a.id, 9) == 8


def _scenario(async_scheduling: bool, **engine) -> dict:
    return {
        "name": "t", "model": "tiny-llama-45m", "hardware": "cpu-epyc-2core",
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 16,
                   "num_gpu_blocks": 100, "max_model_len": 512,
                   "async_scheduling": async_scheduling, **engine},
        "scheduler": {"policy": "vllm_v1"},
        "latency": {"model": "constant", "step_ms": 10.0},
        "workload": {"num_requests": 1, "rate": 1.0, "prompt": {"dist": "fixed", "value": 8},
                     "output": {"dist": "fixed", "value": 4}},
    }


def _simulate(async_scheduling: bool, specs):
    from simserve.engine.build import build_replicas
    s = parse_scenario(_scenario(async_scheduling))
    replicas = build_replicas(s)
    for r in replicas:
        r.scheduler.record_tokens = True
    rec = simulate(specs, replicas, round_robin())
    return {r.id: r for r in rec.requests}


def test_an_arrival_is_seen_one_step_later_and_token_times_follow():
    # 10 ms a step. A (prompt 8, 4 out) at 0; B (prompt 8, 4 out) at 15 ms.
    # sync: steps at 0, 10, 20, 30: A's tokens at 10, 20, 30, 40; B arrives during the step
    #   10-20 and is scheduled at 20 (its prompt, beside A's decode): tokens 30, 40, 50, 60.
    # async: step 0 [0, 10] is scheduled at 0, step 1 [10, 20] at 0 too (queue of 2), step 2
    #   [20, 30] at 10 (after step 0's output), step 3 [30, 40] at 20: the first schedule
    #   after B's arrival, so B's prompt runs 30-40: tokens 40, 50, 60, 70. A's tokens are
    #   unchanged (10, 20, 30, 40): its 4th token's step (3, scheduled at 20) ends at 40.
    specs = [RequestSpec(0, 0.0, 8, 4), RequestSpec(1, 0.015, 8, 4)]
    sync, over = _simulate(False, specs), _simulate(True, specs)
    assert sync[0].token_times == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert over[0].token_times == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert sync[1].first_scheduled_s == pytest.approx(0.02)
    assert sync[1].token_times == pytest.approx([0.03, 0.04, 0.05, 0.06])
    assert over[1].first_scheduled_s == pytest.approx(0.03)
    assert over[1].token_times == pytest.approx([0.04, 0.05, 0.06, 0.07])


def test_async_scheduling_refuses_what_it_does_not_model():
    for engine, policy, message in (
            ({}, "orca", "AsyncScheduler"),
            ({"preemption_mode": "swap"}, "vllm_v1", "recompute only"),
            ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                     "synthetic_acceptance_length": 1.5}},
             "vllm_v1", "speculative")):
        raw = _scenario(True, **engine)
        raw["scheduler"] = {"policy": policy}
        with pytest.raises(ConfigError, match=message) as e:
            parse_scenario(raw)
        assert e.value.field == "engine.async_scheduling"


def test_async_scheduling_with_pipeline_parallelism_is_vllms_v2_runner():
    # both are vLLM's batch queue (async: depth 2; PP: depth p); vLLM 0.32 combines them on
    # its V2 model runner with a queue of p + 1 (vllm/config/vllm.py max_concurrent_batches)
    raw = _scenario(True, pipeline_parallel_size=2)
    raw["latency"] = {"model": "roofline"}
    s = parse_scenario(raw)
    assert s.engine.pipeline_parallel_size == 2 and s.engine.async_scheduling
    assert s.replica.limits.pipeline_queue_depth == 3
    raw["engine"]["async_scheduling"] = False
    assert parse_scenario(raw).replica.limits.pipeline_queue_depth == 2
    # only vLLM v1's policies have an AsyncScheduler, pipelined or not
    raw["engine"]["async_scheduling"] = True
    raw["scheduler"] = {"policy": "sarathi"}
    with pytest.raises(ConfigError, match="AsyncScheduler") as e:
        parse_scenario(raw)
    assert e.value.field == "engine.async_scheduling"


def test_off_by_default_and_not_written_unless_set():
    raw = _scenario(False)
    del raw["engine"]["async_scheduling"]
    s = parse_scenario(raw)
    assert s.engine.async_scheduling is False and s.replica.limits.batch_queue_depth == 1
    assert "async_scheduling" not in s.to_dict()["engine"]
    on = parse_scenario(_scenario(True))
    assert on.replica.limits.batch_queue_depth == 2
    assert on.to_dict()["engine"]["async_scheduling"] is True
    assert Replica(0, POLICIES["vllm_v1"](on.replica.limits, BlockManager(10, 4)),
                   ConstantLatency(0.01), 512).batch_queue_depth == 2


class OverheadLatency:
    """10 ms a step, of which ``step_overhead_s`` is the engine's CPU work."""

    label = "10 ms a step"

    def __init__(self, overhead_s: float):
        self.step_overhead_s = overhead_s

    def step_time(self, plan):
        return 0.010


@pytest.mark.parametrize("overhead, times", [
    # 3 ms CPU + 7 ms device. Step 0: scheduled at 0, CPU 0-3, device 3-10. Step 1: scheduled
    # at 0 too, CPU 0-3, device after step 0: 10-17. Step 2: scheduled at 10 (step 0's output
    # in), CPU 10-13, device 17-24. Step 3: scheduled at 17, device 24-31.
    (0.003, [0.010, 0.017, 0.024, 0.031]),
    # 8 ms CPU + 2 ms device: the CPU binds, and it does one step's CPU part at a time.
    # Step 0: scheduled at 0, CPU 0-8, device 8-10. Step 1: scheduled at 0, CPU once free:
    # 8-16, device 16-18. Step 2: scheduled at 10 (step 0's output in), CPU 16-24, device
    # 24-26. Step 3: scheduled at 18, CPU 24-32, device 32-34. Tokens at 10, 18, 26, 34 ms:
    # one per 8 ms of CPU once the CPU is the bottleneck.
    (0.008, [0.010, 0.018, 0.026, 0.034]),
    # no CPU part: the device back to back, as synchronously
    (0.0, [0.010, 0.020, 0.030, 0.040]),
])
def test_the_cpu_part_of_a_step_overlaps_the_device_work_of_the_one_before(overhead, times):
    # one request, prompt 8, 4 outputs: a prefill and three decodes
    s = v1()
    s.record_tokens = True
    replica = Replica(0, s, OverheadLatency(overhead), 512)
    rec = simulate([RequestSpec(0, 0.0, 8, 4)], [replica], round_robin())
    assert rec.requests[0].token_times == pytest.approx(times)
    sync = v1(overlap=False)
    sync.record_tokens = True
    rec = simulate([RequestSpec(0, 0.0, 8, 4)], [Replica(0, sync, OverheadLatency(overhead),
                                                         512)], round_robin())
    assert rec.requests[0].token_times == pytest.approx([0.010, 0.020, 0.030, 0.040])


class PerSequenceCpu:
    """10 ms a step, of which the CPU part is 1 ms + 4 ms a sampled sequence (``cpu_s``, as
    the roofline's with ``latency.per_output_token_ms``)."""

    label = "10 ms a step, CPU by sequence"
    step_overhead_s = 0.001

    def step_time(self, plan):
        return 0.010

    def cpu_s(self, plan):
        return 0.001 + 0.004 * plan.num_sampled


@pytest.mark.parametrize("n, times", [
    # one request: 5 ms of CPU a step, 5 of device. Step 0 CPU 0-5, device 5-10; step 1
    # (scheduled at 0) CPU 5-10, device 10-15; step 2 (at 10) CPU 10-15, device 15-20; step 3
    # (at 15) CPU 15-20, device 20-25
    (1, [0.010, 0.015, 0.020, 0.025]),
    # two requests in every step: 9 ms of CPU, 1 of device: the CPU binds, a step per 9 ms.
    # Step 0 CPU 0-9, device 9-10; step 1 CPU 9-18, device 18-19; step 2 (at 10) CPU 18-27,
    # device 27-28; step 3 (at 19) CPU 27-36, device 36-37
    (2, [0.010, 0.019, 0.028, 0.037]),
])
def test_the_cpu_part_grows_with_the_sequences_a_step_samples(n, times):
    s = v1()
    s.record_tokens = True
    rec = simulate([RequestSpec(i, 0.0, 8, 4) for i in range(n)],
                   [Replica(0, s, PerSequenceCpu(), 512)], round_robin())
    for req in rec.requests:
        assert req.token_times == pytest.approx(times)


def test_a_cpu_bound_engine_makes_one_step_per_cpu_part():
    # one request, prompt 8, 201 outputs: a prefill and 200 decodes, 10 ms a step of which
    # 9 ms is CPU. The CPU parts are serial: step k's CPU part runs (9k, 9k+9] ms, its device
    # part (9k+9, 9k+10] ms (the device, 1 ms a step, is always free by then), so the tokens
    # come 9 ms apart: the first at 10 ms, the last (step 200) at 9*200+10 = 1810 ms, and
    # TPOT = (1.810-0.010)/200 = 9 ms >= the 9 ms of CPU a step. (With the CPU parts
    # overlapping, two steps a 10 ms cycle, TPOT was about 5 ms.)
    s = v1()
    s.record_tokens = True
    rec = simulate([RequestSpec(0, 0.0, 8, 201)], [Replica(0, s, OverheadLatency(0.009), 512)],
                   round_robin())
    times = rec.requests[0].token_times
    assert len(times) == 201
    assert times[0] == pytest.approx(0.010) and times[-1] == pytest.approx(1.810)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) == pytest.approx(0.009) and max(gaps) == pytest.approx(0.009)
