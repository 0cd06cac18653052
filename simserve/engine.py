"""The SimPy event loop: arrivals → router → replicas stepping their schedulers.

This is the only module that knows about SimPy. A replica is a plain generator process
(``env`` passed in, no globals): ask the scheduler for a StepPlan, price it with the latency
model, hold the clock for that long, then let the scheduler apply it. An idle replica sleeps on
an event that the arrival process triggers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from simserve.kv.blocks import BlockManager
from simserve.latency.base import LatencyModel
from simserve.sched.core import Scheduler
from simserve.sched.request import Request, Status
from simserve.workload.spec import RequestSpec

STEP_COLUMNS = (
    "step", "replica", "start_s", "duration_s", "num_prefill_tokens", "num_prefill_seqs",
    "num_decode_seqs", "num_batched_tokens", "num_running", "num_waiting", "kv_blocks_used",
    "kv_blocks_total", "num_preempted", "swap_out_blocks", "swap_in_blocks",
)


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


@dataclass
class Recorder:
    """Events recorded during the run; metrics are computed after it (never during)."""

    requests: list[Request] = field(default_factory=list)
    steps: dict[str, list] = field(default_factory=lambda: {c: [] for c in STEP_COLUMNS})

    def step(self, replica: Replica, start: float, duration: float, plan) -> None:
        s, sched = self.steps, replica.scheduler
        s["step"].append(len(s["step"]))
        s["replica"].append(replica.index)
        s["start_s"].append(start)
        s["duration_s"].append(duration)
        s["num_prefill_tokens"].append(plan.num_prefill_tokens)
        s["num_prefill_seqs"].append(len(plan.prefill_lens))
        s["num_decode_seqs"].append(len(plan.decode_ctx))
        s["num_batched_tokens"].append(plan.num_batched_tokens)
        s["num_running"].append(len(sched.running))
        s["num_waiting"].append(sched.num_waiting)
        s["kv_blocks_used"].append(sched.blocks.num_used)
        s["kv_blocks_total"].append(sched.blocks.num_blocks)
        s["num_preempted"].append(plan.num_preempted)
        s["swap_out_blocks"].append(plan.swap_out_blocks)
        s["swap_in_blocks"].append(plan.swap_in_blocks)


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


def simulate(specs: Sequence[RequestSpec], replicas: Sequence[Replica], router: Router,
             until: float | None = None) -> Recorder:
    """Run the workload to completion (or to ``until`` seconds); return what was recorded."""
    env = simpy.Environment()
    rec = Recorder()
    arrivals_done = env.event()
    procs = [env.process(_replica_loop(env, r, rec, arrivals_done)) for r in replicas]
    env.process(_arrivals(env, specs, replicas, router, rec, arrivals_done))
    env.run(until=until if until is not None else simpy.AllOf(env, procs))
    for replica in replicas:   # anything left can never be scheduled: count it, never drop it
        sched = replica.scheduler
        for req in [*sched.waiting, *sched.swapped, *sched.running]:
            if req.status in (Status.WAITING, Status.SWAPPED, Status.RUNNING) and until is None:
                req.status = Status.REJECTED
                req.reject_reason = "unschedulable"
    return rec


def _arrivals(env, specs, replicas, router, rec: Recorder, done: simpy.Event):
    for spec in specs:
        if spec.arrival_s > env.now:
            yield env.timeout(spec.arrival_s - env.now)
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
    done.succeed()
    for replica in replicas:
        _wake(replica)


def _wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()


def _replica_loop(env, replica: Replica, rec: Recorder, arrivals_done: simpy.Event):
    sched, latency = replica.scheduler, replica.latency
    while True:
        plan = sched.schedule() if sched.has_work else None
        if plan is None or plan.is_empty:
            if arrivals_done.triggered:
                # no arrival can change this replica's state any more: done (leftovers, which
                # only a scheduler deadlock could leave, are counted as unschedulable)
                return
            replica.wakeup = env.event()
            yield replica.wakeup
            replica.wakeup = None
            continue
        start = env.now
        duration = latency.step_time(plan)
        rec.step(replica, start, duration, plan)
        _mark_first_scheduled(sched, plan, start)
        yield env.timeout(duration)
        for req in sched.complete(plan, env.now):
            replica.num_outstanding -= 1


def _mark_first_scheduled(sched: Scheduler, plan, start: float) -> None:
    scheduled = set(plan.request_ids)
    for req in sched.running:
        if req.first_scheduled_s is None and req.id in scheduled:
            req.first_scheduled_s = start
