"""Pipeline parallelism (engine.pipeline_parallel_size): micro-batches in flight, their bubbles,
the stage split of a step's price, KV per stage, and the knob's validation. Hand-stepped: the
arithmetic is in the comments."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.cards import load_hardware, load_model
from simserve.config import parse_scenario
from simserve.engine import Replica, simulate
from simserve.engine.pipeline import Stages
from simserve.errors import ConfigError
from simserve.kv.capacity import (kv_block_bytes, kv_capacity_blocks, pipeline_layers,
                                  stage_block_bytes, stage_weight_bytes)
from simserve.cluster.routing import make_router
from simserve.latency.pipeline import PipelineLatency
from simserve.latency.roofline import RooflineModel
from simserve.sched import Status
from simserve.sched.plan import StepPlan
from simserve.workload.spec import RequestSpec
from tests.helpers import make_request, make_scheduler, tokens


class PerToken:
    """``stage_s`` per stage, or ``per_token_s`` × the micro-batch's tokens per stage; sends
    cost ``send_s``."""

    label = "toy pipeline"

    def __init__(self, p: int, stage_s: float = 0.0, per_token_s: float = 0.0,
                 send_s: float = 0.0):
        self.p, self.stage_s, self.per_token_s, self.send_s = p, stage_s, per_token_s, send_s

    def stages(self, plan: StepPlan) -> tuple[list[float], list[float]]:
        t = self.stage_s + self.per_token_s * plan.num_batched_tokens
        return [t] * self.p, [self.send_s] * (self.p - 1)

    def step_time(self, plan: StepPlan) -> float:
        times, sends = self.stages(plan)
        return sum(times) + sum(sends)


def run(specs, latency, p=2, budget=10, policy="vllm_v1", max_num_seqs=8, **options):
    sched = make_scheduler(policy, budget=budget, max_num_seqs=max_num_seqs, num_blocks=100,
                           pipeline_parallel_size=p)
    sched.record_tokens = True
    r = Replica(0, sched, latency, 10_000, depth=p)
    rec = simulate(specs, [r], make_router("round_robin"), **options)
    return rec, {q.id: q.token_times for q in rec.requests}


def test_stages_push_by_hand():
    s = Stages(2)
    # micro-batch 1 at t=0: stage 0 [0, 1], send 0.5, stage 1 [1.5, 2.5]
    assert s.push(0.0, [1.0, 1.0], [0.5]) == (0.0, 2.5)
    # micro-batch 2 also at t=0: stage 0 free at 1 -> [1, 1.2] (it enters at 1); +0.5 -> 1.7,
    # but stage 1 is busy until 2.5 -> [2.5, 2.7]
    assert s.push(0.0, [0.2, 0.2], [0.5]) == (1.0, pytest.approx(2.7))
    assert s.free == [pytest.approx(1.2), pytest.approx(2.7)]


def test_two_micro_batches_in_flight_one_output_per_stage_time():
    # p = 2, every stage 1 s, budget 10 tokens; A and B (10-token prompts, 3 outputs) at t=0.
    # t=0: batch 1 = A's prefill (budget full); the queue has room: batch 2 = B's prefill.
    #   batch 1: stage 0 [0,1], stage 1 [1,2] -> out 2;  batch 2: [1,2], [2,3] -> out 3
    # t=2: A's token 1; A decodes: batch 3 at 2 -> [2,3], [3,4] -> out 4
    # t=3: B's token 1; batch 4 at 3 -> out 5;  t=4: A's token 2; batch 5 -> out 6;  ...
    # steady state: one micro-batch output per stage time (1 s), each token p·s = 2 s apart
    specs = [RequestSpec(0, 0.0, 10, 3), RequestSpec(1, 0.0, 10, 3)]
    rec, times = run(specs, PerToken(2, stage_s=1.0))
    assert times[0] == [2.0, 4.0, 6.0]
    assert times[1] == [3.0, 5.0, 7.0]
    # the step log's rows tile the time: each from the previous output to its own
    log = rec.replicas[0].columns()
    assert list(log["start_s"]) == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert list(log["duration_s"]) == [2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    # running requests when each is scheduled, those in flight included: B still waits when
    # batch 1 is formed; at t=5 A's last decode is in flight while B's is scheduled
    assert list(log["num_running"]) == [1, 2, 2, 2, 2, 2]
    # first scheduled: when the device starts the micro-batch, as the other loops stamp it:
    # A's batch 1 enters stage 0 at 0; B's batch 2, scheduled at 0, waits for it until 1
    assert {q.id: q.first_scheduled_s for q in rec.requests} == {0: 0.0, 1: 1.0}


def test_one_request_leaves_a_bubble():
    # only A: nothing else to form a second micro-batch, so each of A's steps goes through
    # both stages alone: tokens at 2, 4, 6 (one output every p·s = 2 s, stage 0 idle half
    # the time) -- the same per-token latency as two micro-batches, half the throughput
    rec, times = run([RequestSpec(0, 0.0, 10, 3)], PerToken(2, stage_s=1.0))
    assert times[0] == [2.0, 4.0, 6.0]
    assert len(rec.replicas[0].columns()["start_s"]) == 3


def test_bubbles_by_hand():
    # the test above: A alone, 3 micro-batches each [t, t+1] on stage 0 and [t+1, t+2] on
    # stage 1, t = 0, 2, 4: the pipeline has work 0..6 (6 s), each stage computes 3 s of it:
    # each stage idles 3 s of 6, a bubble fraction of 1/2
    rec, _ = run([RequestSpec(0, 0.0, 10, 3)], PerToken(2, stage_s=1.0))
    assert rec.stages[0].bubbles() == (6.0, [3.0, 3.0])
    from simserve.runner import pipeline_summary
    assert pipeline_summary(rec.stages) == {"in_flight_s": 6.0, "bubble_fraction": 0.5,
                                            "stage_bubble_fraction": [0.5, 0.5]}
    # two requests (test_two_micro_batches_...): outputs 2, 3, 4, 5, 6, 7, six micro-batches
    # of 1 s a stage: work 0..7; stage 0 busy [0, 6], stage 1 [1, 7]: 1 s idle each of 7
    rec, _ = run([RequestSpec(0, 0.0, 10, 3), RequestSpec(1, 0.0, 10, 3)],
                 PerToken(2, stage_s=1.0))
    assert rec.stages[0].bubbles() == (7.0, [1.0, 1.0])
    # spans apart: micro-batches [0, 2.5] and [5, 6] (a gap while nothing is in flight)
    st = Stages(2)
    st.push(0.0, [1.0, 1.0], [0.5])
    st.push(5.0, [0.5, 0.5], [0.0])
    assert st.bubbles() == (3.5, [2.0, 2.0])    # 2.5 + 1.0 s of work; stages busy 1.5 each


def test_unbalanced_micro_batches_wait_on_each_other():
    # stage time 0.1 s per token. A: 10-token prompt (1 s a stage), B: 2-token prompt
    # (0.2 s). Batch 1 = A [0,1] [1,2]; batch 2 = B: stage 0 [1, 1.2], then stage 1 is busy
    # until 2: [2, 2.2] -> B's first token at 2.2 (alone it would have been at 0.4)
    specs = [RequestSpec(0, 0.0, 10, 1), RequestSpec(1, 0.0, 2, 1)]
    _, times = run(specs, PerToken(2, per_token_s=0.1))
    assert times[0] == [pytest.approx(2.0)]
    assert times[1] == [pytest.approx(2.2)]


def test_sends_delay_the_receiver_only():
    # stage 1 s, send 0.5 s: batch 1 out at 0+1+0.5+1 = 2.5; batch 2 (scheduled at 0) leaves
    # stage 0 at 2 (it waited for it until 1), reaches stage 1 at 2.5 = when batch 1 leaves:
    # out 3.5. The sender's stage is not held by the send.
    specs = [RequestSpec(0, 0.0, 10, 1), RequestSpec(1, 0.0, 10, 1)]
    _, times = run(specs, PerToken(2, stage_s=1.0, send_s=0.5))
    assert times == {0: [2.5], 1: [3.5]}


def test_sarathi_and_orca_and_vllm_v0_pipeline_too():
    specs = [RequestSpec(0, 0.0, 10, 3), RequestSpec(1, 0.0, 10, 3)]
    for policy in ("sarathi", "vllm_v0", "orca"):
        _, times = run(specs, PerToken(2, stage_s=1.0), policy=policy)
        # the same schedule as vllm_v1's above: the budget puts each prompt in its own batch
        assert times == {0: [2.0, 4.0, 6.0], 1: [3.0, 5.0, 7.0]}, policy


def test_max_num_seqs_counts_requests_in_flight():
    # max_num_seqs 1: B cannot be admitted while A is in flight, though A is out of the
    # running list: it runs only after A finishes (A's tokens at 2, 4; B's at 6, 8)
    _, times = run([RequestSpec(0, 0.0, 10, 2), RequestSpec(1, 0.0, 10, 2)],
                   PerToken(2, stage_s=1.0), max_num_seqs=1)
    assert times == {0: [2.0, 4.0], 1: [6.0, 8.0]}


# -- vLLM v1's rule: a prompt's next chunk while its previous one is in flight ----------------

def test_a_lone_prompt_sends_its_next_chunk_while_the_previous_is_in_flight():
    # vllm_v1, p = 2, every stage 1 s, budget 10; A: 30-token prompt, 2 outputs (vLLM v1
    # advances num_computed_tokens when it schedules: a chunk that leaves some of the prompt
    # samples nothing, so the next chunk is asked for at once).
    # t=0: b1 = A[0:10]: stage 0 [0,1], stage 1 [1,2] -> out 2. Room: b2 = A[10:20] at 0,
    #      enters stage 0 at 1 -> [1,2], [2,3] -> out 3. Queue full: wait for b1.
    # t=2: b1 back (no token). b3 = A[20:30]: stage 0 [2,3], stage 1 [3,4] -> out 4.
    # t=3: b2 back. A's token is in flight (b3 samples it): A asks for 0 -> empty schedule,
    #      which holds a slot behind b3. Wait for b3.
    # t=4: A's first token. b4 = A's decode at 4 -> out 6: A's second token at 6.
    # (Parked until each chunk's output is back it would be chunks out at 2, 4, 6: tokens at
    # 6 and 8, as sarathi's test below.)
    rec, times = run([RequestSpec(0, 0.0, 30, 2)], PerToken(2, stage_s=1.0))
    assert times == {0: [4.0, 6.0]}
    log = rec.replicas[0].columns()
    assert list(log["num_batched_tokens"]) == [10, 10, 10, 1]
    assert list(log["start_s"] + log["duration_s"]) == [2.0, 3.0, 4.0, 6.0]


def test_sarathi_waits_for_a_chunk_in_flight():
    # the same request under sarathi (Sarathi-Serve's engine pauses a sequence only when its
    # step completes): chunks out at 2, 4, 6 (one pass of both stages each, the other stage
    # idle), A's tokens at 6 and 8
    _, times = run([RequestSpec(0, 0.0, 30, 2)], PerToken(2, stage_s=1.0), policy="sarathi")
    assert times == {0: [6.0, 8.0]}


def test_a_decode_waits_for_its_token_but_a_chunk_does_not_by_hand():
    # the scheduler alone, p = 2 (no engine): launch = the micro-batch leaves for the stages,
    # deliver = its output is back. Budget 8; A: 4-token prompt, 3 outputs; B: 12-token prompt.
    sched = make_scheduler("vllm_v1", budget=8, num_blocks=100, pipeline_parallel_size=2)
    a, b = make_request(0, 4, 3), make_request(1, 12, 2)
    sched.add(a)
    sched.add(b)
    # step 1: A's prompt (4) + B's first chunk (8 - 4 = 4)
    s1 = sched.schedule()
    assert tokens(s1) == {0: 4, 1: 4}
    f1 = sched.launch(s1)
    # step 2 with step 1 in flight: A's token is in flight (its prompt ends in step 1): skipped;
    # B's chunk leaves 8 of its prompt: its next chunk, the whole budget
    s2 = sched.schedule()
    assert tokens(s2) == {1: 8}
    f2 = sched.launch(s2)
    # step 1's output: A's first token (B's chunk sampled nothing)
    assert sched.deliver(f1, 1.0) == [] and sched.sampled == [a]
    # step 3 with step 2 in flight: A decodes; B's token (its prompt ends in step 2) in flight
    s3 = sched.schedule()
    assert tokens(s3) == {0: 1}
    f3 = sched.launch(s3)
    # nothing more until an output is back: A's and B's sampled tokens are both in flight
    assert sched.schedule().is_empty
    sched.deliver(f2, 2.0)
    assert sched.sampled == [b]
    s4 = sched.schedule()
    assert tokens(s4) == {1: 1}                     # B decodes; A's token still in flight
    sched.launch(s4)
    sched.deliver(f3, 3.0)
    # A has 2 tokens, none in flight; B's second is in flight (step 4)
    assert (a.num_generated, a.num_pending, b.num_generated, b.num_pending) == (2, 0, 2, 1)


def test_a_request_in_flight_may_be_preempted_by_hand():
    # vLLM v1 keeps requests in flight in its running list, so one can be the victim
    # (running[-1]). Block size 4, 2 blocks, budget 4; A and B: 4-token prompts, 2 outputs.
    sched = make_scheduler("vllm_v1", budget=4, block_size=4, num_blocks=2,
                           pipeline_parallel_size=2)
    a, b = make_request(0, 4, 2), make_request(1, 4, 2)
    sched.add(a)
    sched.add(b)
    f1 = sched.launch(sched.schedule())     # A's prompt: 1 block (the budget is full)
    s2 = sched.schedule()                   # A held (its token in flight): B's prompt, 1 block
    assert tokens(s2) == {1: 4} and sched.blocks.num_free == 0
    f2 = sched.launch(s2)
    sched.deliver(f1, 1.0)                  # A's first token: A has 5 tokens, 4 computed
    # A's decode needs a 2nd block (token 5), none is free: the victim is running[-1] = B,
    # whose prompt is in flight (step 2): its block freed, its output to come stale
    s3 = sched.schedule()
    assert tokens(s3) == {0: 1} and s3.num_preempted == 1
    assert list(sched.waiting) == [b] and b.num_computed_tokens == 0
    f3 = sched.launch(s3)
    # B's stale output is still delivered (its first token), and until it is, B is not
    # admitted again (vLLM's num_stale_output_tokens): with step 3 in flight nothing runs
    assert sched.schedule().is_empty
    sched.deliver(f2, 2.0)
    assert b.num_generated == 1 and b.num_in_flight == 0
    assert sched.schedule().is_empty          # (A's token in flight; no block free for B)
    assert sched.deliver(f3, 3.0) == [a]      # A's second token: done, its 2 blocks freed
    # B is recomputed: its prompt and its first token, 5 tokens in 2 blocks (budget 4: a chunk)
    assert tokens(sched.schedule()) == {1: 4}


def test_an_empty_schedule_holds_a_slot_in_a_deeper_pipeline():
    # p = 3, every stage 1 s, budget 10. A, B: 10-token prompts, 2 outputs, at 0; X: 10-token
    # prompt, 1 output, at 2. vLLM's engine core queues an empty schedule behind the
    # micro-batches in flight, and it holds a slot until they are out.
    # t=0: b1 = A[10]: stages [0,1] [1,2] [2,3] -> out 3. b2 = B[10]: [1,2] [2,3] [3,4] -> out 4.
    #      A and B held (tokens in flight): empty schedule, queued -> full: wait for b1.
    # t=3: A's token 1. b3 = A's decode + X's first chunk (9): [3,4] [4,5] [5,6] -> out 6.
    #      The queue (b2, empty, b3) is full: wait for b2.
    # t=4: B's token 1. b4 = B's decode + X's last token: [4,5] [5,6] [6,7] -> out 7.
    #      (the empty slot leaves; A, B, X held: empty again; wait for b3)
    # t=6: A's token 2 (A done). t=7: B's token 2, X's token.
    # Without the empty slot X's last token would go alone at 3 and B's decode at 4 (stage 0
    # then busy until 5): B's token 2 at 8.
    specs = [RequestSpec(0, 0.0, 10, 2), RequestSpec(1, 0.0, 10, 2), RequestSpec(2, 2.0, 10, 1)]
    rec, times = run(specs, PerToken(3, stage_s=1.0), p=3)
    assert times == {0: [3.0, 6.0], 1: [4.0, 7.0], 2: [7.0]}
    assert list(rec.replicas[0].columns()["num_batched_tokens"]) == [10, 10, 10, 2]


# -- async scheduling with PP (vLLM 0.32's V2 model runner) -----------------------------------

class WithCpu(PerToken):
    """:class:`PerToken` whose stage 0 includes ``step_overhead_s`` of CPU work."""

    def __init__(self, p: int, stage_s: float, overhead_s: float):
        super().__init__(p, stage_s=stage_s)
        self.step_overhead_s = overhead_s


def run_async(specs, latency, p=2, budget=10, policy="vllm_v1"):
    sched = make_scheduler(policy, budget=budget, max_num_seqs=8, num_blocks=100,
                           pipeline_parallel_size=p, async_scheduling=True)
    sched.record_tokens = True
    r = Replica(0, sched, latency, 10_000, depth=p)
    rec = simulate(specs, [r], make_router("round_robin"))
    return rec, {q.id: q.token_times for q in rec.requests}


@pytest.mark.parametrize("policy", ["vllm_v1", "priority"])
def test_async_pp_a_decode_every_p_schedules_ahead_of_its_token_by_hand(policy):
    # the scheduler alone, p = 2 with async scheduling: a queue of 3, each output applied once
    # 3 schedules are queued (vLLM's step_with_batch_queue). A: 20-token prompt, 3 outputs.
    # vLLM's AsyncScheduler sets next_decode_eligible_step = call + p when a request samples.
    sched = make_scheduler(policy, budget=100, pipeline_parallel_size=2, async_scheduling=True)
    a = make_request(0, 20, 3)
    sched.add(a)
    f1 = sched.launch(sched.schedule())     # call 1: the prompt; A samples: again from call 3
    assert (sched.current_step, a.next_decode_step, a.num_pending) == (1, 3, 1)
    assert sched.schedule().is_empty        # call 2: 2 < 3 (its token in flight or not)
    s3 = sched.schedule()                   # call 3: a decode, its first token in flight
    assert tokens(s3) == {0: 1}
    f3 = sched.launch(s3)
    assert (a.num_pending, a.next_decode_step) == (2, 5)     # two placeholders
    sched.deliver(f1, 1.0)                  # queue (1, empty 2, 3) full: call 1's output
    assert sched.sampled == [a] and a.num_pending == 1
    assert sched.schedule().is_empty        # call 4: 4 < 5 (queue: empty 2, 3, empty 4 ->
    s5 = sched.schedule()                   # the empty slot leaves) call 5: A's last decode
    assert tokens(s5) == {0: 1}
    f5 = sched.launch(s5)
    sched.deliver(f3, 2.0)                  # (3, empty 4, 5): call 3's output
    # calls 6, 7: A's last token is in flight (AsyncScheduler: nothing past max_tokens)
    assert sched.schedule().is_empty and sched.schedule().is_empty
    assert sched.deliver(f5, 3.0) == [a] and a.num_generated == 3


def test_async_pp_hides_the_cpu_part_but_not_the_pipeline_by_hand():
    # p = 2, each stage 1 s, of which 0.25 s of stage 0 is the CPU part; A alone: 10-token
    # prompt, 3 outputs (budget 10).
    # Synchronous: each step through both stages after the previous output: tokens 2, 4, 6.
    _, sync = run([RequestSpec(0, 0.0, 10, 3)], WithCpu(2, 1.0, 0.25))
    assert sync == {0: [2.0, 4.0, 6.0]}
    # Async (queue of 3): call 1 at 0: CPU [0, .25], stage 0 [.25, 1], stage 1 [1, 2] -> 2.
    # Call 2: empty (A again from call 3), queued. Call 3 at 0: A's decode, CPU [.25, .5],
    # but its input token is out at 2: stage 0 [2, 2.75], stage 1 [2.75, 3.75] -> 3.75.
    # Queue full: token 1 at 2. Call 4 at 2: empty (A from 5), queued; the empty 2 leaves.
    # Call 5 at 2: A's last decode, CPU [2, 2.25], its token out at 3.75: stage 0
    # [3.75, 4.5], stage 1 [4.5, 5.5]. Tokens 2, 3.75, 5.5: p stage times less the CPU part.
    rec, over = run_async([RequestSpec(0, 0.0, 10, 3)], WithCpu(2, 1.0, 0.25))
    assert over == {0: [2.0, 3.75, 5.5]}
    log = rec.replicas[0].columns()
    assert list(log["start_s"] + log["duration_s"]) == [2.0, 3.75, 5.5]
    # without a CPU part there is nothing to hide: a token every p stage times, as synchronous
    _, bare = run_async([RequestSpec(0, 0.0, 10, 3)], WithCpu(2, 1.0, 0.0))
    assert bare == {0: [2.0, 4.0, 6.0]}


def test_async_pp_schedules_ahead_and_sees_an_arrival_later_by_hand():
    # test_an_empty_schedule_holds_a_slot_in_a_deeper_pipeline's case with async scheduling:
    # p = 3 (queue of 4), stages 1 s, budget 10; A, B: 10-token prompts, 2 outputs, at 0;
    # X: 10-token prompt, 1 output, at 2.
    # t=0: c1 = A[10]: [0,1] [1,2] [2,3] -> 3 (A again from call 4).
    #      c2 = B[10]: [1,2] [2,3] [3,4] -> 4 (B from call 5). c3: both throttled: empty.
    #      c4 = A's last decode, its token out at 3: [3,4] [4,5] [5,6] -> 6. Queue full.
    # t=3: A's token 1. c5 = B's decode (token out at 4) + X's first 9: [4,5] [5,6] [6,7] -> 7.
    # t=4: B's token 1. c6 = X's last prompt token (a chunk that samples nothing goes on at
    #      once): [5,6] [6,7] [7,8] -> 8. (The empty c3 leaves; c7: nothing.)
    # t=6: A's token 2; t=7: B's token 2; t=8: X's token. Synchronous, X's token is at 7:
    # there A's decode was formed at t=3, with X's first chunk.
    specs = [RequestSpec(0, 0.0, 10, 2), RequestSpec(1, 0.0, 10, 2), RequestSpec(2, 2.0, 10, 1)]
    rec, times = run_async(specs, PerToken(3, stage_s=1.0), p=3)
    assert times == {0: [3.0, 6.0], 1: [4.0, 7.0], 2: [8.0]}
    log = rec.replicas[0].columns()
    assert list(log["num_batched_tokens"]) == [10, 10, 1, 10, 1]
    assert list(log["start_s"] + log["duration_s"]) == [3.0, 4.0, 6.0, 7.0, 8.0]
    assert {q.id: q.first_scheduled_s for q in rec.requests} == {0: 0.0, 1: 1.0, 2: 4.0}


def test_async_pp_is_deterministic_and_refused_for_policies_without_an_async_scheduler():
    import simserve
    s = scenario(engine={"async_scheduling": True})
    assert s.replica.limits.pipeline_queue_depth == 3
    a, b = simserve.run(s), simserve.run(s)
    assert a.summary == b.summary and a.summary["completed"] == 20
    with pytest.raises(ConfigError, match="AsyncScheduler"):
        scenario(engine={"async_scheduling": True}, scheduler={"policy": "sarathi"})


# -- pricing ---------------------------------------------------------------------------------

LLAMA70 = load_model("Llama-3.1-70B")
H100 = load_hardware("H100-SXM")


def decode_plan(b: int, ctx: int = 100) -> StepPlan:
    ids = tuple(range(b))
    return StepPlan(request_ids=ids, num_new_tokens=(1,) * b, prefill_lens=(), prefill_ctx=(),
                    decode_ctx=(ctx,) * b, num_sampled=b)


def test_roofline_split_over_stages_by_hand():
    base = RooflineModel(LLAMA70, H100, tensor_parallel_size=4)
    pp = PipelineLatency(base, LLAMA70, H100, pipeline_parallel_size=2, tensor_parallel_size=4)
    plan = decode_plan(100)
    parts = base.breakdown(plan)
    times, sends = pp.stages(plan)
    layered = sum(v for k, v in parts.items() if k not in ("overhead", "lm_head"))
    # 80 layers, 40 a stage: half the per-layer parts each; the overhead on stage 0, the LM
    # head on stage 1
    assert times[0] == pytest.approx(layered / 2 + parts["overhead"])
    assert times[1] == pytest.approx(layered / 2 + parts["lm_head"])
    # the send: stages on GPUs 0-3 and 4-7 of one 8-GPU node (NVLink 450 GB/s a direction).
    # 100 tokens · (hidden states + residual) 2 · 8192 · 2 B = 3,276,800 B; each rank sends a
    # quarter (819,200 B / 450e9 = 1.820 µs), the receivers all-gather 3/4 of it (2,457,600 B /
    # 450e9 = 5.461 µs), plus 10 µs latency: 17.28 µs
    assert sends == [pytest.approx(819_200 / 450e9 + 2_457_600 / 450e9 + 10e-6)]
    assert pp.step_time(plan) == pytest.approx(sum(times) + sends[0])
    assert "PP 2" in pp.label


def test_send_across_nodes_uses_the_scaleout_rate():
    # TP 8, PP 2 on 8-GPU nodes: stage 1 starts node 2 -> 50 GB/s; 10 tokens: 10 · 32,768 B
    # / 8 = 40,960 B per rank at 50e9 + all-gather 7/8 · 327,680 B at 450e9 + 10 µs
    base = RooflineModel(LLAMA70, H100, tensor_parallel_size=8)
    pp = PipelineLatency(base, LLAMA70, H100, pipeline_parallel_size=2, tensor_parallel_size=8)
    _, sends = pp.stages(decode_plan(10))
    assert sends == [pytest.approx(40_960 / 50e9 + 7 / 8 * 327_680 / 450e9 + 10e-6)]


def test_send_across_nodes_pays_the_scaleout_hop_latency():
    # as above, with a scale-out hop of 42 µs: the cross-node send pays it instead of the
    # NVLink-class 10 µs; a send within a node (TP 4, PP 2 on one 8-GPU node) keeps 10 µs
    import dataclasses
    hw = dataclasses.replace(H100, scaleout_latency=42e-6)
    base = RooflineModel(LLAMA70, hw, tensor_parallel_size=8)
    pp = PipelineLatency(base, LLAMA70, hw, pipeline_parallel_size=2, tensor_parallel_size=8)
    _, sends = pp.stages(decode_plan(10))
    assert sends == [pytest.approx(40_960 / 50e9 + 7 / 8 * 327_680 / 450e9 + 42e-6)]
    base4 = RooflineModel(LLAMA70, hw, tensor_parallel_size=4)
    pp4 = PipelineLatency(base4, LLAMA70, hw, pipeline_parallel_size=2, tensor_parallel_size=4)
    _, sends4 = pp4.stages(decode_plan(10))
    # 10 · 32,768 B / 4 = 81,920 B at 450e9, all-gather 3/4 · 327,680 B at 450e9, + 10 µs
    assert sends4 == [pytest.approx(81_920 / 450e9 + 245_760 / 450e9 + 10e-6)]


def test_pipeline_layers_follow_vllm():
    # vLLM get_pp_indices: even split, the remainder one each to the stages before the last
    assert pipeline_layers(80, 2) == [40, 40]
    assert pipeline_layers(80, 3) == [27, 27, 26]
    assert pipeline_layers(5, 4) == [1, 1, 2, 1]
    assert pipeline_layers(7, 4) == [2, 2, 2, 1]     # 7 // 4 = 1; 3 left: stages -2, -3, -4


def test_stage_weights_and_kv_blocks_by_hand():
    m = LLAMA70                         # untied: the LM head is its own matrix
    tp, pp = 4, 2
    w = stage_weight_bytes(m, tp, 1, pp)
    assert sum(w) == pytest.approx(m.weight_bytes_per_rank(tp))
    emb = m.embedding_params * m.dtype_bytes / tp          # 128,256 · 8192 · 2 B / 4
    assert w[0] - w[1] == pytest.approx(emb - emb - m.norm_params * m.dtype_bytes / tp)
    # KV of a block per rank: 16 tokens · 2 · 40 layers · (8 KV heads / 4) · 128 · 2 B
    assert stage_block_bytes(m, 16, tp, pp) == [16 * 2 * 40 * 2 * 128 * 2] * 2
    assert 2 * stage_block_bytes(m, 16, tp, pp)[0] == kv_block_bytes(m, 16, tp)
    kw = dict(block_size=16, gpu_memory_utilization=0.9, tensor_parallel_size=tp,
              max_num_batched_tokens=8192)
    one = kv_capacity_blocks(m, H100, **kw)
    two = kv_capacity_blocks(m, H100, pipeline_parallel_size=2, **kw)
    # free memory per GPU grows (half the weights) and a block holds half the layers: more
    # than twice the blocks
    assert two > 2 * one


def test_tied_embeddings_put_a_head_copy_on_the_last_stage():
    m = load_model("Falcon-180B")      # tie_word_embeddings: true
    w = stage_weight_bytes(m, 4, 1, 2)
    head = m.embedding_params * m.dtype_bytes / 4
    assert sum(w) == pytest.approx(m.weight_bytes_per_rank(4) + head)


# -- the knob --------------------------------------------------------------------------------

BASE = {"model": "Llama-3.1-70B", "hardware": "H100-SXM",
        "engine": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
        "scheduler": {"policy": "vllm_v1"},
        "workload": {"arrival": "poisson", "rate": 2.0, "num_requests": 20,
                     "prompt": {"dist": "fixed", "value": 200},
                     "output": {"dist": "fixed", "value": 20}}}


def scenario(**sections):
    raw = copy.deepcopy(BASE)
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_scenario(raw)


@pytest.mark.parametrize("change, message", [
    ({"scheduler": {"policy": "static"}}, "does not model pipeline parallelism"),
    ({"engine": {"pipeline_parallel_size": 81}}, "at most one stage per layer"),
    ({"latency": {"model": "constant", "step_ms": 10}}, "no per-layer costs"),
    ({"engine": {"pipeline_parallel_size": 0}}, ">= 1"),
    ({"engine": {"pipeline_parallel_size": "two"}}, ""),
    ({"cluster": {"replicas": 2, "faults": {"mtbf_s": 100, "restart_s": 1}}}, "failures"),
])
def test_bad_pipeline_settings_name_the_field(change, message):
    with pytest.raises(ConfigError) as e:
        scenario(**change)
    assert "engine.pipeline_parallel_size" in str(e.value)
    assert message in str(e.value)


def test_default_is_not_written_and_a_set_value_round_trips():
    one = scenario(engine={"pipeline_parallel_size": 1})
    assert "pipeline_parallel_size" not in one.to_dict()["engine"]
    two = scenario()
    assert two.to_dict()["engine"]["pipeline_parallel_size"] == 2
    assert parse_scenario(two.to_dict()).engine.pipeline_parallel_size == 2
    # KV per replica: the stage arithmetic, not TP 4's
    assert two.replica.num_gpu_blocks > 2 * one.replica.num_gpu_blocks
    assert two.replica.kv_block_bytes * 2 == one.replica.kv_block_bytes


def test_a_pipelined_run_is_deterministic_and_steps():
    import simserve
    s = scenario()
    a, b = simserve.run(s), simserve.run(s)
    assert a.summary == b.summary
    assert a.summary["completed"] == 20
    assert "PP 2" in a.summary["latency_model"]


def test_priority_pipelines_as_vllm_v1_does():
    # vLLM's priority policy is its v1 scheduler with another order: micro-batches in flight
    # held the same way (PolicyFacts.pipeline_launch); a run is deterministic and completes
    import simserve
    s = scenario(scheduler={"policy": "priority"})
    assert s.replica.limits.pipeline_parallel_size == 2
    a, b = simserve.run(s), simserve.run(s)
    assert a.summary == b.summary and a.summary["completed"] == 20


# -- invariants on random workloads ------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 3),
       policy=st.sampled_from(["vllm_v1", "priority", "sarathi", "vllm_v0", "orca",
                               "vllm_v1 async", "priority async"]),
       reqs=st.lists(st.tuples(st.floats(0, 5), st.integers(1, 30), st.integers(1, 6)),
                     min_size=1, max_size=12))
def test_pipelined_runs_keep_their_invariants(p, policy, reqs):
    # every stage 1 s, no sends. Each of a request's tokens needs its own pass through all p
    # stages after the previous one came back (with async scheduling too: a decode formed
    # ahead of its token enters stage 0 once that token is out): consecutive tokens are >= p s
    # apart. The last stage finishes one micro-batch at a time: outputs are >= 1 s apart.
    # Every request finishes with exactly its tokens; the step rows tile the time without
    # overlap.
    policy, _, mode = policy.partition(" ")
    specs = [RequestSpec(i, a, n, o) for i, (a, n, o) in
             enumerate(sorted(reqs, key=lambda r: r[0]))]
    sched = make_scheduler(policy, budget=32, max_num_seqs=4, num_blocks=200,
                           pipeline_parallel_size=p, async_scheduling=mode == "async")
    sched.record_tokens = True
    r = Replica(0, sched, PerToken(p, stage_s=1.0), 10_000, depth=p)
    rec = simulate(specs, [r], make_router("round_robin"))
    assert sorted(q.id for q in rec.requests) == list(range(len(specs)))
    for q in rec.requests:
        times = q.token_times
        assert q.status is Status.FINISHED and len(times) == q.num_output_tokens
        assert all(b - a >= p - 1e-9 for a, b in zip(times, times[1:]))
        assert times[0] >= q.spec.arrival_s + p - 1e-9
    log = rec.replicas[0].columns()
    ends = log["start_s"] + log["duration_s"]
    assert all(b - a >= 1 - 1e-9 for a, b in zip(ends, ends[1:]))
    assert all(s >= e - 1e-9 for s, e in zip(log["start_s"][1:], ends[:-1]))
    assert sched.num_parked == 0 and sched.blocks.num_used == 0


def test_profile_split_over_stages_by_hand():
    # a measured profile: its per-layer parts (linear, attention) times the stage's share of
    # the 32 layers, the embedding and overhead on stage 0, the LM head on stage 1
    from simserve.latency.profile import PROFILES_DIR, ProfileLatency
    m = load_model("Llama-3.1-8B")
    base = ProfileLatency.from_file(PROFILES_DIR / "Llama-3.1-8B_H100-SXM_bf16.json", m,
                                    step_overhead_s=1e-3)
    pp = PipelineLatency(base, m, H100, pipeline_parallel_size=2)
    plan = decode_plan(8, ctx=500)
    parts = base.breakdown(plan)
    times, sends = pp.stages(plan)
    layered = parts["linear"] + parts["attn_prefill"] + parts["attn_decode"] + parts["swap"]
    assert times[0] == pytest.approx(layered / 2 + parts["overhead"] + parts["embedding"]
                                     + parts["admission"] + parts["output_tokens"])
    assert times[1] == pytest.approx(layered / 2 + parts["lm_head"])
    # TP 1: 8 tokens · 2 · 4096 · 2 B over NVLink (450 GB/s), no all-gather, + 10 µs
    assert sends == [pytest.approx(8 * 2 * 4096 * 2 / 450e9 + 10e-6)]


def test_a_client_concurrency_gate_with_a_pipeline():
    # max_concurrency 1 (config.py's _check_pipeline lets it through): B, due at 0, is sent
    # only when A ends. A alone: each step through both 1 s stages, tokens at 2, 4 (finish
    # 4); B sent at 4: tokens at 6, 8
    rec, times = run([RequestSpec(0, 0.0, 10, 2), RequestSpec(1, 0.0, 10, 2)],
                     PerToken(2, stage_s=1.0), max_concurrency=1)
    assert times == {0: [2.0, 4.0], 1: [6.0, 8.0]}
    assert {q.id: q.spec.arrival_s for q in rec.requests} == {0: 0.0, 1: 4.0}


def test_pipeline_capacity_refuses_a_drafters_bytes():
    # kv_capacity_blocks' block_bytes / extra_weight_bytes (a speculative drafter's KV and
    # weights) have no stage to go to: refused rather than ignored (config refuses
    # speculative decoding with PP, so no scenario gets here)
    kw = dict(block_size=16, gpu_memory_utilization=0.9, tensor_parallel_size=4,
              max_num_batched_tokens=8192, pipeline_parallel_size=2)
    plain = kv_capacity_blocks(LLAMA70, H100, **kw)
    assert plain > 0
    for extra in ({"block_bytes": 2 * kv_block_bytes(LLAMA70, 16, 4)},
                  {"extra_weight_bytes": 1e9}):
        with pytest.raises(ValueError, match="pipeline_parallel_size"):
            kv_capacity_blocks(LLAMA70, H100, **kw, **extra)


def test_replicas_that_straddle_nodes_are_refused():
    # H100-SXM: 8 devices a node, replicas packed one after another. TP 2 × PP 3 = 6
    # devices: replica 0 on 0-5, replica 1 on 6-11: its stage 1 (devices 8-9) starts a new
    # node, which latency/pipeline.py (stage j+1 at (j+1)·TP from the replica's start: 2, not
    # a multiple of 8) would price as an in-node send: refused
    with pytest.raises(ConfigError, match="replica 1's 2 × 3 devices would start at device 6") \
            as e:
        scenario(engine={"tensor_parallel_size": 2, "pipeline_parallel_size": 3},
                 cluster={"replicas": 2})
    assert e.value.field == "engine.pipeline_parallel_size"
    # one replica starts at device 0: priced right
    assert scenario(engine={"tensor_parallel_size": 2, "pipeline_parallel_size": 3}
                    ).engine.pipeline_parallel_size == 3
    # TP 2 × PP 2 = 4: replicas at 0, 4, 8, 12, each within a node (4 + 4 = 8 <= 8)
    assert scenario(engine={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                    cluster={"replicas": 4}).cluster.replicas == 4
    # TP 4 × PP 4 = 16: every replica starts a node (16, 32: multiples of 8)
    assert scenario(engine={"tensor_parallel_size": 4, "pipeline_parallel_size": 4},
                    cluster={"replicas": 3}).cluster.replicas == 3


@pytest.mark.parametrize("latency", [{"model": "roofline"},
                                     {"model": "profile", "path": "Llama-3.1-8B_H100-SXM_bf16"}])
def test_a_swapped_block_is_split_over_stages_as_the_layers_are(latency):
    # a swapped block moves every layer's K and V; each stage moves its layers' share, so the
    # stages together move the whole model's block (ReplicaSpec.model_block_bytes), for the
    # roofline and a profile alike (a profile once priced each stage's share of the largest
    # stage's block: half of it with 2 stages)
    from simserve.engine.build import build_latency
    s = scenario(model="Llama-3.1-8B", hardware="H100-SXM", latency=latency,
                 engine={"tensor_parallel_size": 1, "pipeline_parallel_size": 2,
                         "preemption_mode": "swap"})
    lat = build_latency(s)
    plan = decode_plan(8)
    moved = sum(lat.stages(plan._replace(swap_out_blocks=10))[0]) - sum(lat.stages(plan)[0])
    # 32 layers · 2 (K, V) · 8 KV heads · 128 · 2 B · 16 tokens = 2 MiB a block, on PCIe
    assert s.replica.model_block_bytes == 32 * 2 * 8 * 128 * 2 * 16
    assert s.replica.kv_block_bytes == s.replica.model_block_bytes // 2   # the largest stage
    assert moved == pytest.approx(10 * s.replica.model_block_bytes
                                  / s.hardware.host_link_bandwidth, rel=1e-9)
