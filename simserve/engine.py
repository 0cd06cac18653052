"""The SimPy event loop: arrivals → router → replicas stepping their schedulers.

This is the only module that knows about SimPy. A replica is a plain generator process
(``env`` passed in, no globals): ask the scheduler for a StepPlan, price it with the latency
model, hold the clock for that long, then let the scheduler apply it. An idle replica sleeps on
an event that the arrival process triggers.

Fast-forward: when a plan is the start of a *decode stretch* (``Scheduler.decode_stretch_limit``:
every running request decodes, nothing else happens, and the policy's admission is monotone),
the replica prices all k steps of the stretch at once, holds the clock once, and applies them
together. The stretch ends before the first step that would start at or after the next arrival,
at the earliest finish, or before the KV blocks run out, so the result is the same schedule, step
for step, as stepping one iteration per event (``fast_forward=False``); the equivalence tests
hold the two to that.

Arrivals are scheduled with SimPy's URGENT priority, so an arrival at exactly the time a step
starts is always seen by that step, whichever way the engine runs.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from heapq import heappush
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy
from simpy.core import NORMAL, URGENT

from simserve.kv.blocks import BlockManager
from simserve.latency.base import LatencyModel
from simserve.sched.core import Scheduler
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.workload.spec import RequestSpec

# Longest stretch priced at once: bounds the work wasted when an arrival cuts a stretch short.
MAX_STRETCH = 256

# Per-step columns (vary inside a fast-forwarded stretch) and per-group columns (constant over a
# group of steps: one plain step, or one whole stretch). Typecodes: float64 times, int64 counts.
STEP_ARRAYS = {"start_s": "d", "duration_s": "d", "kv_blocks_used": "i"}
GROUP_ARRAYS = {
    "num_steps": "q", "replica": "q", "num_prefill_tokens": "q", "num_prefill_seqs": "q",
    "num_decode_seqs": "q", "num_batched_tokens": "q", "num_running": "q", "num_waiting": "q",
    "kv_blocks_total": "q", "num_preempted": "q", "swap_out_blocks": "q", "swap_in_blocks": "q",
}
STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_prefill_tokens", "num_prefill_seqs",
                "num_decode_seqs", "num_batched_tokens", "num_running", "num_waiting",
                "kv_blocks_used", "kv_blocks_total", "num_preempted", "swap_out_blocks",
                "swap_in_blocks")


@dataclass
class Replica:
    index: int
    scheduler: Scheduler
    latency: LatencyModel
    max_model_len: int
    wakeup: simpy.Event | None = None
    num_outstanding: int = 0

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.blocks


class _ReplicaLog:
    """One replica's steps, in its own order (step i here is its scheduler's step i)."""

    def __init__(self) -> None:
        self.steps = {c: array(t) for c, t in STEP_ARRAYS.items()}
        self.groups = {c: array(t) for c, t in GROUP_ARRAYS.items()}

    def ends(self) -> np.ndarray:
        """End time of each step (start + duration: the very sums the engine advanced by)."""
        return (np.frombuffer(self.steps["start_s"], dtype=np.float64)
                + np.frombuffer(self.steps["duration_s"], dtype=np.float64))

    def columns(self) -> dict[str, np.ndarray]:
        counts = np.frombuffer(self.groups["num_steps"], dtype=np.int64)
        group_of_step = np.repeat(np.arange(len(counts)), counts)
        out = {}
        for c in STEP_COLUMNS:
            if c in STEP_ARRAYS:
                out[c] = np.frombuffer(self.steps[c], dtype=_DTYPES[STEP_ARRAYS[c]])
            else:
                out[c] = np.frombuffer(self.groups[c], dtype=np.int64).take(group_of_step)
        return out


_DTYPES = {"d": np.float64, "q": np.int64, "i": np.int32}


@dataclass
class Recorder:
    """Events recorded during the run, in flat typed arrays per replica; metrics are computed
    after the run from these.

    Steps are stored as groups: a plain step is a group of one; a fast-forwarded stretch is one
    group of k steps that share every count but their times and KV blocks used.
    """

    requests: list[Request] = field(default_factory=list)
    replicas: dict[int, _ReplicaLog] = field(default_factory=dict)

    def log(self, replica: Replica) -> _ReplicaLog:
        log = self.replicas.get(replica.index)
        if log is None:
            log = self.replicas[replica.index] = _ReplicaLog()
        return log

    @property
    def num_stretches(self) -> int:
        return sum(1 for log in self.replicas.values() for k in log.groups["num_steps"] if k > 1)

    def step(self, replica: Replica, start: float, duration: float, plan: StepPlan) -> None:
        log = self.log(replica)
        s = log.steps
        s["start_s"].append(start)
        s["duration_s"].append(duration)
        s["kv_blocks_used"].append(replica.scheduler.blocks.num_used)
        self._group(log, 1, replica, plan.num_prefill_tokens, len(plan.prefill_lens),
                    len(plan.decode_ctx), plan.num_preempted, plan.swap_out_blocks,
                    plan.swap_in_blocks)

    def stretch(self, replica: Replica, starts: list[float], durations: list[float],
                plan: StepPlan, kv_used: list[int]) -> None:
        """k decode steps that differ only in their times and KV blocks used."""
        log = self.log(replica)
        s = log.steps
        s["start_s"].extend(starts)
        s["duration_s"].extend(durations)
        s["kv_blocks_used"].extend(kv_used)
        self._group(log, len(kv_used), replica, 0, 0, len(plan.decode_ctx), 0, 0, 0)

    @staticmethod
    def _group(log, k, replica, prefill_tokens, prefill_seqs, decode_seqs, preempted,
               swap_out, swap_in) -> None:
        g, sched = log.groups, replica.scheduler
        g["num_steps"].append(k)
        g["replica"].append(replica.index)
        g["num_prefill_tokens"].append(prefill_tokens)
        g["num_prefill_seqs"].append(prefill_seqs)
        g["num_decode_seqs"].append(decode_seqs)
        g["num_batched_tokens"].append(prefill_tokens + decode_seqs)
        g["num_running"].append(len(sched.running))
        g["num_waiting"].append(sched.num_waiting)
        g["kv_blocks_total"].append(sched.blocks.num_blocks)
        g["num_preempted"].append(preempted)
        g["swap_out_blocks"].append(swap_out)
        g["swap_in_blocks"].append(swap_in)

    def columns(self) -> dict[str, np.ndarray]:
        """Every step column as an array: replicas one after another, each in step order."""
        logs = [self.replicas[i].columns() for i in sorted(self.replicas)]
        if not logs:
            return {c: np.empty(0, dtype=np.float64 if c in ("start_s", "duration_s")
                                else np.int64) for c in STEP_COLUMNS}
        if len(logs) == 1:
            return logs[0]
        return {c: np.concatenate([log[c] for log in logs]) for c in STEP_COLUMNS}


def rejection_reason(req: Request, replica: Replica) -> str:
    """Why a request can never run on this replica, or "" if it can."""
    if req.max_tokens > replica.max_model_len:
        return "exceeds_max_model_len"
    if replica.blocks.blocks_for(req.max_tokens) > replica.blocks.num_blocks:
        return "exceeds_kv_capacity"
    return ""


Router = Callable[[Request, Sequence[Replica]], Replica]


def round_robin() -> Router:
    counter = iter(range(1 << 62))
    return lambda req, replicas: replicas[next(counter) % len(replicas)]


def least_outstanding(req: Request, replicas: Sequence[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.num_outstanding, r.index))


class _Arrivals:
    """The workload's cursor: the next arrival time is what bounds a fast-forward stretch."""

    def __init__(self, specs: Sequence[RequestSpec]):
        self.specs = specs
        self.next = 0
        self.done: simpy.Event | None = None

    @property
    def next_time(self) -> float:
        return self.specs[self.next].arrival_s if self.next < len(self.specs) else math.inf


def simulate(specs: Sequence[RequestSpec], replicas: Sequence[Replica], router: Router,
             fast_forward: bool = True) -> Recorder:
    """Run the workload to completion; return what was recorded."""
    env = _Environment()
    rec = Recorder()
    arrivals = _Arrivals(specs)
    arrivals.done = env.event()
    procs = [env.process(_replica_loop(env, r, rec, arrivals, fast_forward)) for r in replicas]
    env.process(_arrival_process(env, arrivals, replicas, router, rec))
    env.run(until=simpy.AllOf(env, procs))
    for replica in replicas:   # anything left can never be scheduled: count it, never drop it
        sched = replica.scheduler
        for req in [*sched.waiting, *sched.swapped, *sched.running]:
            req.status = Status.REJECTED
            req.reject_reason = "unschedulable"
    return rec


class _Environment(simpy.Environment):
    """SimPy's environment plus events at an absolute time and with a chosen priority.

    ``timeout(d)`` lands at ``now + d``; a fast-forward stretch must end exactly at the float
    that stepping would reach (``(s0 + d0) + d1 ...``), which no delay can always express (a
    rounding tie can make that sum unreachable from ``now``). So events are pushed with their
    absolute time, the way ``Environment.schedule`` itself queues them (simpy/core.py).
    """

    def at(self, when: float, priority: int = NORMAL) -> simpy.Event:
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} before now ({self.now})")
        event = simpy.Event(self)
        event._ok = True          # a triggered, successful event, like a Timeout
        event._value = None
        heappush(self._queue, (when, priority, next(self._eid), event))
        return event


def _arrival_process(env, arrivals: _Arrivals, replicas, router, rec: Recorder):
    specs = arrivals.specs
    while arrivals.next < len(specs):
        spec = specs[arrivals.next]
        if spec.arrival_s > env.now:
            yield env.at(spec.arrival_s, URGENT)
        arrivals.next += 1
        req = Request(spec)
        rec.requests.append(req)
        replica = router(req, replicas)
        req.replica = replica.index
        reason = rejection_reason(req, replica)
        if reason:
            req.status = Status.REJECTED
            req.reject_reason = reason
            continue
        replica.num_outstanding += 1
        replica.scheduler.add(req)
        _wake(replica)
    arrivals.done.succeed()
    for replica in replicas:
        _wake(replica)


def _wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()


def _replica_loop(env, replica: Replica, rec: Recorder, arrivals: _Arrivals, fast_forward: bool):
    """Step the replica. Arrivals are the only outside events, so a step (or stretch) that ends
    strictly before the next arrival is applied at once, without a SimPy event: the replica
    runs ahead of the SimPy clock, but never past the next arrival, so whatever the router
    looks at when a request arrives is exactly the state at that time. (Stepwise mode holds the
    clock every step, which is what the fast-forward equivalence tests compare against.)"""
    sched, latency = replica.scheduler, replica.latency
    now = env.now
    while True:
        plan = sched.schedule() if sched.has_work else None
        if plan is None or plan.is_empty:
            if env.now < now:
                yield env.at(now)      # catch the SimPy clock up before sleeping
            if arrivals.done.triggered:
                # no arrival can change this replica's state any more: done (leftovers, which
                # only a scheduler deadlock could leave, are counted as unschedulable)
                return
            replica.wakeup = env.event()
            yield replica.wakeup
            replica.wakeup = None
            now = env.now
            continue
        start = now
        _mark_first_scheduled(sched, plan, start)
        next_arrival = arrivals.next_time
        k = sched.decode_stretch_limit(plan, MAX_STRETCH) if fast_forward else 1
        if k > 1:
            # step i starts at s_i = (...((s_0 + d_0) + d_1) ...), added in order exactly as
            # stepping would; keep the steps that start before the next arrival (step 0
            # always runs)
            step_time = stretch_step_time(latency, plan)
            starts, durations, t = [], [], start
            for i in range(k):
                if i and t >= next_arrival:
                    break
                d = step_time(i)
                starts.append(t)
                durations.append(d)
                t = t + d
            k = len(starts)
        if k > 1:
            ends = starts[1:]
            ends.append(t)
            rec.stretch(replica, starts, durations, plan, sched.stretch_blocks_used(k))
            now = t
            if not fast_forward or now >= next_arrival:
                yield env.at(now)
            finished = sched.complete_decode_stretch(ends)
        else:
            duration = latency.step_time(plan)
            rec.step(replica, start, duration, plan)
            now = start + duration
            if not fast_forward or now >= next_arrival:
                yield env.at(now)
            finished = sched.complete(plan, now)
        replica.num_outstanding -= len(finished)


def stretch_step_time(latency: LatencyModel, plan: StepPlan):
    """``i -> seconds`` of step i of a decode stretch starting with ``plan`` (step i: every
    context grown by i). Uses the model's own ``decode_stretch`` when it has one (it must give
    values bit-identical to ``step_time`` step by step); otherwise prices each step's plan."""
    fast = getattr(latency, "decode_stretch", None)
    if fast is not None:
        return fast(plan)

    def step(i: int) -> float:
        return latency.step_time(
            dataclasses.replace(plan, decode_ctx=tuple(c + i for c in plan.decode_ctx)))

    return step


def _mark_first_scheduled(sched: Scheduler, plan: StepPlan, start: float) -> None:
    if plan.prefill_lens:   # a request is first scheduled with its first prefill chunk
        scheduled = set(plan.request_ids)
        for req in sched.running:
            if req.first_scheduled_s is None and req.id in scheduled:
                req.first_scheduled_s = start
