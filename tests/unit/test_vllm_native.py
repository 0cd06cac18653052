"""The ``vllm_native`` driver, tested with a stand-in for vLLM's scheduler (vLLM itself is an
optional extra; benchmarks/vllm_oracle.py runs the real one: ``make oracle``)."""

from __future__ import annotations

import pytest

import simserve.sched.vllm_native as native
from simserve.config import parse_scenario
from simserve.engine import Replica, round_robin, simulate
from simserve.errors import ConfigError
from simserve.kv.blocks import BlockManager
from simserve.sched import SchedulerLimits, Status
from simserve.sched.request import Request
from simserve.sched.vllm_native import VllmNative, output_token, prompt_token_ids, vllm_id
from simserve.workload.spec import RequestSpec


class StandIn:
    """A tiny scheduler speaking the Backend protocol: at most ``max_running`` requests, each
    gets all its remaining tokens every step; at step ``preempt_at`` the newest running request
    is preempted (back to the waiting head, nothing computed) and nobody is admitted."""

    version = "stand-in"

    def __init__(self, max_running: int = 2, preempt_at: int | None = None,
                 finish_late: bool = False):
        self.max_running, self.preempt_at, self.finish_late = max_running, preempt_at, finish_late
        self.reqs: dict[str, dict] = {}
        self.run: list[str] = []
        self.wait: list[str] = []
        self.steps = 0
        self.fed: dict[str, list[int]] = {}

    def add(self, rid, prompt, max_tokens, arrival_s, priority):
        self.reqs[rid] = {"prompt": prompt, "max": max_tokens, "computed": 0, "out": []}
        self.wait.append(rid)

    def _total(self, rid):
        r = self.reqs[rid]
        return len(r["prompt"]) + len(r["out"])

    def schedule(self):
        self.steps += 1
        preempted = []
        if self.steps == self.preempt_at and self.run:
            victim = self.run.pop()
            self.reqs[victim]["computed"] = 0
            self.wait.insert(0, victim)
            preempted.append(victim)
        out = {rid: self._total(rid) - self.reqs[rid]["computed"] for rid in self.run}
        while not preempted and self.wait and len(self.run) < self.max_running:
            rid = self.wait.pop(0)
            self.run.append(rid)
            out[rid] = self._total(rid)
        for rid, n in out.items():
            self.reqs[rid]["computed"] += n
        return out, preempted

    def num_computed(self, rid):
        return self.reqs[rid]["computed"]

    def update(self, sampled):
        done = set()
        for rid, toks in sampled.items():
            self.fed.setdefault(rid, []).extend(toks)
            r = self.reqs[rid]
            r["out"] += toks
            if len(r["out"]) >= r["max"] + (1 if self.finish_late else 0):
                done.add(rid)
                self.run.remove(rid)
        return done

    def running(self):
        return list(self.run)

    def waiting(self):
        return list(self.wait)

    def num_free_blocks(self):
        return 100 - sum(-(-self.reqs[r]["computed"] // 4) for r in self.run)


class StepLatency:
    label = "10 ms a step"

    def step_time(self, plan):
        return 0.010


def run_native(specs, backend):
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=512,
                             enable_chunked_prefill=True, max_model_len=512)
    sched = VllmNative(limits, BlockManager(100, 4), backend=backend)
    sched.record_tokens = True
    replica = Replica(0, sched, StepLatency(), 512)
    rec = simulate(specs, [replica], round_robin(), fast_forward=False)
    return sched, {r.id: r for r in rec.requests}


def test_the_driver_turns_the_backends_steps_into_plans_and_feeds_tokens_back():
    # A (prompt 5, 3 tokens) and B (prompt 3, 2 tokens) at t=0, C (prompt 2, 1) at 5 ms.
    # step 1 (0-10 ms): A 5, B 3 (two running at most) -> first tokens at 10 ms
    # step 2 (10-20): A, B decode -> A's 2nd, B's 2nd (B done) at 20 ms
    # step 3 (20-30): A decodes (3rd: done), C admitted with 2 -> its only token: done at 30
    specs = [RequestSpec(0, 0.0, 5, 3), RequestSpec(1, 0.0, 3, 2), RequestSpec(2, 0.005, 2, 1)]
    backend = StandIn()
    sched, reqs = run_native(specs, backend)
    a, b, c = reqs[0], reqs[1], reqs[2]
    assert all(r.status is Status.FINISHED for r in (a, b, c))
    assert a.token_times == pytest.approx([0.010, 0.020, 0.030])
    assert b.token_times == pytest.approx([0.010, 0.020])
    assert c.token_times == pytest.approx([0.030]) and c.first_scheduled_s == pytest.approx(0.02)
    # the tokens fed back are the requests' own, one per position
    assert backend.fed[vllm_id(0)] == [output_token(_at(a, i)) for i in range(3)]
    assert len(backend.fed[vllm_id(2)]) == 1
    assert not sched.running and not sched.waiting


def _at(req: Request, generated: int) -> Request:
    """A copy of ``req`` as it was with ``generated`` tokens (output_token reads that)."""
    copy = Request(req.spec)
    copy.num_generated = generated
    return copy


def test_a_preemption_by_the_backend_resets_the_request_and_counts():
    # step 1: A 5, B 3; step 2: B (newest) preempted, A decodes; step 3: B recomputes
    # 3 + 1 generated = 4 tokens and samples its 2nd; A decodes its 3rd
    specs = [RequestSpec(0, 0.0, 5, 3), RequestSpec(1, 0.0, 3, 2)]
    sched, reqs = run_native(specs, StandIn(preempt_at=2))
    a, b = reqs[0], reqs[1]
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert a.token_times == pytest.approx([0.010, 0.020, 0.030])
    assert b.token_times == pytest.approx([0.010, 0.030])
    assert b.status is Status.FINISHED and b.num_computed_tokens == 3 + 2 - 1


def test_a_disagreement_on_who_finished_is_an_error_not_a_silent_drift():
    with pytest.raises(RuntimeError, match="vllm_native: vLLM finished"):
        run_native([RequestSpec(0, 0.0, 5, 2)], StandIn(finish_late=True))


def test_shared_trace_blocks_become_shared_token_ids():
    # ids (7, 8) and (7, 9): the first 512 tokens are equal, the next differ; a third
    # request without ids shares nothing; requests are their own past their ids
    a = Request(RequestSpec(0, 0.0, 700, 1, (7, 8)))
    b = Request(RequestSpec(1, 0.0, 600, 1, (7, 9)))
    c = Request(RequestSpec(2, 0.0, 600, 1))
    d = Request(RequestSpec(3, 0.0, 1100, 1, (7, 8)))
    ta, tb, tc, td = map(prompt_token_ids, (a, b, c, d))
    assert len(ta) == 700 and ta[:512] == tb[:512] and ta[512:600] != tb[512:600]
    assert sum(x == y for x, y in zip(ta, tc)) < 10
    assert td[:700] == ta and td[1024:] != prompt_token_ids(Request(RequestSpec(4, 0.0, 1100, 1,
                                                                                (7, 8))))[1024:]
    assert all(native.FIRST_ID <= t < native.VOCAB for t in ta + tc)


def test_request_ids_sort_as_numbers_where_vllm_compares_strings():
    assert sorted([vllm_id(i) for i in (10, 9, 100)]) == [vllm_id(9), vllm_id(10), vllm_id(100)]


def test_without_vllm_the_policy_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(native, "vllm_version", lambda: None)
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512},
           "scheduler": {"policy": "vllm_native"},
           "workload": {"arrival": "burst", "num_requests": 2,
                        "prompt": {"dist": "fixed", "value": 10},
                        "output": {"dist": "fixed", "value": 3}}}
    with pytest.raises(ConfigError, match=r"scheduler\.policy: vllm_native needs vLLM.*"
                                          r"pip install 'simserve\[vllm\]'"):
        parse_scenario(raw)
    monkeypatch.setattr(native, "vllm_version", lambda: "0.32.0")
    with pytest.raises(ConfigError, match=r"engine\.preemption_mode: vllm_native"):
        parse_scenario({**raw, "engine": {**raw["engine"], "preemption_mode": "swap"}})
    with pytest.raises(ConfigError, match=r"scheduler\.scheduling_policy: unknown value"):
        parse_scenario({**raw, "scheduler": {"policy": "vllm_native",
                                             "scheduling_policy": "lifo"}})


def test_prompt_ids_are_the_documented_function_of_ids_and_positions():
    # the vectorised prompt ids equal the scalar definition, token by token
    req = Request(RequestSpec(5, 0.0, 1300, 1, (3, 4)))
    ids = prompt_token_ids(req)
    own = native._mix(-1, 5)
    expect = [native._token(((3, 4)[t // 512] * 2 + 1) if t < 1024 else own, t)
              for t in range(1300)]
    assert ids == expect


# -- async scheduling: the driver in vLLM's batch-queue order ------------------------------------

class AsyncStandIn(StandIn):
    """The stand-in with vLLM's AsyncScheduler bookkeeping: a step's counters move when it is
    scheduled, a request whose catch-up it ends gets an output placeholder, one whose last
    token is in flight is skipped; ``update`` takes the oldest step not yet updated, and a
    request preempted with a step in flight still gets that step's token (stale) and is not
    admitted until it is in. It checks that the driver feeds outputs in schedule order."""

    placeholders = True

    def __init__(self, max_running: int = 2, preempt_at: int | None = None):
        super().__init__(max_running, preempt_at)
        self.queue: list[dict[str, int]] = []

    def add(self, rid, prompt, max_tokens, arrival_s, priority):
        super().add(rid, prompt, max_tokens, arrival_s, priority)
        self.reqs[rid].update(ph=0, inflight=0)

    def _want(self, rid):
        r = self.reqs[rid]
        return self._total(rid) + r["ph"] - r["computed"]

    def schedule(self):
        self.steps += 1
        preempted = []
        if self.steps == self.preempt_at and self.run:
            victim = self.run.pop()
            self.reqs[victim].update(computed=0, ph=0)
            self.wait.insert(0, victim)
            preempted.append(victim)
        out = {}
        for rid in self.run:
            r = self.reqs[rid]
            if r["ph"] and len(r["out"]) + r["ph"] >= r["max"]:
                continue                                  # its last token is in flight
            out[rid] = self._want(rid)
        skipped = []
        while not preempted and self.wait and len(self.run) < self.max_running:
            rid = self.wait.pop(0)
            if self.reqs[rid]["inflight"]:
                skipped.append(rid)                       # stale output still due
                continue
            self.run.append(rid)
            out[rid] = self._want(rid)
        self.wait[:0] = skipped
        for rid, n in out.items():
            r = self.reqs[rid]
            r["computed"] += n
            r["inflight"] += 1
            if r["computed"] == self._total(rid) + r["ph"]:
                r["ph"] += 1
        if out:
            self.queue.append(out)
        return out, preempted

    def update(self, sampled):
        oldest = self.queue.pop(0)
        assert list(sampled) == list(oldest), "outputs fed back out of schedule order"
        done = set()
        for rid, toks in sampled.items():
            self.fed.setdefault(rid, []).extend(toks)
            r = self.reqs[rid]
            r["inflight"] -= 1
            r["out"] += toks
            if rid in self.run and self.placeholders:
                r["ph"] -= len(toks)
            if len(r["out"]) >= r["max"]:
                done.add(rid)
                (self.run if rid in self.run else self.wait).remove(rid)
        return done


def run_native_async(specs, backend, max_running=2):
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=512,
                             enable_chunked_prefill=True, max_model_len=512,
                             async_scheduling=True)
    sched = VllmNative(limits, BlockManager(100, 4), backend=backend)
    sched.record_tokens = True
    replica = Replica(0, sched, StepLatency(), 512)
    assert replica.batch_queue_depth == 2
    rec = simulate(specs, [replica], round_robin())
    return sched, {r.id: r for r in rec.requests}


def test_async_the_driver_schedules_ahead_and_feeds_outputs_back_in_order():
    # A (prompt 5, 3 out), B (prompt 3, 2 out) at 0; C (prompt 2, 1 out) at 5 ms; 10 ms a step.
    # schedule 0 at 0: A 5, B 3 (runs 0-10); schedule 1 at 0 too (the queue has room): A and
    #   B decode their placeholders (runs 10-20; B's 2nd token is its last)
    # at 10: output 0 (1st tokens), then schedule 2: A decodes (its last), B is skipped (last
    #   token in flight), C (arrived at 5 ms) is admitted with 2 tokens (runs 20-30)
    # at 20: output 1 (A's 2nd, B's 2nd: B done); schedule 3: A and C skipped: nothing
    # at 30: output 2 (A's 3rd, C's only): done. Synchronously C would run 10-20.
    specs = [RequestSpec(0, 0.0, 5, 3), RequestSpec(1, 0.0, 3, 2), RequestSpec(2, 0.005, 2, 1)]
    backend = AsyncStandIn(max_running=3)
    sched, reqs = run_native_async(specs, backend)
    a, b, c = reqs[0], reqs[1], reqs[2]
    assert all(r.status is Status.FINISHED for r in (a, b, c))
    assert a.token_times == pytest.approx([0.010, 0.020, 0.030])
    assert b.token_times == pytest.approx([0.010, 0.020])
    assert c.first_scheduled_s == pytest.approx(0.020) and c.token_times == pytest.approx([0.030])
    assert backend.fed[vllm_id(0)] == [output_token(_at(a, i)) for i in range(3)]
    assert not backend.queue and sched.steps_in_flight == 0
    assert not sched.running and not sched.waiting


def test_async_a_request_preempted_in_flight_gets_its_stale_token_then_recomputes():
    # schedule 1 at 0: A 5, B 3 (both sample: placeholders); schedule 2 at 0 preempts B (the
    #   newest) with its 1st token in flight; A decodes alone (runs 10-20)
    # at 10: output 1 delivers A's 1st and B's stale 1st token; schedule 3: A decodes (its 3rd,
    #   last); B is admitted again with prompt + 1 token = 4 and samples its 2nd (last)
    # at 20: output 2 (A's 2nd); schedule 4: A and B both have their last token in flight
    # at 30: output 3 (A's 3rd, B's 2nd): both done
    specs = [RequestSpec(0, 0.0, 5, 3), RequestSpec(1, 0.0, 3, 2)]
    backend = AsyncStandIn(preempt_at=2)
    sched, reqs = run_native_async(specs, backend)
    a, b = reqs[0], reqs[1]
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert a.token_times == pytest.approx([0.010, 0.020, 0.030])
    assert b.token_times == pytest.approx([0.010, 0.030])
    assert b.status is Status.FINISHED and b.num_computed_tokens == 3 + 2 - 1
    assert len(backend.fed[vllm_id(1)]) == 2


# -- pipeline parallelism: the driver under the pipeline loop ------------------------------------

class PipelineStandIn(AsyncStandIn):
    """The stand-in with vLLM's synchronous scheduler's bookkeeping under PP: a step's counters
    move when it is scheduled (no placeholders), each request gets at most ``chunk`` tokens,
    and one that asks for none (its sampled token is in flight) is skipped; ``update`` as the
    async stand-in's (oldest step first, checked)."""

    chunk = 4
    placeholders = False

    def schedule(self):
        self.steps += 1
        out = {}
        for rid in self.run:
            n = min(self.chunk, self._total(rid) - self.reqs[rid]["computed"])
            if n:                             # 0: its sampled token is in flight
                out[rid] = n
        while self.wait and len(self.run) < self.max_running:
            rid = self.wait.pop(0)
            self.run.append(rid)
            out[rid] = min(self.chunk, self._total(rid))
        for rid, n in out.items():
            self.reqs[rid]["computed"] += n
            self.reqs[rid]["inflight"] += 1
        if out:
            self.queue.append(out)
        return out, []


class StageLatency:
    """Two stages of 5 ms each, whatever the micro-batch."""

    label = "2 x 5 ms"

    def stages(self, plan):
        return [0.005, 0.005], [0.0]

    def step_time(self, plan):
        return 0.010


def test_pipelined_the_driver_sends_a_prompts_chunks_back_to_back():
    # p = 2, each stage 5 ms; A: 10-token prompt, 2 out; the stand-in's chunks are 4 tokens.
    # t=0: s1 = A 4: stage 0 [0,5], stage 1 [5,10] -> out 10. The queue has room: s2 = A 4
    #      (its counters moved at once), enters stage 0 at 5: [5,10], [10,15] -> out 15.
    # t=10: s1 back (no token). s3 = A 2 (the prompt's last): [10,15], [15,20] -> out 20.
    # t=15: s2 back; A's token in flight: an empty schedule (it holds a slot). t=20: A's 1st
    #      token; s4 = A's decode: out 30 -> A's 2nd token at 30.
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=512,
                             enable_chunked_prefill=True, max_model_len=512,
                             pipeline_parallel_size=2)
    backend = PipelineStandIn()
    sched = VllmNative(limits, BlockManager(100, 4), backend=backend)
    sched.record_tokens = True
    rec = simulate([RequestSpec(0, 0.0, 10, 2)], [Replica(0, sched, StageLatency(), 512, depth=2)],
                   round_robin())
    a = rec.requests[0]
    assert a.status is Status.FINISHED and a.first_scheduled_s == 0.0
    assert a.token_times == pytest.approx([0.020, 0.030])
    assert backend.steps >= 4 and not backend.queue and sched.steps_in_flight == 0
    assert backend.fed[vllm_id(0)] == [output_token(_at(a, i)) for i in range(2)]
    assert list(rec.replicas[0].columns()["num_batched_tokens"]) == [4, 4, 2, 1]
